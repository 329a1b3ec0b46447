"""LangChain / LangGraph adapters: real `create_agent` turns with a scripted fake model, over
HTTP against a real server and in process on SQLite (the `backend` fixture)."""

from __future__ import annotations

import warnings

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import before_model
from langchain.tools import ToolRuntime, tool
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langgraph.store.base import ListNamespacesOp, MatchCondition

from adapter_support import backend, unique  # noqa: F401  (fixture)
from ampkit.adapters import Sharing
from fakes.langchain import LangChainFakeModel
from ampkit.adapters.langchain import (
    AmpkitChatMessageHistory,
    AmpkitRetriever,
    AmpkitStore,
    SharedMemoryMiddleware,
    memory_tools,
)

PREFERENCE = "the user prefers bullet-point summaries"
UNRELATED = "the office plants are watered on Fridays"


def tool_call(name: str, **args) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{name}"}])


def test_agent_remembers_with_a_tool_and_recalls_into_its_prompt(backend):
    user, agent_id = unique("user"), unique("lc-agent")
    client = backend.connect(agent_id)
    tools = memory_tools(client, owner_id=user)

    writer = LangChainFakeModel([tool_call("remember", fact=PREFERENCE), "Noted."])
    create_agent(writer, tools=tools).invoke({"messages": [HumanMessage("Remember: I like bullet points.")]})

    cells = backend.cells(user)
    assert [c.content.text for c in cells] == [PREFERENCE]
    assert cells[0].identity.created_by == agent_id and cells[0].type == "semantic"

    reader = LangChainFakeModel([tool_call("recall", query="summaries format"), "Here it is, in bullets."])
    create_agent(reader, tools=tools).invoke({"messages": [HumanMessage("Summarise the report.")]})
    assert PREFERENCE not in reader.prompts[0]
    assert PREFERENCE in reader.prompts[1]  # the tool result went into the next model call


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_middleware_puts_shared_memory_into_every_model_call(backend, mode):
    user = unique("user")
    backend.connect(unique("li-agent")).remember(PREFERENCE, owner_id=user, readable_by=["lc-*"])
    middleware = SharedMemoryMiddleware(backend.connect(unique("lc-agent")), owner_id=user)
    model = LangChainFakeModel(["- point one"])
    agent = create_agent(model, system_prompt="Be brief.", middleware=[middleware])
    question = {"messages": [HumanMessage("Write the summaries of the meeting.")]}
    state = agent.invoke(question) if mode == "sync" else await agent.ainvoke(question)

    assert "Be brief." in model.prompts[0] and PREFERENCE in model.prompts[0]
    assert all(PREFERENCE not in m.text for m in state["messages"])  # not saved into the thread


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_middleware_injects_only_memories_that_clear_min_score_and_no_header_without_one(backend, mode):
    """Issue 43: the automatic recall abstains (DEFAULT_MIN_SCORE): a memory that does not
    answer the question is not injected, and with nothing that clears it no header either."""
    user = unique("user")
    writer = backend.connect(unique("li-agent"))
    writer.remember(UNRELATED, owner_id=user, readable_by=["lc-*"])
    middleware = SharedMemoryMiddleware(backend.connect(unique("lc-agent")), owner_id=user)
    question = {"messages": [HumanMessage("Write the summaries of the meeting.")]}

    async def run() -> str:
        model = LangChainFakeModel(["- point one"])
        agent = create_agent(model, system_prompt="Be brief.", middleware=[middleware])
        agent.invoke(question) if mode == "sync" else await agent.ainvoke(question)
        return model.prompts[0]

    prompt = await run()
    assert UNRELATED not in prompt and "Relevant shared memory" not in prompt and "Be brief." in prompt
    writer.remember(PREFERENCE, owner_id=user, readable_by=["lc-*"])
    prompt = await run()
    assert "Relevant shared memory" in prompt and PREFERENCE in prompt
    assert UNRELATED not in prompt


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_store_backs_a_create_agent_run(backend, mode):
    user = unique("user")
    seeded = AmpkitStore(backend.connect(unique("other-agent")), owner_id=user, sharing=Sharing(readable_by=["lc-*"]))
    seeded.put(("prefs", user), "tea", {"text": "Ada prefers green tea"})
    store = AmpkitStore(backend.connect(unique("lc-agent")), owner_id=user)

    @tool
    def save_fact(fact: str, runtime: ToolRuntime) -> str:
        """Save a fact about the user."""
        runtime.store.put(("prefs", user), "fact-1", {"text": fact})
        return "saved"

    @before_model
    def recall(state, runtime):
        hits = runtime.store.search(("prefs",), query=str(state["messages"][-1].content), limit=3)
        if hits:
            return {"messages": [SystemMessage("Memories: " + "; ".join(h.value["text"] for h in hits))]}
        return None

    model = LangChainFakeModel([tool_call("save_fact", fact="Ada's cat is called Tom"), "Done."])
    agent = create_agent(model, tools=[save_fact], middleware=[recall], store=store)
    question = {"messages": [HumanMessage("Which tea does Ada like? Also her cat is Tom.")]}
    if mode == "sync":
        agent.invoke(question)
    else:
        await agent.ainvoke(question)

    assert "Ada prefers green tea" in model.prompts[0]
    item = store.get(("prefs", user), "fact-1")
    assert item is not None and item.value == {"text": "Ada's cat is called Tom"}
    assert "Ada's cat is called Tom" in backend.texts(user)


