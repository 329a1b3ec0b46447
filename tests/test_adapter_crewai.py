"""CrewAI 1.x adapter: real `Crew` and `Agent` kickoffs with a fake LLM, memory through the
unified-memory `memory=` argument, over HTTP against a real server and in process on SQLite.
(conftest points HOME and CREWAI_STORAGE_DIR into a temp dir: CrewAI writes there.)"""

from __future__ import annotations

from adapter_support import backend, deferred, unique  # noqa: F401  (fixture)
from ampkit.adapters import Sharing

# Imported when first used (see adapter_support.Deferred): CrewAI takes ~4 s to import.
Agent, Crew, Process, Task = deferred("crewai", "Agent", "Crew", "Process", "Task")
AmpkitCrewMemory = deferred("ampkit.adapters.crewai", "AmpkitCrewMemory")
CrewAIFakeLLM = deferred("fakes.crewai", "CrewAIFakeLLM")


def one_task_crew(llm: CrewAIFakeLLM, memory=None, agent_memory=None) -> Crew:
    agent = Agent(role="Writer", goal="Write Ada's report summary", backstory="Knows Ada.", llm=llm, memory=agent_memory)
    task = Task(description="Write the summary format Ada wants for the report", expected_output="One line.", agent=agent)
    return Crew(agents=[agent], tasks=[task], process=Process.sequential, memory=memory)


def test_crew_memory_recalls_into_the_prompt_and_remembers_the_result(backend):
    user = unique("user")
    backend.connect(unique("lc-agent")).remember("Ada wants the summary format as bullet points", owner_id=user,
                                                  readable_by=["crew-*"],
                                                  metadata={"topic": "formatting", "ampkit_scope": "langchain.tools:x"})
    agent_id = unique("crew-agent")
    memory = AmpkitCrewMemory(client=backend.connect(agent_id), owner_id=user, sharing=Sharing(readable_by=["lc-*"]))
    llm = CrewAIFakeLLM(answer="- bullet one\n- bullet two")

    result = one_task_crew(llm, memory=memory).kickoff()

    assert "bullet" in result.raw
    assert "Ada wants the summary format as bullet points" in llm.prompts[0]
    assert "topic: formatting" in llm.prompts[0] and "ampkit_scope" not in llm.prompts[0]  # no bookkeeping tags
    saved = [c for c in backend.cells(user) if c.identity.created_by == agent_id]
    assert len(saved) == 1 and "- bullet one" in saved[0].content.text
    assert saved[0].content.metadata["crewai_agent_role"] == "Writer"
    assert saved[0].access_policy.readable_by == ["lc-*"]


def test_crew_recall_injects_only_what_clears_min_score_and_no_header_without_one(backend):
    """Issue 43: CrewAI renders "Relevant memories:" only for a non-empty recall."""
    user = unique("user")
    writer = backend.connect(unique("lc-agent"))
    writer.remember("the office plants are watered on Fridays", owner_id=user, readable_by=["crew-*"])
    memory = AmpkitCrewMemory(client=backend.connect(unique("crew-agent")), owner_id=user)

    def prompt() -> str:
        llm = CrewAIFakeLLM(answer="- one")
        one_task_crew(llm, memory=memory).kickoff()
        return llm.prompts[0]

    first = prompt()
    assert "plants" not in first and "Relevant memories" not in first
    writer.remember("the summary format Ada wants for the report: one short line", owner_id=user,
                    readable_by=["crew-*"])
    second = prompt()
    # (CrewAI also keeps the first run's task as a memory: what clears the threshold now is
    # about the report, never the plants.)
    assert "Relevant memories" in second and "plants" not in second


def test_agent_memory_and_standalone_agent_kickoff(backend):
    user = unique("user")
    owner = backend.connect(user)
    owner.remember("Ada's report deadline is Friday", owner_id=user, readable_by=["crew-*"])
    memory = AmpkitCrewMemory(client=backend.connect(unique("crew-agent")), owner_id=user)
    llm = CrewAIFakeLLM(answer="Friday.")

    one_task_crew(llm, agent_memory=memory).kickoff()
    assert "Ada's report deadline is Friday" in llm.prompts[0]

    agent = Agent(role="Planner", goal="Plan Ada's week", backstory="Organised.", llm=llm, memory=memory)
    agent.kickoff("When is Ada's report deadline?")
    assert "Ada's report deadline is Friday" in llm.prompts[-1]


