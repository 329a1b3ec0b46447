"""CrewAI 1.x crew with ampkit memory (unified-memory API: `Crew(memory=...)`).

    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/crewai_agent.py

Without AMPKIT_URL it uses a fresh SQLite file in process. The LLM is an offline fake; replace
it with `crewai.LLM(model=...)`. Note: CrewAI writes under ~/.local/share on import and kickoff.
"""

import os
import tempfile

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # noqa: E402

import ampkit  # noqa: E402
from ampkit.adapters.crewai import AmpkitCrewMemory  # noqa: E402
from fakes.crewai import CrewAIFakeLLM  # noqa: E402

url = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp()}/memory.db"
client = ampkit.connect(url, agent_id="crewai-researcher")
client.remember("Ada's report is due on Friday", owner_id="ada")

llm = CrewAIFakeLLM("The report is due Friday; I will start today.")
memory = AmpkitCrewMemory(client=client, owner_id="ada")
researcher = Agent(role="Researcher", goal="Plan Ada's report", backstory="Careful planner.", llm=llm)
task = Task(description="When is Ada's report due, and when should we start?", expected_output="One line.", agent=researcher)
result = Crew(agents=[researcher], tasks=[task], memory=memory).kickoff()

print("recalled into the prompt:", "Ada's report is due on Friday" in llm.prompts[0])
print("answer:", result.raw)
saved = [c.content.text for c in client.list(owner_id="ada")][-1]
print("remembered after the task:", saved.splitlines()[-1])
client.close()
