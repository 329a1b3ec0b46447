"""Offline stand-ins for each framework's LLM, for the examples and the tests (not shipped in
the wheel). One module per framework, so an example imports only its own framework:

    fakes.langchain   LangChainFakeModel     (a GenericFakeChatModel that accepts bind_tools)
    fakes.llamaindex  LlamaIndexFakeLLM      (a MockFunctionCallingLLM: it can drive a FunctionAgent)
    fakes.crewai      CrewAIFakeLLM          (a BaseLLM answering in CrewAI's ReAct format)
    fakes.autogen     AutoGenFakeModel       (a ReplayChatCompletionClient)

Each one answers from a script, never touches the network, and records the full text of
every prompt it was sent in `.prompts`, so a test can check what reached the model.
"""

import json
from typing import Any, Iterable


def prompt_text(parts: Iterable[Any]) -> str:
    return "\n".join(p if isinstance(p, str) else json.dumps(p, default=str) for p in parts)
