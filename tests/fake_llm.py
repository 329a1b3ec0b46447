"""A real OpenAI-compatible chat-completions server that answers from a script.

It listens on a loopback port in a thread of the test process, so a `ampkit serve` child
process reaches it over real HTTP. Each rule names the prompt kind ("extract" or "decide",
told apart by the system prompt) and strings the user prompt must contain; the first rule
that matches answers. An unmatched prompt gets an empty extraction or a NOOP decision.
`fail_status` makes every call answer that HTTP status (a model outage); `latency` adds a
fixed delay per call (for bench/consolidation.py).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Union

from ampkit.consolidation import DECIDE_SYSTEM, EXTRACT_SYSTEM, REVISE_SYSTEM

Reply = Union[str, dict, Callable[[str], Union[str, dict]]]


@dataclass
class Rule:
    kind: str
    needles: tuple[str, ...]
    reply: Reply
    times: Optional[int] = None  # answer this many times, then stop matching
    used: int = 0


@dataclass
class FakeModel:
    latency: float = 0.0
    fail_status: Optional[int] = None
    rules: list[Rule] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: Optional[ThreadingHTTPServer] = None

    # ------------------------------------------------------------ scripting
    def on(self, kind: str, *needles: str, reply: Reply, times: Optional[int] = None) -> "FakeModel":
        self.rules.append(Rule(kind, needles, reply, times))
        return self

    def reset(self) -> None:
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self.fail_status = None

    def prompts(self, kind: str) -> list[str]:
        return [r["user"] for r in self.requests if r["kind"] == kind]

    def answer(self, system: str, user: str) -> str:
        kind = ("extract" if system == EXTRACT_SYSTEM else "decide" if system == DECIDE_SYSTEM
                else "revise" if system == REVISE_SYSTEM else "other")
        with self._lock:
            self.requests.append({"kind": kind, "user": user})
            for rule in self.rules:
                if rule.kind == kind and all(n in user for n in rule.needles) and (rule.times is None or rule.used < rule.times):
                    rule.used += 1
                    reply = rule.reply(user) if callable(rule.reply) else rule.reply
                    return reply if isinstance(reply, str) else json.dumps(reply)
        return json.dumps({"candidates": []} if kind == "extract" else {"decision": "NOOP", "reason": "unscripted"})  # revise too

    # ------------------------------------------------------------ serving
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "FakeModel":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if fake.latency:
                    time.sleep(fake.latency)
                if fake.fail_status is not None or self.path != "/v1/chat/completions":
                    self._send(fake.fail_status or 404, {"error": {"message": "unavailable"}})
                    return
                messages = body["messages"]
                # A repair turn resends the conversation: answer the last user message's kind.
                content = fake.answer(messages[0]["content"], messages[-1]["content"] if len(messages) <= 2
                                      else "REPAIR " + messages[-1]["content"] + "\n" + messages[1]["content"])
                self._send(200, {
                    "id": "chatcmpl-fake", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                })

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def ref_of(prompt: str, text: str, tag: str = "existing") -> Optional[str]:
    """The short id ("m1", "e2", "p1") the prompt gives the memory whose text contains `text`."""
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", prompt, re.S)
    if not match:
        return None
    for row in json.loads(match.group(1)):
        if text in row["text"]:
            return row["id"]
    return None


def extraction(*candidates: tuple[str, str, list[str]], confidence: float = 0.9) -> Callable[[str], dict]:
    """An extraction reply: (text, "fact"|"playbook", [episode texts]) -> candidates citing the
    short ids the prompt gave those episodes."""
    def reply(prompt: str) -> dict:
        return {"candidates": [
            {"text": text, "type": kind, "confidence": confidence,
             "supporting_episode_ids": [ref_of(prompt, ep, "episodes") or "e999" for ep in episodes]}
            for text, kind, episodes in candidates
        ]}
    return reply


def decision(action: str, target_text: Optional[str] = None, text: Optional[str] = None,
             reason: str = "scripted", confidence: float = 0.9) -> Callable[[str], dict]:
    def reply(prompt: str) -> dict:
        target = ref_of(prompt, target_text) if target_text else None
        return {"decision": action, "target": target, "text": text, "reason": reason, "confidence": confidence}
    return reply
