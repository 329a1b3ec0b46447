"""The adapters' episode hook: with `record_episodes=True` each user turn becomes one episodic
cell on the hot path (later model calls of the same turn record nothing), ready for
consolidation. Real agents with scripted fake models, over HTTP and in process."""

from __future__ import annotations

import pytest
from autogen_agentchat.agents import AssistantAgent
from langchain.agents import create_agent
from langchain.tools import tool
from langchain_core.messages import AIMessage, HumanMessage

from adapter_support import backend, unique  # noqa: F401  (fixture)
from ampkit.adapters.autogen import AmpkitAutoGenMemory as AmpkitMemory
from fakes.autogen import AutoGenFakeModel
from fakes.langchain import LangChainFakeModel
from ampkit.adapters.langchain import SharedMemoryMiddleware


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city} is in Scotland"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_langchain_middleware_records_each_user_turn_once(backend, mode):
    user = unique("user")
    middleware = SharedMemoryMiddleware(backend.connect(unique("lc-agent")), owner_id=user,
                                        record_episodes=True, session_id="chat-1")
    # two model calls in the turn: a tool call, then the answer
    model = LangChainFakeModel([AIMessage("", tool_calls=[{"name": "lookup", "args": {"city": "Edinburgh"},
                                                           "id": "call-1"}]), "Noted."])
    agent = create_agent(model, tools=[lookup], middleware=[middleware])
    question = {"messages": [HumanMessage("I moved to Edinburgh last month.")]}
    _ = agent.invoke(question) if mode == "sync" else await agent.ainvoke(question)
    [episode] = backend.cells(user)
    assert (episode.type, episode.content.text, episode.identity.session_id) == (
        "episodic", "I moved to Edinburgh last month.", "chat-1")
    assert len(model.prompts) == 2


async def test_langchain_middleware_records_nothing_by_default(backend):
    user = unique("user")
    agent = create_agent(LangChainFakeModel(["ok"]), middleware=[SharedMemoryMiddleware(backend.connect(unique("lc")), owner_id=user)])
    agent.invoke({"messages": [HumanMessage("I moved to Edinburgh.")]})
    assert backend.cells(user) == []


async def test_autogen_memory_records_each_user_turn_once(backend):
    user = unique("user")
    memory = AmpkitMemory(backend.aconnect(unique("ag-agent")), owner_id=user, session_id="chat-2", record_episodes=True)
    agent = AssistantAgent("assistant", model_client=AutoGenFakeModel("Noted."), memory=[memory])
    await agent.run(task="I prefer tea over coffee.")
    [episode] = backend.cells(user)
    assert (episode.type, episode.content.text, episode.identity.session_id) == ("episodic", "I prefer tea over coffee.", "chat-2")
    assert AmpkitMemory.load_component(memory.dump_component())._config.record_episodes is True
    await memory.close()
