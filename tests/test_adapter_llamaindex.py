"""LlamaIndex adapters: `FunctionAgent` runs with a fake function-calling LLM, memory as a
run argument, over HTTP against a real server and in process on SQLite."""

from __future__ import annotations

import pytest

import ampkit
from adapter_support import backend, deferred, unique  # noqa: F401  (fixture)
from ampkit.adapters import Sharing

# Imported when first used (see adapter_support.Deferred): LlamaIndex takes ~1.6 s to import.
FunctionAgent = deferred("llama_index.core.agent.workflow", "FunctionAgent")
ChatMessage = deferred("llama_index.core.base.llms.types", "ChatMessage")
Memory = deferred("llama_index.core.memory", "Memory")
LlamaIndexFakeLLM = deferred("fakes.llamaindex", "LlamaIndexFakeLLM")
AmpkitLlamaIndexMemory, AmpkitMemoryBlock = deferred("ampkit.adapters.llamaindex", "AmpkitLlamaIndexMemory", "AmpkitMemoryBlock")


def agent_with(llm: LlamaIndexFakeLLM) -> FunctionAgent:
    return FunctionAgent(name="assistant", description="helps Ada", llm=llm, tools=[], system_prompt="You are terse.")


async def test_memory_keeps_the_session_and_brings_shared_facts_into_the_prompt(backend):
    user, session = unique("user"), unique("session")
    backend.connect(unique("crew-agent")).remember("Ada's favourite colour is teal", owner_id=user,
                                                    readable_by=["li-*"])
    memory = AmpkitLlamaIndexMemory.from_defaults(client=backend.aconnect(unique("li-agent")), owner_id=user, session_id=session)

    llm = LlamaIndexFakeLLM(answer="Teal, noted.")
    await agent_with(llm).run(user_msg="Paint it in my favourite colour", memory=memory)
    await agent_with(llm).run(user_msg="And what did I ask before?", memory=memory)

    assert "Ada's favourite colour is teal" in llm.prompts[0]
    assert "Paint it in my favourite colour" in llm.prompts[1] and "Teal, noted." in llm.prompts[1]
    chat = backend.cells(user, session_id=session)
    assert [c.content.text for c in chat] == ["Paint it in my favourite colour", "Teal, noted.",
                                              "And what did I ask before?", "Teal, noted."]
    assert {c.type for c in chat} == {"episodic"}
    assert [m.content for m in await memory.aget_all()][:2] == ["Paint it in my favourite colour", "Teal, noted."]


async def test_memory_sync_side_and_reset_forget_only_its_own_session(backend):
    user, session = unique("user"), unique("session")
    memory = AmpkitLlamaIndexMemory(client=backend.connect(unique("li-agent")), owner_id=user, session_id=session)
    memory.put(ChatMessage(role="user", content="first"))
    memory.set([ChatMessage(role="user", content="replaced"), ChatMessage(role="assistant", content="ok")])
    assert [m.content for m in memory.get_all()] == ["replaced", "ok"]
    AmpkitLlamaIndexMemory(client=backend.connect(unique("li-agent")), owner_id=user, session_id=unique("other")).put(
        ChatMessage(role="user", content="another session"))
    backend.connect(user).remember("user's own note", owner_id=user)

    await memory.areset()
    assert memory.get_all() == []
    assert sorted(backend.texts(user)) == ["another session", "user's own note"]


async def test_memory_block_inside_llamaindex_memory(backend):
    user = unique("user")
    writer = backend.connect(unique("lc-agent"))
    writer.remember("the user prefers bullet-point summaries", owner_id=user, readable_by=["li-*"])
    block = AmpkitMemoryBlock(client=backend.connect(unique("li-agent")), owner_id=user,
                              sharing=Sharing(readable_by=["lc-*"]))
    # A tiny token budget so that Memory flushes old turns into the block.
    memory = Memory.from_defaults(session_id=unique("s"), token_limit=60, chat_history_token_ratio=0.5,
                                  token_flush_size=10, memory_blocks=[block])
    llm = LlamaIndexFakeLLM(answer="Sure, in bullets as you prefer, here is a long enough answer to overflow.")
    for question in ("Write summaries of the report please", "And the summaries of the minutes too",
                     "Finally the summaries of the budget"):
        await agent_with(llm).run(user_msg=question, memory=memory)

    assert "<shared_memory>" in llm.prompts[0] and "the user prefers bullet-point summaries" in llm.prompts[0]
    flushed = [c for c in backend.cells(user, types=["episodic"])]
    assert flushed, "Memory flushed old turns into the block"
    assert all(c.content.metadata["ampkit_framework"] == "llamaindex" for c in flushed)
    assert flushed[0].access_policy.readable_by == ["lc-*"]


