"""Memory as files: a DeepAgents agent keeps its AGENTS.md in ampkit, a person approves its
edits, and the next session (a new agent instance) starts with the approved instruction.

    python examples/memory_files.py                 # a fresh SQLite file, in process
    AMPKIT_URL=http://127.0.0.1:8765/amp/v1 python examples/memory_files.py

The model is an offline fake that records its prompts (`examples/fakes/`); swap in a real
one and nothing else changes. Needs the `deepagents` extra
(`pip install -e '.[deepagents]'`). See docs/files.md.
"""

from __future__ import annotations

import os
import tempfile

from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend, StateBackend
from langchain_core.messages import AIMessage, HumanMessage

import ampkit
from ampkit.adapters.deepagents import AmpkitBackend
from fakes.langchain import LangChainFakeModel

URL = os.environ.get("AMPKIT_URL") or f"sqlite:///{tempfile.mkdtemp(prefix='ampkit-files-')}/memory.db"
AGENT = f"assistant-{os.getpid()}"  # the agent owns its memory folder


def session(user_says: str, replies: list) -> tuple[LangChainFakeModel, str]:
    """One session: a new agent instance whose /memories/ folder lives in ampkit."""
    model = LangChainFakeModel(replies)
    folder = AmpkitBackend(ampkit.connect(URL, agent_id=AGENT), owner_id=AGENT)
    agent = create_deep_agent(
        model=model,
        backend=CompositeBackend(default=StateBackend(), routes={"/memories/": folder}),
        memory=["/memories/AGENTS.md", "/memories/proposals.md"],
        skills=["/memories/skills/"],
    )
    messages = agent.invoke({"messages": [HumanMessage(user_says)]})["messages"]
    return model, messages[-2].content if len(messages) > 2 else ""


def main() -> None:
    person = ampkit.connect(URL, agent_id="human:ann")  # with auth on: a key with the approve scope
    # The folder is set up in yolo mode for a moment, so the agent's own seed lands directly
    # (a new file from anyone else, the person included, would be a proposal).
    person.set_approval_mode(AGENT, "yolo")
    ampkit.connect(URL, agent_id=AGENT).write_file("AGENTS.md", "# How to answer\n- write in paragraphs\n",
                                                   owner_id=AGENT, readable_by=["human:ann"])
    person.set_approval_mode(AGENT, "review")

    # Session 1: the user corrects the agent; it proposes an edit of its instructions.
    edit = AIMessage("", tool_calls=[{"name": "edit_file", "id": "call-1", "args": {
        "file_path": "/memories/AGENTS.md", "old_string": "- write in paragraphs", "new_string": "- use bullet points"}}])
    _, told = session("Use bullet points from now on, please.", [edit, "Noted: I asked to update my instructions."])
    print(f"session 1, the tool answered: {told}")

    # A person reviews the diff and approves it (the same as `ampkit proposals approve ID`).
    (pending,) = person.list_proposals(owner_id=AGENT, status="pending")
    print(f"proposal {pending.id} by {pending.proposed_by}:\n{pending.diff}")
    person.approve_proposal(pending.id, message="good call")

    # Session 2: a new agent instance starts with the approved instruction in its context.
    model, _ = session("Summarise today's meeting.", ["- decision one\n- decision two"])
    print("session 2 starts with the approved instruction:", "use bullet points" in model.prompts[0])
    for version in person.file_history("AGENTS.md", owner_id=AGENT).results:
        print(f"version {version.version}: written by {version.actor}, approved by {version.approved_by}")


if __name__ == "__main__":
    main()
