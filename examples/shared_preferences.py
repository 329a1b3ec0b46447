"""A multi-framework team sharing one user's preferences through ampkit.

A LangChain agent hears the user's preference and remembers it, shared with every agent
whose id matches `team-*`. Then a LlamaIndex, a CrewAI and an AutoGen agent each get a task,
and each finds the preference in its prompt. A contractor agent outside the team runs the
same turn and sees nothing: the cell's access policy does not admit it.

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/shared_preferences.py

(without AMPKIT_URL it uses a fresh SQLite file in process). The models are offline fakes
that record their prompts (`examples/fakes/`); swap in real ones and nothing else changes.
Prints one line per framework: `<framework>: <what its agent saw from shared memory>`.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile

for _var, _value in {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false", "OTEL_SDK_DISABLED": "true"}.items():
    os.environ.setdefault(_var, _value)

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from crewai import Agent, Crew, Task  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402

import ampkit  # noqa: E402
from ampkit.adapters import autogen as ag, crewai as crew, langchain as lc, llamaindex as li  # noqa: E402
from ampkit.adapters import Sharing  # noqa: E402
from fakes.autogen import AutoGenFakeModel  # noqa: E402
from fakes.crewai import CrewAIFakeLLM  # noqa: E402
from fakes.langchain import LangChainFakeModel  # noqa: E402
from fakes.llamaindex import LlamaIndexFakeLLM  # noqa: E402

URL = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp(prefix='ampkit-example-')}/memory.db"
USER = "ada"
TASK = "Write the summaries of today's meeting."


def seen(prompt: str) -> str:
    """The shared-memory lines of a prompt (each adapter renders memories as `- text`)."""
    lines = [re.sub(r"^- (\(score=[\d.]+\) )?", "", line.strip()) for line in prompt.splitlines()
             if line.strip().startswith("- ")]
    return "; ".join(dict.fromkeys(lines)) or "(nothing from shared memory)"


def langchain_turn() -> str:
    client = ampkit.connect(URL, agent_id="team-langchain")
    tools = lc.memory_tools(client, owner_id=USER, sharing=Sharing(readable_by=["team-*"]))
    remember = AIMessage("", tool_calls=[{"name": "remember", "args": {"fact": "the user prefers bullet-point summaries"}, "id": "1"}])
    create_agent(LangChainFakeModel([remember, "Noted."]), tools=tools).invoke(
        {"messages": [HumanMessage("Please always give me bullet-point summaries.")]})
    # Next turn: the middleware puts what shared memory knows into the model call.
    model = LangChainFakeModel(["- decisions\n- owners"])
    create_agent(model, middleware=[lc.SharedMemoryMiddleware(client, owner_id=USER)]).invoke(
        {"messages": [HumanMessage(TASK)]})
    client.close()
    return seen(model.prompts[-1])


async def llamaindex_turn() -> str:
    llm = LlamaIndexFakeLLM("- decisions\n- owners")
    memory = li.AmpkitLlamaIndexMemory(client=ampkit.aconnect(URL, agent_id="team-llamaindex"), owner_id=USER,
                                       session_id="standup")
    await FunctionAgent(name="notes", description="takes notes", llm=llm, tools=[]).run(user_msg=TASK, memory=memory)
    return seen(llm.prompts[-1])


def crewai_turn() -> str:
    llm = CrewAIFakeLLM("- decisions\n- owners")
    memory = crew.AmpkitCrewMemory(client=ampkit.connect(URL, agent_id="team-crewai"), owner_id=USER)
    writer = Agent(role="Writer", goal="Summarise meetings", backstory="Concise.", llm=llm)
    Crew(agents=[writer], tasks=[Task(description=TASK, expected_output="A summary.", agent=writer)], memory=memory).kickoff()
    memory.close()
    return seen(llm.prompts[0])


async def autogen_turn(agent_id: str) -> str:
    model = AutoGenFakeModel("- decisions\n- owners")
    memory = ag.AmpkitAutoGenMemory(ampkit.aconnect(URL, agent_id=agent_id), owner_id=USER)
    await AssistantAgent("assistant", model_client=model, memory=[memory]).run(task=TASK)
    await memory.close()
    return seen(model.prompts[-1])


def main() -> None:
    print(f"langchain: {langchain_turn()}")
    print(f"llamaindex: {asyncio.run(llamaindex_turn())}")
    print(f"crewai: {crewai_turn()}")
    print(f"autogen: {asyncio.run(autogen_turn('team-autogen'))}")
    print(f"refused (autogen agent 'contractor', not in team-*): {asyncio.run(autogen_turn('contractor'))}")


if __name__ == "__main__":
    main()
