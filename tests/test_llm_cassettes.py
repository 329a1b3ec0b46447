"""The model client against recorded chat-completions exchanges (vcrpy cassettes).

Replay needs no server. Requests are matched on method, path and the parsed JSON body, so a
change in what the client sends (model, messages, temperature, response_format, the repair
turn) fails replay: the signal to look at what changed. Re-record against the fake model:

    RECORD_CASSETTES=1 .venv/bin/python -m pytest tests/test_llm_cassettes.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import vcr
from pydantic import BaseModel

from ampkit import ModelError
from ampkit.llm import ChatModel, ModelConfig, json_text
from fake_llm import FakeModel

RECORD = os.environ.get("RECORD_CASSETTES") == "1"
CASSETTES = Path(__file__).parent / "cassettes" / "llm"  # not the client cassettes: another server
REPLAY_URL = "http://127.0.0.1:9/v1"  # nothing listens: replay must not reach the network


class Answer(BaseModel):
    facts: list[str]


def _path(r1, r2) -> None:
    assert urlsplit(r1.uri).path == urlsplit(r2.uri).path


def _json_body(r1, r2) -> None:
    assert json.loads(r1.body) == json.loads(r2.body)


recorder = vcr.VCR(cassette_library_dir=str(CASSETTES), record_mode="all" if RECORD else "none",
                   match_on=["method", "path", "json_body"], decode_compressed_response=True)
recorder.register_matcher("path", _path)
recorder.register_matcher("json_body", _json_body)


@pytest.fixture
def fake():
    if not RECORD:
        yield None
        return
    model = FakeModel().start()
    yield model
    model.stop()


def _model(fake) -> ChatModel:
    return ChatModel(ModelConfig(base_url=fake.url if fake else REPLAY_URL, model="fake-1", api_key="sk-test",
                                 timeout_seconds=5))


def test_json_answer_is_validated(fake):
    if fake:
        fake.on("other", "like", reply="```json\n{\"facts\": [\"likes tea\"]}\n```")
    with recorder.use_cassette("llm_json.yaml") as cassette:
        answer = _model(fake).complete_json("system prompt", "what does the user like?", Answer)
    assert answer.facts == ["likes tea"]
    sent = json.loads(cassette.requests[0].body)
    assert sent["model"] == "fake-1" and sent["temperature"] == 0
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["messages"] == [{"role": "system", "content": "system prompt"},
                                {"role": "user", "content": "what does the user like?"}]
    assert cassette.requests[0].headers["Authorization"] == "Bearer sk-test"


def test_one_repair_turn(fake):
    if fake:
        fake.on("other", "like", reply="I think {\"fact\": 1}", times=1)
        fake.on("other", "REPAIR", reply={"facts": ["likes tea"]})
    with recorder.use_cassette("llm_repair.yaml") as cassette:
        answer = _model(fake).complete_json("system prompt", "what does the user like?", Answer)
    assert answer.facts == ["likes tea"] and len(cassette.requests) == 2
    repair = json.loads(cassette.requests[1].body)["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == "I think {\"fact\": 1}" and "facts" in repair[3]["content"]


def test_invalid_twice_is_a_model_error(fake):
    if fake:
        fake.on("other", "", reply="no JSON here")
    with recorder.use_cassette("llm_invalid.yaml"):
        with pytest.raises(ModelError) as err:
            _model(fake).complete_json("system prompt", "what does the user like?", Answer)
    assert err.value.status == 502 and err.value.details["answer"] == "no JSON here"
    assert err.value.message == "the model's answer is not JSON, twice"  # not "JSON that does not fit"


def test_http_error_is_a_model_error(fake):
    if fake:
        fake.fail_status = 503
    with recorder.use_cassette("llm_outage.yaml"):
        with pytest.raises(ModelError) as err:
            _model(fake).complete_json("system prompt", "what does the user like?", Answer)
    assert err.value.details["status"] == 503 and err.value.code == "MODEL_ERROR"


def test_unreachable_server_is_a_model_error():
    model = ChatModel(ModelConfig(base_url=REPLAY_URL, model="m", timeout_seconds=2))
    with pytest.raises(ModelError) as err:
        model.complete_json("s", "u", Answer)
    assert "cannot be reached" in err.value.message


@pytest.mark.parametrize("content, expected", [
    ('{"a": 1}', '{"a": 1}'),
    ('```json\n{"a": 1}\n```', '{"a": 1}'),
    ('Here you go: {"a": {"b": 2}} hope it helps', '{"a": {"b": 2}}'),
])
def test_json_text(content, expected):
    assert json_text(content) == expected
