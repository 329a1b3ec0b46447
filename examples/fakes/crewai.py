"""CrewAI's offline model for tests and examples: a `BaseLLM` that gives every task a final
answer in CrewAI's ReAct text format, calling no tools."""

from __future__ import annotations

from typing import Any

from crewai.llms.base_llm import BaseLLM
from pydantic import Field

from . import prompt_text


class CrewAIFakeLLM(BaseLLM):
    """Gives every task `answer` as its final answer (ReAct format, no tools)."""

    answer: str = "Done."
    prompts: list[str] = Field(default_factory=list)

    def __init__(self, answer: str = "Done.", **kwargs: Any):
        super().__init__(model=kwargs.pop("model", "fake-crewai-llm"), answer=answer, **kwargs)

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> str:
        text = messages if isinstance(messages, str) else prompt_text(m.get("content") for m in messages)
        self.prompts.append(text)
        return f"Thought: I now can give a great answer\nFinal Answer: {self.answer}"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192
