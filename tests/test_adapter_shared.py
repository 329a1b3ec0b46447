"""Cross-framework: what a LangChain agent remembers, LlamaIndex, CrewAI and AutoGen agents
find in their prompts on their next turn; an agent the cell's access policy does not admit
does not. Over HTTP against a real server and in process on SQLite. Also runs the
shared-preferences example end to end against the server, as `make demo` does."""

from __future__ import annotations

import re
import runpy

from autogen_agentchat.agents import AssistantAgent
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage

import ampkit
from adapter_support import backend, deferred, unique  # noqa: F401  (fixture)
from ampkit.adapters import autogen as ag, langchain as lc
from ampkit.adapters import Sharing
from fakes.autogen import AutoGenFakeModel
from fakes.langchain import LangChainFakeModel
from support import ROOT

# Imported when first used (see adapter_support.Deferred): CrewAI and LlamaIndex are slow to import.
Agent, Crew, Task = deferred("crewai", "Agent", "Crew", "Task")
FunctionAgent = deferred("llama_index.core.agent.workflow", "FunctionAgent")
crew, li = deferred("ampkit.adapters.crewai"), deferred("ampkit.adapters.llamaindex")
CrewAIFakeLLM = deferred("fakes.crewai", "CrewAIFakeLLM")
LlamaIndexFakeLLM = deferred("fakes.llamaindex", "LlamaIndexFakeLLM")

PREFERENCE = "the user prefers bullet-point summaries"
QUESTION = "Write the summaries of today's meeting."


async def test_a_langchain_memory_reaches_every_other_framework_but_not_an_outsider(backend):
    user = unique("user")
    team = {name: unique(f"team-{name}") for name in ("langchain", "llamaindex", "crewai", "autogen")}
    outsider = unique("outsider")

    # LangChain: the agent decides to remember the preference, shared with the team.
    tools = lc.memory_tools(backend.connect(team["langchain"]), owner_id=user, sharing=Sharing(readable_by=["team-*"]))
    model = LangChainFakeModel([AIMessage("", tool_calls=[{"name": "remember", "args": {"fact": PREFERENCE}, "id": "c1"}]),
                                "I'll remember that."])
    create_agent(model, tools=tools).invoke({"messages": [HumanMessage("I prefer bullet-point summaries.")]})
    (cell,) = backend.cells(user)
    assert cell.content.text == PREFERENCE and cell.identity.created_by == team["langchain"]

    # LlamaIndex, next turn.
    li_llm = LlamaIndexFakeLLM("- point one")
    li_memory = li.AmpkitLlamaIndexMemory(client=backend.aconnect(team["llamaindex"]), owner_id=user, session_id=unique("s"))
    await FunctionAgent(name="a", description="d", llm=li_llm, tools=[]).run(user_msg=QUESTION, memory=li_memory)
    assert PREFERENCE in li_llm.prompts[0]

    # CrewAI, next task.
    crew_llm = CrewAIFakeLLM("- point one")
    crew_memory = crew.AmpkitCrewMemory(client=backend.connect(team["crewai"]), owner_id=user)
    writer = Agent(role="Writer", goal="Summarise meetings", backstory="Concise.", llm=crew_llm)
    await Crew(agents=[writer], tasks=[Task(description=QUESTION, expected_output="Bullets.", agent=writer)],
               memory=crew_memory).kickoff_async()
    assert PREFERENCE in crew_llm.prompts[0]

    # AutoGen, next turn; and an AutoGen agent outside the team.
    for agent_id, admitted in ((team["autogen"], True), (outsider, False)):
        ag_model = AutoGenFakeModel("- point one")
        memory = ag.AmpkitAutoGenMemory(backend.aconnect(agent_id), owner_id=user)
        await AssistantAgent("assistant", model_client=ag_model, memory=[memory]).run(task=QUESTION)
        assert (PREFERENCE in ag_model.prompts[0]) is admitted
        await memory.close()

    # The refusal is the server's access rule, not the adapter's: a raw get is refused too.
    try:
        backend.connect(outsider).get(cell.id)
    except ampkit.AccessDenied:
        pass
    else:
        raise AssertionError("the outsider could read the cell")


def test_shared_preferences_example_prints_one_line_per_framework(server, monkeypatch, capsys):
    # Run as its own script (`__main__`) in this process: a child process would import the four
    # frameworks again (seconds of CPU) and test nothing more; `make demo` runs it as a process.
    monkeypatch.setenv("AMPKIT_URL", server.base_url)
    runpy.run_path(str(ROOT / "examples" / "shared_preferences.py"), run_name="__main__")
    out = capsys.readouterr()
    lines = dict(line.split(": ", 1) for line in out.out.strip().splitlines() if ": " in line)
    for framework in ("langchain", "llamaindex", "crewai", "autogen"):
        assert "bullet-point summaries" in lines[framework], out.out
    refused = [v for k, v in lines.items() if k.startswith("refused")]
    assert refused and "bullet-point" not in refused[0], out.out
    # README shows what `make demo` prints: its own line about the server, then the example's.
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index("\n```\nampkit server at "):].split("```")[1].strip().splitlines()
    assert re.fullmatch(r"ampkit server at http://127\.0\.0\.1:\d+/amp/v1 \(store /tmp/\S+/memory\.db\)", shown[0])
    assert shown[1:] == out.out.strip().splitlines()
    assert 'echo "ampkit server at $$url (store $$tmp/memory.db)"' in (ROOT / "Makefile").read_text()
