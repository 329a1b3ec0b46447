"""A model client for structured answers: OpenAI-compatible chat completions over httpx.

Any server that speaks `POST {base_url}/chat/completions` works: a hosted API, llama.cpp's
`llama-server`, Ollama (`http://127.0.0.1:11434/v1`), vLLM. The answer must be one JSON
object; it is validated against a pydantic model, and when it does not validate the model
gets one repair turn (its own answer plus the validation errors). Every failure (connection,
timeout, HTTP error, unusable output) becomes `ModelError` (502 MODEL_ERROR) with what went
wrong in `details`; nothing here writes anything, so a failed call loses nothing.

Configured by `AMPKIT_LLM_URL`, `AMPKIT_LLM_MODEL`, `AMPKIT_LLM_API_KEY`,
`AMPKIT_LLM_TIMEOUT_SECONDS`, `AMPKIT_LLM_JSON_MODE` (docs/consolidation.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from .errors import ModelError, NotConfigured
from .tls import tls_context

M = TypeVar("M", bound=BaseModel)

NOT_CONFIGURED_MESSAGE = (
    "this needs a model and none is configured: set AMPKIT_LLM_URL (an OpenAI-compatible base URL, "
    "e.g. http://127.0.0.1:11434/v1 for Ollama or http://127.0.0.1:8080/v1 for llama-server) and "
    "AMPKIT_LLM_MODEL (and AMPKIT_LLM_API_KEY if the server wants one)"
)


def not_configured() -> NotConfigured:
    return NotConfigured(NOT_CONFIGURED_MESSAGE, {"settings": ["AMPKIT_LLM_URL", "AMPKIT_LLM_MODEL", "AMPKIT_LLM_API_KEY"]})


@dataclass(frozen=True)
class ModelConfig:
    base_url: str  # ends before /chat/completions, e.g. http://127.0.0.1:11434/v1
    model: str
    api_key: Optional[str] = None
    timeout_seconds: float = 60.0
    json_mode: bool = True  # send response_format={"type": "json_object"}; some servers refuse it
    max_tokens: int = 2048


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def json_text(content: str) -> str:
    """The JSON object in a model's answer: code fences removed, text around the outermost
    braces dropped (small local models often wrap their JSON in prose)."""
    fenced = _FENCE.match(content)
    if fenced:
        content = fenced.group(1)
    start, end = content.find("{"), content.rfind("}")
    return content[start : end + 1] if 0 <= start < end else content


class ChatModel:
    """Synchronous; the service runs it in worker threads. One pooled httpx client."""

    def __init__(self, config: ModelConfig, http_client: Optional[httpx.Client] = None):
        self.config = config
        self._http = http_client or httpx.Client(timeout=httpx.Timeout(config.timeout_seconds, connect=5.0),
                                                 verify=tls_context())
        self.calls = 0  # completions requested (for the bench and the response's accounting)

    @property
    def name(self) -> str:
        return self.config.model

    def close(self) -> None:
        self._http.close()

    def _chat(self, messages: list[dict[str, str]]) -> str:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "messages": messages, "temperature": 0, "max_tokens": cfg.max_tokens}
        if cfg.json_mode:
            body["response_format"] = {"type": "json_object"}
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        where = {"model": cfg.model, "base_url": cfg.base_url}
        self.calls += 1
        try:
            answer = self._http.post(url, json=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise ModelError(f"the model did not answer within {cfg.timeout_seconds:g} s", where) from exc
        except httpx.HTTPError as exc:
            raise ModelError(f"the model server cannot be reached: {exc}", where) from exc
        if answer.status_code >= 400:
            raise ModelError(f"the model server answered HTTP {answer.status_code}",
                             {**where, "status": answer.status_code, "body": answer.text[:500]})
        try:
            content = answer.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelError("the model server's answer is not a chat completion", {**where, "body": answer.text[:500]}) from exc
        if not isinstance(content, str):
            raise ModelError("the completion has no text content", where)
        return content

    def complete_json(self, system: str, user: str, schema: type[M]) -> M:
        """One completion parsed into `schema`; one repair turn if the first answer does not fit."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        content = self._chat(messages)
        try:
            return schema.model_validate_json(json_text(content))
        except ValidationError as first:
            problems = _problems(first)
            ask = ("Your answer is not a JSON object" if _not_json(first) else
                   f"Your answer is not valid for the required JSON shape: {problems}")
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"{ask}. Answer again with only the corrected JSON object."},
        ]
        repaired = self._chat(messages)
        try:
            return schema.model_validate_json(json_text(repaired))
        except ValidationError as second:
            raise ModelError(
                "the model's answer is not JSON, twice" if _not_json(second) else
                "the model answered JSON that does not fit the expected shape, twice",
                {"model": self.config.model, "errors": _problems(second), "answer": repaired[:500]},
            ) from None


def _not_json(exc: ValidationError) -> bool:
    """Whether the answer failed as JSON (unparseable text), not as the schema's shape."""
    return any(e.get("type") == "json_invalid" for e in exc.errors())


def _problems(exc: ValidationError) -> str:
    return json.dumps([{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()[:5]])


__all__ = ["ChatModel", "ModelConfig", "json_text", "not_configured"]