async def test_store_operations_sync_and_async(backend):
    user = unique("user")
    store = AmpkitStore(backend.connect(unique("lc-agent")), owner_id=user)
    store.put(("docs", "a"), "k1", {"text": "alpha report about tea", "kind": "report"})
    store.put(("docs", "a", "deep"), "k2", {"title": "beta", "body": "notes on coffee"}, index=["body"])
    await store.aput(("notes",), "k3", {"text": "gamma", "kind": "note"})

    store.put(("docs", "a"), "k1", {"text": "alpha report about green tea", "kind": "report"})  # upsert
    assert store.get(("docs", "a"), "k1").value["text"] == "alpha report about green tea"
    assert len(backend.cells(user)) == 3

    assert [i.key for i in store.search(("docs",), query="coffee")][0] == "k2"  # best first; others may follow by meaning
    assert [i.key for i in await store.asearch(("docs",), filter={"kind": "report"})] == ["k1"]
    assert [i.key for i in store.search(("notes",))] == ["k3"]
    assert "k3" not in [i.key for i in store.search(("docs",), query="gamma")]  # outside the prefix

    assert store.list_namespaces() == [("docs", "a"), ("docs", "a", "deep"), ("notes",)]
    assert store.list_namespaces(prefix=("docs",), max_depth=2) == [("docs", "a")]
    assert await store.alist_namespaces(suffix=("deep",)) == [("docs", "a", "deep")]
    assert store.list_namespaces(prefix=("*", "a"), limit=1) == [("docs", "a")]  # wildcard label
    assert store.batch([ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("a",)),))]) == [[("docs", "a")]]

    await store.adelete(("docs", "a"), "k1")
    assert store.get(("docs", "a"), "k1") is None
    assert sorted(backend.texts(user)) == ["gamma", "notes on coffee"]


def test_store_items_are_private_to_the_owner_unless_shared(backend):
    user = unique("user")
    AmpkitStore(backend.connect(unique("writer")), owner_id=user).put(("p",), "k", {"text": "secret plan"})
    outsider = AmpkitStore(backend.connect(unique("outsider")), owner_id=user)
    assert outsider.get(("p",), "k") is None
    assert outsider.search(("p",), query="secret plan") == []


def test_chat_history_in_a_runnable_keeps_the_session(backend):
    from langchain_core.runnables.history import RunnableWithMessageHistory

    user, session = unique("user"), unique("session")
    client = backend.connect(unique("lc-agent"))
    model = LangChainFakeModel(["Hello Ada, noted.", "Your name is Ada."])
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{input}")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        chain = RunnableWithMessageHistory(
            prompt | model, lambda sid: AmpkitChatMessageHistory(client, session_id=sid, owner_id=user),
            input_messages_key="input", history_messages_key="history",
        )
    config = {"configurable": {"session_id": session}}
    chain.invoke({"input": "My name is Ada."}, config=config)
    chain.invoke({"input": "What is my name?"}, config=config)

    assert "My name is Ada." in model.prompts[1] and "Hello Ada, noted." in model.prompts[1]
    episodic = backend.cells(user, session_id=session)
    assert [c.content.text for c in episodic] == ["My name is Ada.", "Hello Ada, noted.", "What is my name?", "Your name is Ada."]
    assert {c.type for c in episodic} == {"episodic"}


async def test_chat_history_clear_forgets_only_its_own_messages(backend):
    user, session = unique("user"), unique("session")
    mine = AmpkitChatMessageHistory(backend.connect(unique("lc-agent")), session_id=session, owner_id=user)
    theirs = AmpkitChatMessageHistory(backend.connect(unique("other-agent")), session_id=session, owner_id=user)
    await mine.aadd_messages([HumanMessage("from me")])
    theirs.add_messages([HumanMessage("from them")])
    backend.connect(user).remember("user's own note", owner_id=user)

    await mine.aclear()
    assert sorted(backend.texts(user)) == ["from them", "user's own note"]
    assert [m.content for m in await theirs.aget_messages()] == ["from them"]


async def test_retriever_finds_what_any_framework_wrote(backend):
    user = unique("user")
    backend.connect(unique("crew-agent")).remember("Ada's invoices go to the finance team", owner_id=user,
                                                    readable_by=["lc-*"])
    retriever = AmpkitRetriever(client=backend.connect(unique("lc-agent")), owner_id=user, k=2)
    docs = retriever.invoke("invoices finance")
    assert [d.page_content for d in docs] == ["Ada's invoices go to the finance team"]
    assert docs[0].metadata["score"] > 0
    assert [d.id for d in await retriever.ainvoke("invoices")] == [docs[0].id]
    assert AmpkitRetriever(client=backend.connect(unique("nosy")), owner_id=user).invoke("invoices") == []


def test_the_langchain_example_remembers_recalls_and_searches_the_store(tmp_path):
    """examples/langchain_agent.py as a person runs it (in this process: support.run_example)."""
    from support import ROOT, run_example

    done = run_example(ROOT / "examples" / "langchain_agent.py", env={"AMPKIT_URL": f"sqlite:///{tmp_path}/memory.db"})
    assert done.returncode == 0, done.stderr
    assert "recall tool returned: - Ada's cat is called Tom" in done.stdout
    assert "answer: Your cat is Tom." in done.stdout
    assert "store search: [{'text': 'Ada drinks green tea'}]" in done.stdout
