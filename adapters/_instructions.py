"""The agent's instructions from its memory folder (docs/files.md): `AGENTS.md` and an index
of its skills (name and description, as Agent Skills harnesses list them), rendered once for
every framework adapter, so agents in LangChain, LlamaIndex, CrewAI and AutoGen read one
instruction file. Written as a plan (`_mapping.call`), run on a sync or an async client."""

from __future__ import annotations

from typing import Any, Optional

from ampkit.errors import AccessDenied
from ampkit.files import AGENTS_MD, frontmatter

from ._mapping import call, run_async, run_sync

SKILLS_GLOB = "skills/*/SKILL.md"


def instructions_plan(owner_id: str):
    """Plan: the rendered block, or "" when the folder has neither AGENTS.md nor skills."""
    parts = []
    try:
        agents = yield call("read_file", AGENTS_MD, owner_id=owner_id)
        if agents.content.strip():
            parts.append(f"<agent_instructions source=\"{AGENTS_MD}\">\n{agents.content.rstrip()}\n</agent_instructions>")
    except AccessDenied:  # no AGENTS.md (or not readable by this agent)
        pass
    listed = yield call("list_files", owner_id, glob=SKILLS_GLOB)
    lines = []
    for info in listed.results:
        skill = yield call("read_file", info.path, owner_id=owner_id, limit=50)
        meta = frontmatter(skill.content) or {}
        lines.append(f"- {meta.get('name', info.path)}: {meta.get('description', '')} (read {info.path})")
    if lines:
        parts.append("<skills>\nSkills you can use; read a skill's file before following it.\n" + "\n".join(lines)
                     + "\n</skills>")
    return "\n\n".join(parts)


def instructions(client: Any, owner_id: str) -> str:
    return run_sync(client, instructions_plan(owner_id))


async def ainstructions(client: Any, owner_id: str) -> str:
    return await run_async(client, instructions_plan(owner_id))


def with_instructions(system: Optional[str], block: str) -> str:
    """`block` ahead of an existing system text (instructions first: they frame the rest)."""
    if not block:
        return system or ""
    return f"{block}\n\n{system}" if system else block
