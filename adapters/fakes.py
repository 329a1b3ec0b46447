"""Offline stand-ins for the LLM of each framework, for tests, examples and the demo.

Each one answers from a script, never touches the network, and records the full text of
every prompt it was sent in `.prompts`, so a test can check what reached the model.
Importing this module imports all four frameworks (`pip install 'ampkit[all]'`).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional, Sequence

from autogen_core.models import CreateResult
from autogen_ext.models.replay import ReplayChatCompletionClient
from crewai.llms.base_llm import BaseLLM
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from pydantic import Field


def _text(parts: Iterable[Any]) -> str:
    return "\n".join(p if isinstance(p, str) else json.dumps(p, default=str) for p in parts)


class LangChainFakeModel(GenericFakeChatModel):
    """Replies with the given `AIMessage`s in order (tool calls included); tools bind as-is."""

    prompts: list[str] = Field(default_factory=list)

    def __init__(self, replies: Sequence[AIMessage | str], **kwargs: Any):
        messages = [r if isinstance(r, AIMessage) else AIMessage(r) for r in replies]
        super().__init__(messages=iter(messages), **kwargs)

    def bind_tools(self, tools: Any, **kwargs: Any) -> "LangChainFakeModel":
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any):
        self.prompts.append(_text(m.text for m in messages))
        return super()._generate(messages, *args, **kwargs)


class LlamaIndexFakeLLM(MockFunctionCallingLLM):
    """A function-calling LLM that always answers `answer` and calls no tool."""

    prompts: list[str] = Field(default_factory=list)
    answer: str = "Noted."

    def __init__(self, answer: str = "Noted.", **kwargs: Any):
        super().__init__(**kwargs)
        self.answer = answer
        self._response_generator = self._reply

    def _reply(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.prompts.append(_text(m.content or "" for m in messages))
        return ChatMessage(role="assistant", content=self.answer)


class CrewAIFakeLLM(BaseLLM):
    """Gives every task `answer` as its final answer (ReAct format, no tools)."""

    answer: str = "Done."
    prompts: list[str] = Field(default_factory=list)

    def __init__(self, answer: str = "Done.", **kwargs: Any):
        super().__init__(model=kwargs.pop("model", "fake-crewai-llm"), answer=answer, **kwargs)

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        text = messages if isinstance(messages, str) else _text(m.get("content") for m in messages)
        self.prompts.append(text)
        return f"Thought: I now can give a great answer\nFinal Answer: {self.answer}"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


class AutoGenFakeModel(ReplayChatCompletionClient):
    """Answers `answer` to every call (up to `turns` calls)."""

    def __init__(self, answer: str = "Noted.", turns: int = 20):
        super().__init__([answer] * turns)
        self.prompts: list[str] = []

    async def create(self, messages: Sequence[Any], **kwargs: Any) -> CreateResult:
        self.prompts.append(_text(m.content for m in messages))
        return await super().create(messages, **kwargs)


def last_prompt(model: Any) -> Optional[str]:
    return model.prompts[-1] if model.prompts else None
