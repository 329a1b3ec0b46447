"""AutoGen 0.7 adapter: `AssistantAgent(memory=[...])` runs with a replaying fake model client,
over HTTP against a real server and in process on SQLite."""

from __future__ import annotations

import pytest

import json

from autogen_agentchat.agents import AssistantAgent
from autogen_core.memory import MemoryContent, MemoryMimeType

from adapter_support import backend, unique  # noqa: F401  (fixture)
from ampkit.adapters import Sharing
from ampkit.adapters.autogen import AmpkitAutoGenMemory
from fakes.autogen import AutoGenFakeModel


async def test_agent_turn_sees_shared_memory_and_add_stores_it(backend):
    user = unique("user")
    agent_id = unique("ag-agent")
    memory = AmpkitAutoGenMemory(backend.aconnect(agent_id), owner_id=user, sharing=Sharing(readable_by=["lc-*"]))
    await memory.add(MemoryContent(content="Ada prefers green tea", mime_type=MemoryMimeType.TEXT,
                                   metadata={"topic": "drinks"}))
    model = AutoGenFakeModel("Green tea it is.")
    agent = AssistantAgent("assistant", model_client=model, memory=[memory])

    result = await agent.run(task="Which tea should I order for Ada?")

    assert "Ada prefers green tea" in model.prompts[0]
    assert [type(m).__name__ for m in result.messages] == ["TextMessage", "MemoryQueryEvent", "TextMessage"]
    (cell,) = backend.cells(user)
    assert cell.content.text == "Ada prefers green tea" and cell.identity.created_by == agent_id
    assert cell.content.metadata["topic"] == "drinks" and cell.access_policy.readable_by == ["lc-*"]
    await memory.close()


async def test_update_context_injects_only_what_clears_min_score_and_query_keeps_every_hit(backend):
    """Issue 43: the automatic path (update_context) abstains below `min_score`, adding no
    system message at all; an explicit `query` is the caller's search and returns every hit."""
    user = unique("user")
    writer = backend.connect(unique("lc-agent"))
    writer.remember("the office plants are watered on Fridays", owner_id=user, readable_by=["ag-*"])
    memory = AmpkitAutoGenMemory(backend.aconnect(unique("ag-agent")), owner_id=user, min_score=0.05)

    async def prompt() -> str:
        model = AutoGenFakeModel("ok")
        await AssistantAgent("assistant", model_client=model, memory=[memory]).run(task="Which tea should I order for Ada?")
        return model.prompts[0]

    assert "plants" not in await prompt() and "Relevant shared memory" not in await prompt()
    assert [r.content for r in (await memory.query("tea for Ada")).results] == ["the office plants are watered on Fridays"]
    writer.remember("Ada drinks her tea without sugar", owner_id=user, readable_by=["ag-*"])
    seen = await prompt()
    assert "without sugar" in seen and "plants" not in seen
    loaded = AmpkitAutoGenMemory.load_component(memory.dump_component())
    assert loaded.dump_component().config["min_score"] == 0.05
    await loaded.close()
    await memory.close()


async def test_query_json_content_and_clear_only_own_cells(backend):
    user = unique("user")
    memory = AmpkitAutoGenMemory(backend.connect(unique("ag-agent")), owner_id=user, name="notes")
    await memory.add(MemoryContent(content={"drink": "tea", "who": "Ada"}, mime_type=MemoryMimeType.JSON))
    backend.connect(user).remember("user's own tea note", owner_id=user)
    found = await memory.query("tea")  # the user's note is not shared with this agent
    assert [r.content for r in found.results] == [{"drink": "tea", "who": "Ada"}]

    colleague = AmpkitAutoGenMemory(backend.connect(unique("ag-agent")), owner_id=user, name="notes",
                             sharing=Sharing(readable_by=["ag-*"], writable_by=["ag-*"]))
    await colleague.add(MemoryContent(content="colleague's tea note", mime_type="text/plain"))
    await memory.clear()  # same name, and it may write the colleague's cell: still only its own goes
    assert sorted(backend.texts(user)) == ["colleague's tea note", "user's own tea note"]
    await memory.close()


async def test_content_comes_back_with_its_mime_type_and_metadata(backend):
    user = unique("user")
    memory = AmpkitAutoGenMemory(backend.connect(unique("ag-agent")), owner_id=user)
    added = [MemoryContent(content={"drink": "tea", "sugar": 0}, mime_type=MemoryMimeType.JSON, metadata={"topic": "a"}),
             MemoryContent(content="# tea\n- green", mime_type=MemoryMimeType.MARKDOWN),
             MemoryContent(content="plain tea note", mime_type=MemoryMimeType.TEXT)]
    for content in added:
        await memory.add(content)
    found = {json.dumps(r.content, sort_keys=True): r for r in (await memory.query("tea")).results}
    for content in added:
        hit = found[json.dumps(content.content, sort_keys=True)]
        assert (hit.content, hit.mime_type) == (content.content, content.mime_type)
        assert {k: hit.metadata[k] for k in content.metadata or {}} == (content.metadata or {})
    assert "autogen_mime_type" not in found['"plain tea note"'].metadata
    await memory.close()


async def test_component_config_round_trips(backend):
    user = unique("user")
    memory = AmpkitAutoGenMemory(backend.connect(unique("ag-agent")), owner_id=user, name="team", k=3,
                          sharing=Sharing(readable_by=["team-*"], public=False))
    model = memory.dump_component()
    assert model.provider == "ampkit.adapters.autogen.AmpkitAutoGenMemory"
    loaded = AmpkitAutoGenMemory.load_component(model)
    assert loaded.dump_component() == model

    await loaded.add(MemoryContent(content="written by the reloaded memory", mime_type="text/plain"))
    (cell,) = backend.cells(user)
    assert cell.access_policy.readable_by == ["team-*"]
    assert cell.content.metadata["ampkit_scope"] == "autogen:team"
    await loaded.close()


def test_the_old_class_name_still_works_with_a_deprecation_warning():
    import ampkit.adapters.autogen as ag

    with pytest.warns(DeprecationWarning, match="AmpkitAutoGenMemory"):
        assert ag.AmpkitMemory is AmpkitAutoGenMemory


def test_the_autogen_example_puts_memory_in_the_prompt(tmp_path):
    """examples/autogen_agent.py as a person runs it (in this process: support.run_example)."""
    from support import ROOT, run_example

    done = run_example(ROOT / "examples" / "autogen_agent.py", env={"AMPKIT_URL": f"sqlite:///{tmp_path}/memory.db"})
    assert done.returncode == 0, done.stderr
    assert "'- Ada is vegetarian'" in done.stdout.split("the model saw:", 1)[1].splitlines()[0]
    assert "answer: A vegetarian place, then." in done.stdout
    assert "'owner_id': 'ada'" in done.stdout.split("component config:", 1)[1]
