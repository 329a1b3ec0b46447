"""Importers from peers: each turns a peer's own data into ampkit export lines, which then go
through the one import path (`ampkit.portable.import_lines`: validated, one transaction,
idempotent). The mappings are documented in docs/time-travel.md#importers.

Ids: a peer record becomes a cell whose id is derived from the peer's own id (and its
creation time, so ids still sort by age): importing the same peer data twice yields the same
cells, and the second import changes nothing. The peer's id is kept in
`provenance.source_ref` (`mem0:<id>`, `letta:<agent>/<label>`, `langgraph:<ns>/<key>`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import TypeAdapter, ValidationError
from ulid import ULID

from .models import AMP_VERSION, MemoryCell, UtcDatetime, is_cell_id
from .portable import FORMAT, FORMAT_VERSION, dumps

FORMATS = ("ampkit", "amp", "mem0", "letta", "langgraph")
_TIME = TypeAdapter(UtcDatetime)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ImporterError(ValueError):
    """The peer data cannot be read or mapped; the message says which record and why."""


def _time(value: Any, default: Optional[datetime] = None) -> datetime:
    if value in (None, ""):
        if default is None:
            raise ValueError("a timestamp is required")
        return default
    return _TIME.validate_python(value)


def derived_id(source: str, key: str, created_at: datetime) -> str:
    """A cell id for a peer record: ULID time = its creation (ms), randomness = a hash of
    (source, key). Deterministic, so re-importing finds the same cell."""
    ms = max(0, int(created_at.timestamp() * 1000))
    digest = hashlib.sha256(f"{source}\0{key}".encode()).digest()[:10]
    return f"mem_{ULID(ms.to_bytes(6, 'big') + digest)}"


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class _Builder:
    """Collects mapped cells and their history, then writes them as export lines."""

    def __init__(self) -> None:
        self.cells: dict[str, dict[str, Any]] = {}
        self.history: dict[str, list[dict[str, Any]]] = {}

    def add(self, cell: dict[str, Any], history: list[dict[str, Any]], where: str) -> None:
        try:
            model = MemoryCell.model_validate(cell)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ImporterError(f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        if model.id in self.cells:
            raise ImporterError(f"{where}: the same record appears twice ({model.id})")
        self.cells[model.id] = model.model_dump(mode="json")
        self.history[model.id] = history

    def lines(self) -> list[str]:
        out = [dumps({"kind": "header", "format": FORMAT, "format_version": FORMAT_VERSION,
                      "amp_version": AMP_VERSION, "owner_id": None})]
        for cid in sorted(self.cells):
            out.append(dumps({"kind": "cell", "cursor": f"cell:{cid}", "cell": self.cells[cid]}))
        for cid in sorted(self.history):
            for n, entry in enumerate(self.history[cid], start=1):
                out.append(dumps({"kind": "history", "cursor": f"history:{cid}:{n}", "cell_id": cid, "n": n, **entry}))
        for cid in sorted(self.cells):
            new_id = self.cells[cid]["lifecycle"].get("superseded_by")
            if new_id:
                out.append(dumps({"kind": "supersession", "cursor": f"link:{cid}", "old_id": cid, "new_id": new_id}))
        out.append(dumps({"kind": "end"}))
        return [line + "\n" for line in out]


def _entry(at: datetime, actor: str, action: str, changes: dict[str, Any]) -> dict[str, Any]:
    return {"at": _iso(at), "actor": actor, "action": action, "changes": changes}


def _cell(cid: str, type_: str, text: str, metadata: dict[str, Any], owner_id: str, owner_type: str,
          created_by: str, created_at: datetime, updated_at: datetime, version: int, *,
          session_id: Optional[str] = None, provenance: Optional[dict[str, Any]] = None,
          access_policy: Optional[dict[str, Any]] = None, expires_at: Optional[datetime] = None) -> dict[str, Any]:
    return {
        "amp_version": AMP_VERSION, "id": cid, "type": type_,
        "content": {"text": text, "metadata": metadata},
        "identity": {"owner_id": owner_id, "owner_type": owner_type, "created_by": created_by, "session_id": session_id},
        "lifecycle": {"created_at": _iso(created_at), "last_updated_at": _iso(updated_at),
                      "expires_at": _iso(expires_at) if expires_at else None, "status": "active", "version": version},
        "access_policy": access_policy or {},
        "provenance": provenance or {},
    }


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


# ------------------------------------------------------------------ mem0
def from_mem0(data: Any, *, owner_id: Optional[str] = None, agent_id: Optional[str] = None) -> list[str]:
    """mem0 `Memory.get_all(...)` output (`{"results": [...]}` or the bare list), optionally
    with `"history": [rows of Memory.history(id)]` alongside `results`."""
    results = data.get("results") if isinstance(data, dict) else data
    rows = data.get("history", []) if isinstance(data, dict) else []
    if not isinstance(results, list) or not isinstance(rows, list):
        raise ImporterError("mem0: expected {\"results\": [...], \"history\": [...]} (get_all output)")
    by_memory: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if isinstance(row, dict) and row.get("memory_id"):
            by_memory.setdefault(str(row["memory_id"]), []).append(row)
    out = _Builder()
    for i, item in enumerate(results):
        where = f"mem0 results[{i}]"
        try:
            if not isinstance(item, dict) or not item.get("id") or not item.get("memory"):
                raise ValueError("each result needs an id and a memory")
            created = _time(item.get("created_at"))
            updated = _time(item.get("updated_at"), created)
            extra = dict(item.get("metadata") or {})
            memory_type = extra.get("memory_type")
            owner = owner_id or item.get("user_id") or item.get("agent_id")
            if not owner:
                raise ValueError("no user_id or agent_id (pass --owner)")
            author = item.get("agent_id") or item.get("actor_id") or agent_id or "import:mem0"
            history = sorted(by_memory.get(str(item["id"]), []),
                             key=lambda r: _time(r.get("updated_at") or r.get("created_at"), EPOCH))
            entries = [_entry(created, author, "create", {"type": "x", "owner_id": owner})]
            for row in history:
                if row.get("event") == "UPDATE":
                    at = _time(row.get("updated_at") or row.get("created_at"), created)
                    entries.append(_entry(at, row.get("actor_id") or author, "update",
                                          {"content.text": [row.get("old_memory"), row.get("new_memory")]}))
        except (ValueError, ValidationError) as exc:
            raise ImporterError(f"{where}: {exc}") from None
        cid = derived_id("mem0", str(item["id"]), created)
        type_ = "procedural" if memory_type == "procedural_memory" else "semantic"
        entries[0]["changes"]["type"] = type_
        mem0_fields = _drop_none({"id": item["id"], "hash": item.get("hash"), "run_id": item.get("run_id"),
                                  "actor_id": item.get("actor_id"), "role": item.get("role")})
        cell = _cell(cid, type_, item["memory"], {**extra, "mem0": mem0_fields},
                     owner, "user" if item.get("user_id") and not owner_id else "agent", author, created, updated,
                     len(entries), session_id=item.get("run_id"),
                     provenance={"source_type": "conversation", "source_ref": f"mem0:{item['id']}",
                                 "extraction_method": "llm_extraction"},
                     expires_at=_time(item["expiration_date"]) if item.get("expiration_date") else None)
        out.add(cell, entries, where)
    return out.lines()


# ------------------------------------------------------------------ Letta
LETTA_SUPPORTED = ("supported: the agent files of Letta 0.6.x (one agent, blocks in a top-level \"core_memory\" "
                   "list) and of later versions (top-level \"agents\" and \"blocks\" lists)")


def _letta_single_agent(agent: dict[str, Any]) -> dict[str, Any]:
    """An older (Letta 0.6.x) agent file, one agent whose blocks are inline in `core_memory`,
    in the shape of the newer files (`agents` naming their `block_ids`, `blocks`), so that both
    map the same way."""
    name = agent.get("name") or agent.get("id") or "letta-agent"
    blocks = []
    for i, block in enumerate(agent["core_memory"]):
        if not isinstance(block, dict):
            raise ImporterError(f"letta: core_memory[{i}] is not a block object; {LETTA_SUPPORTED}")
        blocks.append({**block, "id": str(block.get("id") or f"{name}/core_memory/{i}"),
                       "metadata": block.get("metadata") or block.get("metadata_")})
    return {"created_at": agent.get("updated_at") or agent.get("created_at"), "blocks": blocks,
            "agents": [{"name": name, "id": agent.get("id"), "block_ids": [b["id"] for b in blocks],
                        "passages": agent.get("passages") or []}]}


def from_letta(data: Any, *, owner_id: Optional[str] = None, agent_id: Optional[str] = None) -> list[str]:
    """A Letta agent file (`.af`): its core-memory blocks, and archival passages where the
    file carries them (`passages` at the top level or in an agent)."""
    if isinstance(data, dict) and isinstance(data.get("core_memory"), list) and "agents" not in data:
        data = _letta_single_agent(data)
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise ImporterError(f"letta: not an agent file this importer reads; {LETTA_SUPPORTED}")
    exported = _time(data.get("created_at"), datetime.now(timezone.utc))
    blocks = {str(b.get("id")): b for b in data.get("blocks", []) if isinstance(b, dict)}
    users: dict[str, list[str]] = {}  # block id -> names of the agents that attach it
    for agent in data["agents"]:
        for bid in agent.get("block_ids") or []:
            users.setdefault(bid, []).append(agent.get("name") or agent.get("id") or "letta-agent")
    out = _Builder()
    for bid, block in blocks.items():
        names = users.get(bid) or ["letta"]
        value = block.get("value") or ""
        if not value.strip():
            continue  # an empty block holds no memory (AMP text may not be empty)
        owner = owner_id or names[0]
        label = block.get("label") or str(bid)
        read_only = bool(block.get("read_only"))
        cid = derived_id("letta", f"{names[0]}/{label}", exported)
        others = [n for n in names[1:] if n != owner]
        policy = {"readable_by": others, "writable_by": [] if read_only else others}
        meta = {"letta": _drop_none({"label": label, "description": block.get("description"), "limit": block.get("limit"),
                                     "read_only": read_only, "agents": names, "metadata": block.get("metadata") or None})}
        type_ = "procedural" if label == "persona" else "semantic"
        author = agent_id or names[0]
        cell = _cell(cid, type_, value, meta, owner, "agent", author, exported, exported, 1,
                     provenance={"source_ref": f"letta:{names[0]}/{label}"}, access_policy=policy)
        out.add(cell, [_entry(exported, author, "create", {"type": type_, "owner_id": owner})], f"letta block {label!r}")
    passages = list(data.get("passages") or [])
    for agent in data["agents"]:
        passages += [{**p, "_agent": agent.get("name")} for p in agent.get("passages") or []]
    for i, passage in enumerate(passages):
        text = passage.get("text") or ""
        if not text.strip():
            continue
        agent_name = passage.get("_agent") or (data["agents"][0].get("name") if data["agents"] else None) or "letta"
        owner = owner_id or agent_name
        created = _time(passage.get("created_at"), exported)
        key = str(passage.get("id") or f"{agent_name}/passage/{i}")
        cid = derived_id("letta-passage", key, created)
        meta = {"letta": _drop_none({"passage_id": passage.get("id"), "archival": True,
                                     "metadata": passage.get("metadata") or passage.get("metadata_") or None})}
        source_type = "document" if passage.get("file_id") or passage.get("source_id") else None
        author = agent_id or agent_name
        cell = _cell(cid, "semantic", text, meta, owner, "agent", author, created, created, 1,
                     provenance=_drop_none({"source_type": source_type, "source_ref": f"letta:{key}"}))
        out.add(cell, [_entry(created, author, "create", {"type": "semantic", "owner_id": owner})], f"letta passages[{i}]")
    return out.lines()


# ------------------------------------------------------------------ LangGraph / LangMem
def _langgraph_text(value: Any) -> tuple[str, Optional[str]]:
    """(text, kind) of a store value: LangMem `{"content": str}` or `{"kind", "content": {...}}`,
    DeepAgents files `{"content": str | [lines]}`, anything else as compact JSON."""
    if isinstance(value, dict):
        content = value.get("content", value)
        kind = value.get("kind") if isinstance(value.get("kind"), str) else None
        if isinstance(content, str):
            return content, kind
        if isinstance(content, list) and all(isinstance(x, str) for x in content):
            return "\n".join(content), kind
        return json.dumps(content, ensure_ascii=False, sort_keys=True), kind
    return json.dumps(value, ensure_ascii=False, sort_keys=True), None


def from_langgraph(data: Any, *, owner_id: Optional[str] = None, agent_id: Optional[str] = None) -> list[str]:
    """LangGraph store items as `Item.dict()` gives them (`namespace`, `key`, `value`,
    `created_at`, `updated_at`; `score` from a search is ignored): a JSON list, or `{"items": [...]}`."""
    items = data.get("items") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ImporterError("langgraph: expected a list of store items (Item.dict())")
    out = _Builder()
    for i, item in enumerate(items):
        where = f"langgraph items[{i}]"
        try:
            namespace = [str(p) for p in item["namespace"]]
            key = str(item["key"])
            created = _time(item.get("created_at"))
            updated = _time(item.get("updated_at"), created)
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ImporterError(f"{where}: needs namespace, key and created_at ({exc})") from None
        text, kind = _langgraph_text(item.get("value"))
        if not text.strip():
            continue
        owner = owner_id or (namespace[1] if len(namespace) >= 2 else namespace[0] if namespace else None)
        if not owner:
            raise ImporterError(f"{where}: an empty namespace names no owner (pass --owner)")
        lowered = (kind or "").lower()
        type_ = "episodic" if "episode" in lowered else (
            "procedural" if "procedur" in lowered or "instruction" in lowered else "semantic")
        ref = "/".join(namespace + [key])
        cid = derived_id("langgraph", ref, created)
        author = agent_id or "import:langgraph"
        meta = {"langgraph": {"namespace": namespace, "key": key, "value": item.get("value")}}
        cell = _cell(cid, type_, text, meta, owner, "user", author, created, updated, 1,
                     provenance=_drop_none({"source_ref": f"langgraph:{ref}",
                                            "extraction_method": "llm_extraction" if kind else None}))
        out.add(cell, [_entry(created, author, "create", {"type": type_, "owner_id": owner})], where)
    return out.lines()


# ------------------------------------------------------------------ AMP cells
def from_amp(data: Any, *, owner_id: Optional[str] = None, agent_id: Optional[str] = None) -> list[str]:
    """AMP v0.1 cell JSON: one cell, a list, `{"cells": [...]}` (ampkit's JSON export) or
    `{"results": [...]}` (an AMP list or search answer; search scores are dropped)."""
    cells = data.get("cells", data.get("results", data)) if isinstance(data, dict) else data
    if isinstance(cells, dict):
        cells = [cells]
    if not isinstance(cells, list):
        raise ImporterError("amp: expected a cell, a list of cells, or {\"cells\": [...]}")
    out = _Builder()
    for i, raw in enumerate(cells):
        where = f"amp cells[{i}]"
        if not isinstance(raw, dict):
            raise ImporterError(f"{where}: not an object")
        cell = {k: v for k, v in raw.items() if k not in ("score", "explain")}
        try:
            created = _time((cell.get("lifecycle") or {}).get("created_at"))
        except (ValueError, ValidationError) as exc:
            raise ImporterError(f"{where}: lifecycle.created_at: {exc}") from None
        if not is_cell_id(str(cell.get("id", ""))):
            cell["id"] = derived_id("amp", json.dumps(raw.get("id")), created)
        if owner_id:
            cell.setdefault("identity", {})["owner_id"] = owner_id
        identity = cell.get("identity") or {}
        author = identity.get("created_by") or agent_id or identity.get("owner_id") or "import:amp"
        type_ = cell.get("type", "semantic")
        out.add(cell, [_entry(created, author, "create", {"type": type_, "owner_id": identity.get("owner_id")})], where)
    return out.lines()


CONVERTERS: dict[str, Callable[..., list[str]]] = {
    "amp": from_amp, "mem0": from_mem0, "letta": from_letta, "langgraph": from_langgraph,
}


def detect_format(path: str) -> str:
    """Guess what a file is: `.ndjson`/`.jsonl` export, `.af` Letta agent file, or by shape."""
    suffix = Path(path).suffix.lower()
    if suffix in (".ndjson", ".jsonl"):
        return "ampkit"
    if suffix == ".af":
        return "letta"
    with open(path, encoding="utf-8") as fh:
        head = fh.readline()
    try:
        first = json.loads(head)
        if isinstance(first, dict) and first.get("kind") == "header":
            return "ampkit"
    except ValueError:
        pass
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ImporterError(f"{path}: not JSON ({exc}); name the format with --from") from None
    if isinstance(data, dict) and ("agents" in data or isinstance(data.get("core_memory"), list)):
        return "letta"
    items = data.get("results", data.get("items", data.get("cells"))) if isinstance(data, dict) else data
    sample = items[0] if isinstance(items, list) and items else items
    if isinstance(sample, dict):
        if "memory" in sample and "id" in sample:
            return "mem0"
        if "namespace" in sample and "key" in sample:
            return "langgraph"
        if "content" in sample and "identity" in sample:
            return "amp"
    raise ImporterError(f"{path}: cannot tell which format this is; name it with --from")


def to_export_lines(fmt: str, path: str, *, owner_id: Optional[str] = None, agent_id: Optional[str] = None) -> list[str]:
    """A peer's file as ampkit export lines (the whole file is read: peer exports are JSON documents)."""
    if fmt not in CONVERTERS:
        raise ImporterError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ImporterError(f"{path}: not JSON ({exc})") from None
    return CONVERTERS[fmt](data, owner_id=owner_id, agent_id=agent_id)
