"""LlamaIndex's offline model for tests and examples. `MockLLM` cannot drive a `FunctionAgent`
(it is not a function-calling LLM); `MockFunctionCallingLLM` can, given a response generator."""

from __future__ import annotations

from typing import Any, Sequence

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from pydantic import Field

from . import prompt_text


class LlamaIndexFakeLLM(MockFunctionCallingLLM):
    """A function-calling LLM that always answers `answer` and calls no tool."""

    prompts: list[str] = Field(default_factory=list)
    answer: str = "Noted."

    def __init__(self, answer: str = "Noted.", **kwargs: Any):
        super().__init__(response_generator=self._reply, **kwargs)
        self.answer = answer

    def _reply(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        self.prompts.append(prompt_text(m.content or "" for m in messages))
        return ChatMessage(role="assistant", content=self.answer)
