"""LangMem on `AmpkitStore`: its manage and search tools in a `create_agent` with a fake model,
with LangMem's own per-user namespace `("memories", "{langgraph_user_id}")`; what LangMem
writes is the user's memory, and the LlamaIndex, CrewAI and AutoGen adapters find it. One
real server over HTTP."""

from __future__ import annotations

import pytest

langmem = pytest.importorskip("langmem")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from crewai import Agent, Crew, Task  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402

import ampkit  # noqa: E402
from adapter_support import unique  # noqa: E402
from ampkit.adapters import Sharing  # noqa: E402
from ampkit.adapters.autogen import AmpkitAutoGenMemory  # noqa: E402
from ampkit.adapters.crewai import AmpkitCrewMemory  # noqa: E402
from ampkit.adapters.langchain import AmpkitStore  # noqa: E402
from ampkit.adapters.llamaindex import AmpkitLlamaIndexMemory  # noqa: E402
from fakes.autogen import AutoGenFakeModel  # noqa: E402
from fakes.crewai import CrewAIFakeLLM  # noqa: E402
from fakes.langchain import LangChainFakeModel  # noqa: E402
from fakes.llamaindex import LlamaIndexFakeLLM  # noqa: E402

FACT = "Ada is allergic to peanuts and wants recipes without them"
QUESTION = "Plan Ada's dinner recipes for the week."


def call(name: str, n: int, **args) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])


async def test_langmem_tools_on_ampkit_and_every_framework_finds_the_memory(server):
    url, user = server.base_url, unique("ada")
    namespace = ("memories", "{langgraph_user_id}")
    store = AmpkitStore(ampkit.connect(url, agent_id=unique("team-langmem")), sharing=Sharing(readable_by=["team-*"]))
    tools = [langmem.create_manage_memory_tool(namespace=namespace), langmem.create_search_memory_tool(namespace=namespace)]
    model = LangChainFakeModel([call("manage_memory", 1, content=FACT, action="create"),
                                call("search_memory", 2, query="peanuts allergy"), "Noted: no peanuts."])
    config = {"configurable": {"langgraph_user_id": user}}
    state = create_agent(model, tools=tools, store=store).invoke(
        {"messages": [HumanMessage("I'm allergic to peanuts, remember that.")]}, config=config)

    assert "created memory" in state["messages"][2].content
    assert FACT in state["messages"][4].content  # LangMem's search found it through the store
    cells = list(ampkit.connect(url, agent_id=user).list(owner_id=user))
    assert [c.content.text for c in cells] == [FACT] and cells[0].identity.owner_id == user  # the user's

    li_llm = LlamaIndexFakeLLM("Recipes without peanuts.")
    li_memory = AmpkitLlamaIndexMemory(client=ampkit.aconnect(url, agent_id=unique("team-li")), owner_id=user)
    await FunctionAgent(name="chef", description="plans", llm=li_llm, tools=[]).run(user_msg=QUESTION, memory=li_memory)
    assert FACT in li_llm.prompts[0]

    crew_llm = CrewAIFakeLLM("Recipes without peanuts.")
    crew_memory = AmpkitCrewMemory(client=ampkit.connect(url, agent_id=unique("team-crew")), owner_id=user)
    chef = Agent(role="Chef", goal="Plan dinners", backstory="Careful.", llm=crew_llm)
    await Crew(agents=[chef], tasks=[Task(description=QUESTION, expected_output="A plan.", agent=chef)],
               memory=crew_memory).kickoff_async()
    assert FACT in crew_llm.prompts[0]

    ag_model = AutoGenFakeModel("Recipes without peanuts.")
    ag_memory = AmpkitAutoGenMemory(ampkit.aconnect(url, agent_id=unique("team-ag")), owner_id=user)
    await AssistantAgent("chef", model_client=ag_model, memory=[ag_memory]).run(task=QUESTION)
    assert FACT in ag_model.prompts[0]
    await ag_memory.close()
