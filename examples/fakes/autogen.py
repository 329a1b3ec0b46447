"""AutoGen's offline model for tests and examples: autogen-ext's `ReplayChatCompletionClient`
that also records its prompts."""

from __future__ import annotations

from typing import Any, Sequence

from autogen_core.models import CreateResult
from autogen_ext.models.replay import ReplayChatCompletionClient

from . import prompt_text


class AutoGenFakeModel(ReplayChatCompletionClient):
    """Answers `answer` to every call (up to `turns` calls)."""

    def __init__(self, answer: str = "Noted.", turns: int = 20):
        super().__init__([answer] * turns)
        self.prompts: list[str] = []

    async def create(self, messages: Sequence[Any], **kwargs: Any) -> CreateResult:
        self.prompts.append(prompt_text(m.content for m in messages))
        return await super().create(messages, **kwargs)