def test_reset_forgets_only_this_memory_cells(backend):
    user = unique("user")
    agent_id = unique("crew-agent")
    memory = AmpkitCrewMemory(client=backend.connect(agent_id), owner_id=user, name="research")
    memory.remember("crew note one", scope="/notes", categories=["note"])
    memory.remember_many(["crew note two", "crew note three"], agent_role="Writer")
    other = AmpkitCrewMemory(client=backend.connect(agent_id), owner_id=user, name="other-crew")
    other.remember("other crew note")
    backend.connect(user).remember("user's own note", owner_id=user)

    assert memory.forget(categories=["note"]) == 1
    assert [m.record.content for m in memory.recall("crew note two")][:1] == ["crew note two"]
    memory.reset()
    # reset_all too: "all" is all of this memory's own cells, never the user's or another crew's.
    memory.reset_all()
    assert sorted(backend.texts(user)) == ["other crew note", "user's own note"]


def test_every_inherited_browse_method_works_through_the_storage_interface(backend):
    user = unique("user")
    agent_id = unique("crew-agent")
    memory = AmpkitCrewMemory(client=backend.connect(agent_id), owner_id=user, name="browse")
    memory.remember("deadline is Friday", scope="/project/dates", categories=["dates"])
    memory.remember("budget is small", scope="/project/money", categories=["money"])
    memory.remember("Ada likes tea", scope="/people")
    teammate = AmpkitCrewMemory(client=backend.connect(unique("crew-mate")), owner_id=user, name="browse",
                                sharing=Sharing(readable_by=["crew-*"]))
    teammate.remember("teammate's note", scope="/project/dates")

    assert [r.content for r in memory.list_records(limit=2)] == ["teammate's note", "Ada likes tea"]  # newest first
    assert memory.list_scopes() == ["/people", "/project"]
    assert memory.list_scopes("/project") == ["/project/dates", "/project/money"]
    assert memory.list_categories() == {"dates": 1, "money": 1}
    info = memory.info("/project")
    assert info.record_count == 3 and info.child_scopes == ["/project/dates", "/project/money"]
    assert "/project (3 records)" in memory.tree()
    # forget (inherited) goes through the storage, which forgets only this agent's cells
    assert memory.forget(scope="/project") == 2
    assert sorted(r.content for r in memory.list_records()) == ["Ada likes tea", "teammate's note"]
    memory.reset_all()
    assert [r.content for r in memory.list_records()] == ["teammate's note"]


def test_a_refused_after_task_save_is_skipped_not_a_crash(backend):
    user = unique("user")
    memory = AmpkitCrewMemory(client=backend.connect(unique("crew-agent")), owner_id=user)
    saved = memory.remember_many(["x" * 70000, "a normal note"])
    assert [r.content for r in saved] == ["a normal note"]
    assert backend.texts(user) == ["a normal note"]


def test_record_episodes_stores_each_request_once_and_never_recalls_it_as_a_fact(backend):
    user = unique("user")
    memory = AmpkitCrewMemory(client=backend.connect(unique("crew-agent")), owner_id=user,
                              record_episodes=True, session_id="crew-run-1")
    llm = CrewAIFakeLLM(answer="Done.")
    one_task_crew(llm).kickoff()  # no memory: nothing recorded
    assert backend.cells(user) == []
    crew = one_task_crew(llm, memory=memory)
    crew.kickoff()
    episodes = [c for c in backend.cells(user) if c.type == "episodic"]
    assert len(episodes) == 1 and "Write the summary format Ada wants" in episodes[0].content.text
    assert episodes[0].identity.session_id == "crew-run-1"
    recalled = memory.recall("Write the summary format Ada wants for the report")
    assert recalled and episodes[0].id not in {m.record.id for m in recalled}  # the task's saved result, not the episode
    off = AmpkitCrewMemory(client=backend.connect(unique("crew-agent")), owner_id=unique("user"))
    one_task_crew(llm, memory=off).kickoff()
    assert [c for c in backend.cells(off.owner_id) if c.type == "episodic"] == []


def test_the_crewai_example_recalls_into_the_prompt_and_remembers_the_result(tmp_path):
    """examples/crewai_agent.py as a person runs it (in this process: support.run_example)."""
    from support import ROOT, run_example

    done = run_example(ROOT / "examples" / "crewai_agent.py", env={"AMPKIT_URL": f"sqlite:///{tmp_path}/memory.db"})
    assert done.returncode == 0, done.stderr
    assert "recalled into the prompt: True" in done.stdout
    assert "answer: The report is due Friday; I will start today." in done.stdout
    assert "remembered after the task: Final Answer: The report is due Friday; I will start today." in done.stdout