async def test_block_and_memory_inject_only_what_clears_min_score_and_nothing_else(backend):
    """Issue 43: below the threshold (DEFAULT_MIN_SCORE) the block is empty (Memory then
    renders no `<shared_memory>` section) and the full memory adds no system message."""
    user = unique("user")
    writer = backend.connect(unique("lc-agent"))
    writer.remember("the office plants are watered on Fridays", owner_id=user, readable_by=["li-*"])
    block = AmpkitMemoryBlock(client=backend.connect(unique("li-agent")), owner_id=user)
    full = AmpkitLlamaIndexMemory.from_defaults(client=backend.aconnect(unique("li-agent")), owner_id=user,
                                                session_id=unique("s"))

    async def prompts() -> tuple[str, str]:
        memory = Memory.from_defaults(session_id=unique("s"), memory_blocks=[block])
        in_block, in_full = LlamaIndexFakeLLM(answer="ok"), LlamaIndexFakeLLM(answer="ok")
        await agent_with(in_block).run(user_msg="Write summaries of the report please", memory=memory)
        await agent_with(in_full).run(user_msg="Write summaries of the report please", memory=full)
        return in_block.prompts[0], in_full.prompts[0]

    for prompt in await prompts():
        assert "plants" not in prompt and "<shared_memory>" not in prompt and "Relevant shared memory" not in prompt
    writer.remember("the user wants report summaries short", owner_id=user, readable_by=["li-*"])
    with_block, with_full = await prompts()
    assert "<shared_memory>" in with_block and "report summaries short" in with_block and "plants" not in with_block
    assert "report summaries short" in with_full and "plants" not in with_full


async def test_a_memory_url_store_serves_the_async_agent_through_its_one_sync_client():
    # memory:// lives inside one client: the adapter must not open a second (empty) store.
    client = ampkit.connect("memory://", agent_id="li-agent")
    client.remember("Ada's desk is 4B", owner_id="ada", readable_by=["li-*"])
    memory = AmpkitLlamaIndexMemory(client=client, owner_id="ada", session_id="s")
    llm = LlamaIndexFakeLLM("Desk 4B.")
    await agent_with(llm).run(user_msg="Where is my desk?", memory=memory)
    assert "Ada's desk is 4B" in llm.prompts[0]
    assert [m.content for m in memory.get_all()] == ["Where is my desk?", "Desk 4B."]
    client.close()


def test_the_old_class_name_still_works_with_a_deprecation_warning():
    import ampkit.adapters.llamaindex as li

    with pytest.warns(DeprecationWarning, match="AmpkitLlamaIndexMemory"):
        assert li.AmpkitMemory is li.AmpkitLlamaIndexMemory


def test_the_llamaindex_example_recalls_into_the_prompt_as_memory_and_as_a_block(tmp_path):
    """examples/llamaindex_agent.py as a person runs it (in this process: support.run_example)."""
    from support import ROOT, run_example

    done = run_example(ROOT / "examples" / "llamaindex_agent.py", env={"AMPKIT_URL": f"sqlite:///{tmp_path}/memory.db"})
    assert done.returncode == 0, done.stderr
    assert "the model saw: ['Relevant shared memory:', '- Ada works in the Lisbon office'" in done.stdout
    assert "session history: ['Book a desk in my office', 'Lisbon, noted.']" in done.stdout
    assert "with a block, the model saw: ['- Ada works in the Lisbon office']" in done.stdout
