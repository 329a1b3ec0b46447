"""Every framework reads the same instructions (issue 11): an AGENTS.md proposed by one agent
and approved by its owner reaches the model input of a LangChain, a LlamaIndex, a CrewAI and
an AutoGen agent, all through one real server over HTTP; so does the index of the skills."""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

import ampkit
from adapter_support import deferred, unique
from ampkit.adapters import autogen as ag, langchain as lc
from fakes.autogen import AutoGenFakeModel
from fakes.langchain import LangChainFakeModel

# Imported when first used (see adapter_support.Deferred): CrewAI and LlamaIndex are slow to import.
Agent, Crew, Task = deferred("crewai", "Agent", "Crew", "Task")
FunctionAgent = deferred("llama_index.core.agent.workflow", "FunctionAgent")
crew, li = deferred("ampkit.adapters.crewai"), deferred("ampkit.adapters.llamaindex")
CrewAIFakeLLM = deferred("fakes.crewai", "CrewAIFakeLLM")
LlamaIndexFakeLLM = deferred("fakes.llamaindex", "LlamaIndexFakeLLM")

RULE = "Always answer in bullet points, never in paragraphs."
SKILL = "---\nname: meeting-notes\ndescription: Summarise a meeting into decisions and owners.\n---\n1. List decisions\n"
QUESTION = "Summarise today's meeting."


async def test_the_approved_agents_md_reaches_four_frameworks_through_one_server(server):
    user = unique("user")
    team = {name: unique(f"team-{name}") for name in ("writer", "langchain", "llamaindex", "crewai", "autogen")}
    writer = ampkit.connect(server.base_url, agent_id=team["writer"])
    owner = ampkit.connect(server.base_url, agent_id=user)
    proposed = writer.write_file("AGENTS.md", f"# Team rules\n- {RULE}\n", owner_id=user, readable_by=["team-*"],
                                 reason="the user asked for bullets")
    skill = writer.write_file("skills/meeting-notes/SKILL.md", SKILL, owner_id=user, readable_by=["team-*"])
    assert proposed.status == skill.status == "proposed"
    for p in (proposed, skill):
        assert owner.approve_proposal(p.proposal_id).status == "approved"  # the owner approves

    lc_model = LangChainFakeModel(["- decision one"])
    middleware = lc.SharedMemoryMiddleware(ampkit.connect(server.base_url, agent_id=team["langchain"]),
                                           owner_id=user, instructions=True)
    create_agent(lc_model, tools=[], middleware=[middleware]).invoke({"messages": [HumanMessage(QUESTION)]})

    li_llm = LlamaIndexFakeLLM("- decision one")
    li_memory = li.AmpkitLlamaIndexMemory(client=ampkit.aconnect(server.base_url, agent_id=team["llamaindex"]),
                                          owner_id=user, session_id=unique("s"), instructions=True)
    await FunctionAgent(name="a", description="d", llm=li_llm, tools=[]).run(user_msg=QUESTION, memory=li_memory)

    crew_llm = CrewAIFakeLLM("- decision one")
    crew_memory = crew.AmpkitCrewMemory(client=ampkit.connect(server.base_url, agent_id=team["crewai"]),
                                        owner_id=user, instructions=True)
    member = Agent(role="Writer", goal="Summarise meetings", backstory="Concise.", llm=crew_llm)
    await Crew(agents=[member], tasks=[Task(description=QUESTION, expected_output="Bullets.", agent=member)],
               memory=crew_memory).kickoff_async()

    ag_model = AutoGenFakeModel("- decision one")
    ag_memory = ag.AmpkitAutoGenMemory(ampkit.aconnect(server.base_url, agent_id=team["autogen"]), owner_id=user,
                                       instructions=True)
    await AssistantAgent("assistant", model_client=ag_model, memory=[ag_memory]).run(task=QUESTION)
    await ag_memory.close()

    for name, prompt in (("langchain", lc_model.prompts[0]), ("llamaindex", li_llm.prompts[0]),
                         ("crewai", crew_llm.prompts[0]), ("autogen", ag_model.prompts[0])):
        assert RULE in prompt, name
        assert "meeting-notes: Summarise a meeting into decisions and owners." in prompt, name

    # An agent outside the file's readers gets no instructions, and no error either.
    outsider = LangChainFakeModel(["hello"])
    create_agent(outsider, tools=[], middleware=[lc.SharedMemoryMiddleware(
        ampkit.connect(server.base_url, agent_id=unique("outsider")), owner_id=user, instructions=True)]
    ).invoke({"messages": [HumanMessage(QUESTION)]})
    assert RULE not in outsider.prompts[0]
