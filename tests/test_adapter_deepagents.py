"""DeepAgents keeps its memory folder in ampkit (issue 11): a deep agent with a scripted fake
model (no network) is corrected in one session, proposes an AGENTS.md edit, a person decides
with the `ampkit proposals` command, and the next session (a new agent instance) starts with
the outcome in its context. Over HTTP against a real server and in process on SQLite."""

from __future__ import annotations

import re

import pytest
from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend, StateBackend
from langchain_core.messages import AIMessage, HumanMessage

from adapter_support import backend, unique  # noqa: F401  (fixture)
from ampkit.adapters.deepagents import AmpkitBackend
from fakes.langchain import LangChainFakeModel
from support import run_cli

SEED = "# Rules\n- answer in paragraphs\n"
CORRECTED = "# Rules\n- use bullet points\n"


def edit_call(old: str, new: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "edit_file", "id": "c1", "args": {
        "file_path": "/memories/AGENTS.md", "old_string": old, "new_string": new}}])


def session(client, owner: str, replies: list) -> tuple[LangChainFakeModel, list]:
    """One session: a new agent instance over the owner's folder, one user turn."""
    model = LangChainFakeModel(replies)
    files = AmpkitBackend(client, owner_id=owner)
    agent = create_deep_agent(model=model, backend=CompositeBackend(default=StateBackend(), routes={"/memories/": files}),
                              memory=["/memories/AGENTS.md", "/memories/proposals.md"], skills=["/memories/skills/"])
    out = agent.invoke({"messages": [HumanMessage("Please use bullet points from now on.")]})
    return model, out["messages"]


@pytest.fixture
def folder(backend):
    owner = unique("agent")
    person, agent = backend.connect(unique("human")), backend.connect(owner)
    person.set_approval_mode(owner, "yolo")  # the owner's own write lands at once (anyone else's is a proposal)
    agent.write_file("AGENTS.md", SEED, owner_id=owner)
    person.set_approval_mode(owner, "review")
    return owner, agent, person


def decide(backend, person, proposal_id: str, verb: str, message: str = "") -> None:
    """A person decides: with the CLI on a local store, with the client (approve scope) over HTTP."""
    if backend.name == "sqlite":
        args = ["proposals", verb, proposal_id, "--store", backend.url, "--as", "human:ann"]
        done = run_cli(*args, *(["-m", message] if message else []))
        assert done.returncode == 0, done.stderr
    elif verb == "approve":
        person.approve_proposal(proposal_id)
    else:
        person.reject_proposal(proposal_id, message=message or None)


def test_correction_is_proposed_approved_and_read_by_the_next_session(backend, folder):
    owner, agent_client, person = folder
    model, messages = session(agent_client, owner, [edit_call("- answer in paragraphs", "- use bullet points"), "Noted."])
    assert SEED.strip() in model.prompts[0]  # the folder's AGENTS.md was in the first session's context
    told = messages[2].content
    assert "awaits a person's approval" in told and agent_client.read_file("AGENTS.md", owner_id=owner).content == SEED
    proposal_id = re.search(r"prop_[0-9A-Z]{26}", told).group(0)
    if backend.name == "sqlite":
        shown = run_cli("proposals", "show", proposal_id, "--store", backend.url)
        assert "-- answer in paragraphs" in shown.stdout and "+- use bullet points" in shown.stdout
    decide(backend, person, proposal_id, "approve")

    model, _ = session(agent_client, owner, ["- point one\n- point two"])
    assert "use bullet points" in model.prompts[0] and "answer in paragraphs" not in model.prompts[0]
    history = agent_client.file_history("AGENTS.md", owner_id=owner).results
    assert (history[-1].actor, history[-1].proposal_id) == (owner, proposal_id)
    assert history[-1].approved_by == ("human:ann" if backend.name == "sqlite" else person.agent_id)


def test_yolo_lands_without_approval(backend, folder):
    owner, agent_client, person = folder
    person.set_approval_mode(owner, "yolo")
    _, messages = session(agent_client, owner, [edit_call("- answer in paragraphs", "- use bullet points"), "Done."])
    assert messages[2].content.startswith("Successfully replaced") or "awaits" not in messages[2].content
    assert agent_client.read_file("AGENTS.md", owner_id=owner).content == CORRECTED
    assert agent_client.list_proposals(owner_id=owner) == []
    model, _ = session(agent_client, owner, ["- ok"])
    assert "use bullet points" in model.prompts[0]


