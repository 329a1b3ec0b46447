"""The LangGraph store as users use it (issue 18): per-user namespaces own their items, one
live item per (owner, namespace, key) even under races, deletes that keep a teammate's item,
refused writes that reach the model as a tool result, TTLs, paging past 100 items, and the
retriever's durable-first default. Through the session's real server over HTTP."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime, tool
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

import ampkit
from adapter_support import Backend, unique
from ampkit.adapters import Sharing
from ampkit.adapters._filters import item_matches, namespace_matches
from ampkit.adapters.langchain import (
    AmpkitChatMessageHistory,
    AmpkitRetriever,
    AmpkitStore,
    RefusedWriteMiddleware,
    SharedMemoryMiddleware,
    memory_tools,
)
from fakes.langchain import LangChainFakeModel


@pytest.fixture
def http(server):
    b = Backend("http", server.base_url)
    yield b
    for client in b.opened:
        client.close()


def tool_call(name: str, **args) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{name}"}])


def test_the_user_in_the_namespace_owns_the_item(http):
    ada, bob = unique("ada"), unique("bob")
    store = AmpkitStore(http.connect(unique("lg-agent")))  # no owner_id: the namespace says whose
    store.put(("memories", ada), "k", {"content": "Ada likes tea"})
    store.put(("memories", bob), "k", {"content": "Bob likes coffee"})
    assert [c.content.text for c in http.cells(ada)] == ["Ada likes tea"]
    assert [c.content.text for c in http.cells(bob)] == ["Bob likes coffee"]
    assert store.get(("memories", ada), "k").value == {"content": "Ada likes tea"}
    assert [i.value["content"] for i in store.search(("memories", bob))] == ["Bob likes coffee"]

    by_rule = AmpkitStore(http.connect(unique("lg-agent")), owner=lambda ns: ns[0])
    by_rule.put((ada, "prefs"), "drink", {"text": "green tea"})
    assert "green tea" in http.texts(ada)


def test_one_live_item_per_key_even_when_puts_race(http):
    user = unique("user")
    errors: list[BaseException] = []

    def put(n: int) -> None:
        store = AmpkitStore(http.connect(f"team-{n}"), sharing=Sharing(readable_by=["team-*"], writable_by=["team-*"]))
        try:
            store.put(("memories", user), "favourite", {"content": f"value {n}"})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    cells = http.cells(user)
    assert len(cells) == 1 and cells[0].identity.key is not None  # the others updated it


def test_an_outsider_cannot_add_a_second_item_under_a_taken_key(http):
    user = unique("user")
    AmpkitStore(http.connect(unique("writer"))).put(("memories", user), "k", {"content": "the real one"})
    outsider = AmpkitStore(http.connect(unique("outsider")))
    with pytest.raises(ampkit.AccessDenied, match="not shared"):
        outsider.put(("memories", user), "k", {"content": "an impostor"})
    owner_view = AmpkitStore(http.connect(user))
    assert [i.value["content"] for i in owner_view.search(("memories", user))] == ["the real one"]


def test_delete_keeps_a_teammates_item_even_when_it_is_writable(http):
    user = unique("user")
    team = Sharing(readable_by=["team-*"], writable_by=["team-*"])
    a = AmpkitStore(http.connect(unique("team-a")), sharing=team)
    b = AmpkitStore(http.connect(unique("team-b")), sharing=team)
    a.put(("memories", user), "k", {"content": "A's note"})

    b.put(("memories", user), "k", {"content": "A's note, edited by B"})  # writable_by: an update
    with pytest.raises(ampkit.AccessDenied, match="only its writer or its owner"):
        b.delete(("memories", user), "k")
    assert a.get(("memories", user), "k").value == {"content": "A's note, edited by B"}
    a.delete(("memories", user), "k")
    assert a.get(("memories", user), "k") is None and http.cells(user) == []


def test_a_refused_write_inside_a_turn_is_a_tool_result_the_model_reads(http):
    user = unique("user")
    AmpkitStore(http.connect(unique("team-a")), sharing=Sharing(readable_by=["team-*"])).put(
        ("memories", user), "diet", {"content": "vegetarian"})
    store = AmpkitStore(http.connect(unique("team-b")))

    @tool
    def save(content: str, runtime: ToolRuntime) -> str:
        """Save the user's diet."""
        runtime.store.put(("memories", user), "diet", {"content": content})
        return "saved"

    for middleware in (RefusedWriteMiddleware(), SharedMemoryMiddleware(http.connect(unique("team-b")), owner_id=user)):
        model = LangChainFakeModel([tool_call("save", content="vegan"), "I could not save that."])
        state = create_agent(model, tools=[save], store=store, middleware=[middleware]).invoke(
            {"messages": [HumanMessage("I am vegan now.")]})
        (refusal,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert refusal.status == "error" and "may read but not change it" in refusal.content
        assert "may read but not change it" in model.prompts[1]  # the model saw why
    assert store.get(("memories", user), "diet").value == {"content": "vegetarian"}

    # Without the middleware the same refusal ends the turn: the middleware is what helps.
    model = LangChainFakeModel([tool_call("save", content="vegan"), "unreached"])
    with pytest.raises(ampkit.AccessDenied):
        create_agent(model, tools=[save], store=store).invoke({"messages": [HumanMessage("I am vegan now.")]})


def test_the_remember_tool_reports_a_refusal_instead_of_raising(http):
    user = unique("user")
    tools = memory_tools(http.connect(unique("lc-agent")), owner_id=user)
    model = LangChainFakeModel([tool_call("remember", fact="x" * 70000), "Too long, sorry."])
    state = create_agent(model, tools=tools).invoke({"messages": [HumanMessage("Remember this essay.")]})
    assert "Memory refused this (PAYLOAD_TOO_LARGE)" in state["messages"][2].content


def test_ttl_sets_and_refreshes_the_expiry(http):
    user = unique("user")
    store = AmpkitStore(http.connect(unique("lg-agent")))
    before = datetime.now(timezone.utc)
    store.put(("memories", user), "short", {"content": "for an hour"}, ttl=60)
    (cell,) = http.cells(user)
    assert 3500 < (cell.lifecycle.expires_at - before).total_seconds() < 3700
    store.put(("memories", user), "short", {"content": "for ever"}, ttl=None)
    assert http.cells(user)[0].lifecycle.expires_at is None


def test_searches_page_past_one_hundred_items(http):
    user = unique("user")
    client = http.connect(unique("lg-agent"))
    store = AmpkitStore(client)
    store.batch([])  # warm
    from langgraph.store.base import PutOp

    store.batch([PutOp(("memories", user), f"k{n:03d}", {"content": f"item {n}", "n": n}) for n in range(130)])
    page = store.search(("memories", user), limit=20, offset=110)
    assert [i.key for i in page] == [f"k{n:03d}" for n in range(110, 130)]
    evens = store.search(("memories", user), filter={"n": {"$gte": 100}}, limit=50)
    assert [i.value["n"] for i in evens] == list(range(100, 130))


def test_namespace_listing_groups_on_the_server_and_pages_past_one_page(http):
    """250 namespaces of 2 items each: `list_namespaces` asks the server for the distinct
    namespaces (GET /memories/values, 200 per page), never for the 500 items."""
    from langgraph.store.base import PutOp

    user = unique("user")
    client = http.connect(unique("lg-agent"))
    asked: list[str] = []

    class Counting:  # the same client, counting which client methods the store calls
        def __getattr__(self, name):
            asked.append(name)
            return getattr(client, name)

    store = AmpkitStore(Counting())
    names = [f"t{n:03d}" for n in range(250)]
    store.batch([PutOp(("memories", user, name), key, {"content": f"{name} {key}"})
                 for name in names for key in ("a", "b")])
    asked.clear()
    listed = store.list_namespaces(prefix=("memories", user), limit=1000)
    assert listed == [("memories", user, name) for name in names]
    assert asked == ["metadata_values", "metadata_values"] and "list" not in asked
    assert store.list_namespaces(prefix=("memories", user), max_depth=2) == [("memories", user)]
    assert store.list_namespaces(prefix=("memories", user), offset=240, limit=5) == [
        ("memories", user, name) for name in names[240:245]]
    # Another agent without access sees no namespace of this user's (the values are readable cells only).
    assert AmpkitStore(http.connect(unique("outsider"))).list_namespaces(prefix=("memories", user)) == []


def test_filters_and_namespace_matches_follow_langgraph():
    value = {"kind": "note", "score": 4, "tags": ["a", "b"], "meta": {"lang": "en", "n": 1}}
    assert item_matches(value, {"kind": "note", "score": {"$gt": 3, "$lte": 4}})
    assert item_matches(value, {"meta": {"lang": "en"}, "tags": ["a", "b"]})
    assert not item_matches(value, {"kind": {"$ne": "note"}})
    assert not item_matches(value, {"tags": ["a"]}) and not item_matches(value, {"missing": {"$gt": 1}})
    assert namespace_matches("prefix", ("*", "a"), ("docs", "a", "deep"))
    assert namespace_matches("suffix", ("deep",), ("docs", "a", "deep"))
    assert not namespace_matches("prefix", ("docs", "a", "deep", "x"), ("docs", "a", "deep"))
    with pytest.raises(ValueError):
        item_matches(value, {"score": {"$in": [4]}})


def test_the_retriever_returns_durable_memory_first_and_chat_logs_only_when_asked(http):
    user, session = unique("user"), unique("session")
    writer = http.connect(unique("lc-agent"))
    history = AmpkitChatMessageHistory(writer, session_id=session, owner_id=user)
    history.add_messages([HumanMessage(f"about invoices, message {n}") for n in range(6)])
    writer.remember("Invoices go to the finance team", owner_id=user)
    durable = AmpkitRetriever(client=writer, owner_id=user, k=4).invoke("invoices")
    assert [d.page_content for d in durable] == ["Invoices go to the finance team"]
    everything = AmpkitRetriever(client=writer, owner_id=user, k=4, types=None).invoke("invoices")
    assert {d.metadata["type"] for d in everything} == {"episodic", "semantic"} or len(everything) == 4
