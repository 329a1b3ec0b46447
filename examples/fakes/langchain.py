"""LangChain's offline model for tests and examples. `GenericFakeChatModel` alone cannot bind
tools (`bind_tools` raises NotImplementedError), so `create_agent` could not use it."""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from pydantic import Field

from . import prompt_text


class LangChainFakeModel(GenericFakeChatModel):
    """Replies with the given `AIMessage`s in order (tool calls included); tools bind as-is."""

    prompts: list[str] = Field(default_factory=list)

    def __init__(self, replies: Sequence[AIMessage | str], **kwargs: Any):
        messages = [r if isinstance(r, AIMessage) else AIMessage(r) for r in replies]
        super().__init__(messages=iter(messages), **kwargs)

    def bind_tools(self, tools: Any, **kwargs: Any) -> "LangChainFakeModel":
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any):
        self.prompts.append(prompt_text(m.text for m in messages))
        return super()._generate(messages, *args, **kwargs)