def test_a_rejected_proposal_leaves_the_file_and_the_agent_is_told(backend, folder):
    owner, agent_client, person = folder
    _, messages = session(agent_client, owner, [edit_call("- answer in paragraphs", "- use bullet points"), "Noted."])
    proposal_id = re.search(r"prop_[0-9A-Z]{26}", messages[2].content).group(0)
    decide(backend, person, proposal_id, "reject", "the team wants paragraphs")
    assert agent_client.read_file("AGENTS.md", owner_id=owner).content == SEED
    model, _ = session(agent_client, owner, ["Paragraphs it is."])
    assert f"{proposal_id} write `AGENTS.md`: rejected" in model.prompts[0]
    assert "the team wants paragraphs" in model.prompts[0] and "answer in paragraphs" in model.prompts[0]


def test_an_invalid_skill_is_refused_with_every_error_and_nothing_stored(backend, folder):
    owner, agent_client, _ = folder
    write = AIMessage("", tool_calls=[{"name": "write_file", "id": "c1", "args": {
        "file_path": "/memories/skills/Notes/SKILL.md", "content": "---\nname: notes\n---\nbody\n"}}])
    _, messages = session(agent_client, owner, [write, "I'll fix it."])
    refusal = messages[2].content
    assert "must equal the skill's directory name ('Notes')" in refusal and "`description` is required" in refusal
    assert [f.path for f in agent_client.list_files(owner).results if f.path.startswith("skills/")] == []
    assert agent_client.list_proposals(owner_id=owner) == []


async def test_async_backend_reads_lists_and_proposes(backend, folder):
    owner, _, _ = folder
    files = AmpkitBackend(backend.aconnect(owner), owner_id=owner)
    read = await files.aread("/AGENTS.md")
    assert read.file_data["content"] == SEED and (read.start_line, read.end_line, read.total_lines) == (1, 2, 2)
    assert [e["path"] for e in (await files.als("/")).entries] == ["/AGENTS.md"]
    edited = await files.aedit("/AGENTS.md", "paragraphs", "bullets")
    assert edited.occurrences == 1 and "awaits a person's approval" in edited.error
    assert [e["path"] for e in (await files.als("/")).entries] == ["/AGENTS.md", "/proposals.md"]
    grep = await files.agrep("paragraphs", path="/")
    assert [(m["path"], m["line"]) for m in grep.matches] == [("/AGENTS.md", 2)]
    missing = await files.aread("/nope.md")
    assert missing.error == "Error: file '/nope.md' not found"
    await files.clients.aclose()


def test_the_langgraph_store_adapter_round_trips_store_backend_values(backend):
    """DeepAgents' own StoreBackend over ampkit's LangGraph store keeps its FileData values."""
    from deepagents.backends import StoreBackend

    from ampkit.adapters.langchain import AmpkitStore

    owner = unique("agent")
    store = AmpkitStore(backend.connect(owner), owner_id=owner)
    files = StoreBackend(store=store, namespace=lambda runtime: (owner, "filesystem"))
    assert files.write("/notes.md", "line one\nline two\n").error is None
    read = files.read("/notes.md")
    assert read.file_data["content"] == "line one\nline two\n" and read.file_data["encoding"] == "utf-8"
    item = store.get((owner, "filesystem"), "/notes.md")
    assert set(item.value) >= {"content", "encoding", "created_at", "modified_at"}
    assert files.edit("/notes.md", "two", "2").occurrences == 1
    assert files.read("/notes.md").file_data["content"] == "line one\nline 2\n"


@pytest.mark.slow
def test_the_memory_files_example_runs_against_the_server(server):
    from support import ROOT, run_example

    done = run_example(ROOT / "examples" / "memory_files.py", env={"AMPKIT_URL": server.base_url})
    assert done.returncode == 0, done.stderr
    assert "awaits a person's approval" in done.stdout
    assert "session 2 starts with the approved instruction: True" in done.stdout
    assert "approved by human:ann" in done.stdout
