"""Moving memory in and out without loss: the NDJSON export format, streamed, and import.

An export is one JSON object per line (spec/SPEC.md, extension `ndjson_export`):

    {"kind":"header","format":"ampkit-export","format_version":1,"amp_version":"0.1.0","owner_id":null}
    {"kind":"cell","cursor":"cell:mem_…","cell":{…the whole cell…}}            every cell, by id
    {"kind":"history","cursor":"history:mem_…:1","cell_id":"mem_…","n":1,"at":…,"actor":…,"action":…,"changes":{…}}
    {"kind":"supersession","cursor":"link:mem_…","old_id":"mem_…","new_id":"mem_…"}
    {"kind":"folder","cursor":"folder:alice","owner_id":"alice","approval_mode":"review","updated_at":…,"updated_by":…}
    {"kind":"proposal","cursor":"proposal:prop_…","proposal":{…the whole proposal…}}
    {"kind":"end"}

Cells come in id order, then history by (cell id, order within the cell; `n` counts from 1),
then one supersession link per replaced cell, then the memory folders' settings (approval
modes, by owner) and the proposed file changes (pending and decided, by id): the human
approval state of memory files travels with the memory. Nothing in a line depends on the store that
wrote it (no sequence numbers, no export time), so exporting the same memory from SQLite
and from PostgreSQL gives the same bytes. Every line but the header and the end carries a
`cursor`: passing the last one received resumes the export right after that line, so an
interrupted download continues where it stopped. The export is produced page by page
(`PAGE` rows at a time), so its memory does not grow with the store.

Import validates every line first (JSON, the line's model, the order of sections, history
numbering, links matching the cells) and reports each problem with its line number; then it
writes everything in one transaction, checking each cell against what the store already
holds. A cell already there unchanged (ignoring its access count and last access, which
reads move) is skipped, so importing a file twice changes nothing; a cell there with other
content is a conflict, and then nothing is written. Vectors are computed on import with the
configured embedder, as `ampkit copy` does.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Optional, Union

from pydantic import Field, ValidationError

from .errors import Conflict, MalformedRequest, PayloadTooLarge, ValidationFailed
from .limits import Limits
from .models import AMP_VERSION, CellId, Closed, IdString, ImportReport, MemoryCell, StorableStr, UtcDatetime, check_cell_size
from .retrieval import Retriever
from .store.base import CellFilter, FolderRecord, HistoryEntry, HistoryRecord, ProposalRecord, Store

FORMAT = "ampkit-export"
FORMAT_VERSION = 1
MEDIA_TYPE = "application/x-ndjson"
PAGE = 500  # rows per store query while exporting
ALL_STATUSES = ("active", "stale", "archived", "deleted")
MAX_REPORTED_ERRORS = 100


# ------------------------------------------------------------------ the line models
class HeaderLine(Closed):
    kind: Literal["header"]
    format: Literal["ampkit-export"]
    format_version: Literal[1]
    amp_version: str
    owner_id: Optional[str] = None


class CellLine(Closed):
    kind: Literal["cell"]
    cursor: Optional[str] = None
    cell: MemoryCell


class HistoryLine(Closed):
    kind: Literal["history"]
    cursor: Optional[str] = None
    cell_id: CellId
    n: int = Field(ge=1)
    at: UtcDatetime
    actor: str = Field(min_length=1)
    action: str = Field(min_length=1)
    changes: dict[str, Any] = Field(default_factory=dict)


class SupersessionLine(Closed):
    kind: Literal["supersession"]
    cursor: Optional[str] = None
    old_id: CellId
    new_id: CellId


class FolderLine(Closed):
    """An owner's memory folder settings (docs/files.md: approval modes)."""

    kind: Literal["folder"]
    cursor: Optional[str] = None
    owner_id: IdString
    approval_mode: Literal["review", "yolo"]
    updated_at: UtcDatetime
    updated_by: IdString

    def record(self) -> FolderRecord:
        return FolderRecord(self.owner_id, self.approval_mode, self.updated_at, self.updated_by)


class ExportedProposal(Closed):
    """A proposed change to a memory file, whole (store/_files.py `ProposalRecord`)."""

    id: str = Field(pattern=r"^prop_[0-9A-HJKMNP-TV-Z]{26}$")  # files.service.new_proposal_id
    owner_id: IdString
    path: StorableStr
    action: Literal["write", "delete"]
    cell_id: Optional[CellId] = None
    base_version: Optional[int] = Field(default=None, ge=1)
    content: Optional[StorableStr] = None
    diff: StorableStr
    reason: Optional[StorableStr] = None
    access_policy: Optional[dict[str, Any]] = None
    proposed_by: IdString
    created_at: UtcDatetime
    status: Literal["pending", "approved", "rejected"]
    decided_by: Optional[IdString] = None
    decided_at: Optional[UtcDatetime] = None
    message: Optional[StorableStr] = None
    result_version: Optional[int] = Field(default=None, ge=1)


class ProposalLine(Closed):
    kind: Literal["proposal"]
    cursor: Optional[str] = None
    proposal: ExportedProposal

    def record(self) -> ProposalRecord:
        return ProposalRecord(**self.proposal.model_dump())


class EndLine(Closed):
    kind: Literal["end"]


Line = Union[HeaderLine, CellLine, HistoryLine, SupersessionLine, FolderLine, ProposalLine, EndLine]
_SECTION = {"header": 0, "cell": 1, "history": 2, "supersession": 3, "folder": 4, "proposal": 5, "end": 6}
_LINE_MODELS: dict[str, type[Line]] = {
    "header": HeaderLine, "cell": CellLine, "history": HistoryLine, "supersession": SupersessionLine,
    "folder": FolderLine, "proposal": ProposalLine, "end": EndLine,
}


def dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# ------------------------------------------------------------------ export
def _parse_cursor(cursor: Optional[str]) -> tuple[int, tuple[str, ...]]:
    """cursor -> (section, key). Sections: 1 cells, 2 history, 3 links, 4 folders, 5 proposals."""
    if cursor is None:
        return 0, ()
    kind, _, rest = cursor.partition(":")
    try:
        if kind == "cell" and rest.startswith("mem_"):
            return 1, (rest,)
        if kind == "history":
            cell_id, _, n = rest.rpartition(":")
            if cell_id.startswith("mem_") and int(n) >= 1:
                return 2, (cell_id, n)
        if kind == "link" and rest.startswith("mem_"):
            return 3, (rest,)
        if kind == "folder" and rest:
            return 4, (rest,)
        if kind == "proposal" and rest:
            return 5, (rest,)
    except ValueError:
        pass
    raise ValidationFailed("invalid export cursor", {"cursor": cursor})


def _cells(store: Store, owner_id: Optional[str], after: Optional[str]) -> Iterator[MemoryCell]:
    flt = CellFilter(owner_id=owner_id, statuses=ALL_STATUSES, include_superseded=True)
    while True:
        page = store.list(flt, PAGE, after)
        if not page:
            return
        yield from page
        after = page[-1].id


def _history(store: Store, owner_id: Optional[str], after: Optional[tuple[str, int]]) -> Iterator[tuple[HistoryEntry, int]]:
    """(entry, its 1-based number within its cell), by cell id then order. With an owner,
    the history of that owner's cells; without, every entry (purged cells' who-and-when too)."""
    if owner_id is not None:
        start = None if after is None else after[0]
        skip = 0 if after is None else after[1]
        if after is not None:  # the resumed cell first, from its next entry
            for n, entry in enumerate(store.history(after[0]), start=1):
                if n > skip:
                    yield entry, n
        for cell in _cells(store, owner_id, start):
            for n, entry in enumerate(store.history(cell.id), start=1):
                yield entry, n
        return
    position: Optional[tuple[str, int]] = None
    current, n = None, 0
    if after is not None:  # translate (cell id, n) into the store's (cell id, seq)
        entries = store.history(after[0])
        if len(entries) >= after[1]:
            position = (after[0], entries[after[1] - 1].seq)
            current, n = after[0], after[1]
        else:
            position = (after[0], entries[-1].seq if entries else 0)
            current, n = after[0], len(entries)
    while True:
        page = store.history_scan(position, PAGE)
        if not page:
            return
        for entry in page:
            if entry.cell_id != current:
                current, n = entry.cell_id, 0
            n += 1
            yield entry, n
        position = (page[-1].cell_id, page[-1].seq)


def check_cursor(cursor: Optional[str]) -> None:
    """Raise ValidationFailed for a cursor no export line carries (before streaming starts)."""
    _parse_cursor(cursor)


def export_lines(store: Store, owner_id: Optional[str] = None, cursor: Optional[str] = None) -> Iterator[str]:
    """The export as lines (each ending in a newline), produced lazily page by page."""
    section, key = _parse_cursor(cursor)
    if section == 0:
        yield dumps({"kind": "header", "format": FORMAT, "format_version": FORMAT_VERSION,
                     "amp_version": AMP_VERSION, "owner_id": owner_id}) + "\n"
    if section <= 1:
        for cell in _cells(store, owner_id, key[0] if section == 1 else None):
            yield dumps({"kind": "cell", "cursor": f"cell:{cell.id}", "cell": cell.model_dump(mode="json")}) + "\n"
    if section <= 2:
        after = (key[0], int(key[1])) if section == 2 else None
        for entry, n in _history(store, owner_id, after):
            yield dumps({
                "kind": "history", "cursor": f"history:{entry.cell_id}:{n}", "cell_id": entry.cell_id, "n": n,
                "at": entry.model_dump(mode="json")["at"], "actor": entry.actor, "action": entry.action,
                "changes": entry.changes,
            }) + "\n"
    if section <= 3:
        for cell in _cells(store, owner_id, key[0] if section == 3 else None):
            if cell.lifecycle.superseded_by is not None:
                yield dumps({"kind": "supersession", "cursor": f"link:{cell.id}", "old_id": cell.id,
                             "new_id": cell.lifecycle.superseded_by}) + "\n"
    if section <= 4:
        # Sorted here: owner ids are any text, and a database's collation may order them otherwise.
        for folder in sorted(store.folders(owner_id), key=lambda f: f.owner_id):
            if section == 4 and folder.owner_id <= key[0]:
                continue
            folder_line = FolderLine(kind="folder", cursor=f"folder:{folder.owner_id}", owner_id=folder.owner_id,
                                     approval_mode=folder.approval_mode, updated_at=folder.updated_at,
                                     updated_by=folder.updated_by)
            yield dumps(folder_line.model_dump(mode="json")) + "\n"
    for page in store.proposal_pages(owner_id, key[0] if section == 5 else None, PAGE):
        for proposal in page:
            exported = ExportedProposal.model_validate(asdict(proposal)).model_dump(mode="json")
            yield dumps({"kind": "proposal", "cursor": f"proposal:{proposal.id}", "proposal": exported}) + "\n"
    yield dumps({"kind": "end"}) + "\n"


def in_chunks(lines: Iterable[str], size: int = 64 * 1024) -> Iterator[bytes]:
    """Lines joined into chunks of about `size` bytes: a streamed HTTP response then costs
    one thread hop per chunk instead of one per line."""
    buffer: list[str] = []
    held = 0
    for line in lines:
        buffer.append(line)
        held += len(line)
        if held >= size:
            yield "".join(buffer).encode("utf-8")
            buffer, held = [], 0
    if buffer:
        yield "".join(buffer).encode("utf-8")


def last_cursor(path: str) -> Optional[str]:
    """The cursor of the last complete line of a partial export file (for `--resume`); the
    file is cut after that line, so appending the resumed stream gives the whole export."""
    with open(path, "rb+") as fh:
        data_end = fh.seek(0, 2)
        chunk, pos = b"", data_end
        while pos > 0:  # read backwards until two newlines (the last complete line) are in hand
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step) + chunk
            if chunk.count(b"\n") >= 2 or pos == 0:
                break
        cut = chunk.rfind(b"\n")
        if cut < 0:
            fh.truncate(0)
            return None
        line = chunk[: cut].rsplit(b"\n", 1)[-1]
        record = json.loads(line)
        if record.get("kind") == "end":
            raise ValidationFailed("the export file is already complete")
        # Only the header so far: start again from nothing (a resumed stream has no header).
        fh.truncate(0 if record.get("kind") == "header" else pos + cut + 1)
    return record.get("cursor")


DEFAULT_LIMITS = Limits()

# ------------------------------------------------------------------ import
@dataclass
class LineError:
    line: int
    error: str


class ImportInvalid(ValidationFailed):
    """The file has problems; `details["errors"]` lists them by line. Nothing was written."""


class ImportConflict(Conflict):
    """Cells, history, folders or proposals in the file differ from what the store holds.
    Nothing was written."""


def _message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def parse_lines(raw_lines: Iterable[Union[str, bytes]]) -> Iterator[tuple[int, Union[Line, LineError]]]:
    """(line number, parsed line or its error); blank lines are skipped."""
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            yield number, LineError(number, f"not UTF-8: {exc}")
            continue
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as exc:
            yield number, LineError(number, f"not JSON: {exc}")
            continue
        except RecursionError:
            # Nested too deeply for the decoder: the body is not usable JSON, answered as a REST
            # body that deep is (400 MALFORMED_JSON), not as a line the import could report on.
            raise MalformedRequest(f"line {number} is JSON nested too deeply to decode",
                                   {"line": number, "reason": "RecursionError"}) from None
        if not isinstance(data, dict) or data.get("kind") not in _SECTION:
            yield number, LineError(number, f"not an export line: kind must be one of {sorted(_SECTION)}")
            continue
        model = _LINE_MODELS[data["kind"]]
        try:
            yield number, model.model_validate(data)
        except ValidationError as exc:
            yield number, LineError(number, f"{data['kind']}: {_message(exc)}")


def validate(raw_lines: Iterable[Union[str, bytes]], limits: Limits = DEFAULT_LIMITS) -> tuple[int, list[LineError]]:
    """Check a whole file without touching a store: (lines read, problems by line). A cell is
    held to the write limits a create is held to (`limits`: the server's or the settings')."""
    errors: list[LineError] = []
    section, lines = 0, 0
    cell_ids: set[str] = set()
    superseded: dict[str, str] = {}
    history_cell, history_n = None, 0
    history_cells: set[str] = set()
    live_keys: set[tuple[str, str]] = set()
    live_paths: set[tuple[str, str]] = set()
    folder_owners: set[str] = set()
    proposal_ids: set[str] = set()
    ended = False
    for number, item in parse_lines(raw_lines):
        lines += 1
        if isinstance(item, LineError):
            errors.append(item)
            continue
        if ended:
            errors.append(LineError(number, "line after the end line"))
            continue
        order = _SECTION[item.kind]
        if number == 1 and item.kind != "header" or item.kind == "header" and lines != 1:
            errors.append(LineError(number, "the first line must be the header, and only the first"))
        if order < section:
            previous = next(k for k, v in _SECTION.items() if v == section)
            errors.append(LineError(number, f"{item.kind} line after the {previous} section"))
        section = max(section, order)
        if isinstance(item, CellLine):
            cid = item.cell.id
            if cid in cell_ids:
                errors.append(LineError(number, f"cell {cid} appears twice"))
            try:
                check_cell_size(item.cell, limits)
            except PayloadTooLarge as exc:
                errors.append(LineError(number, f"cell {cid}: {exc}"))
            cell_ids.add(cid)
            key = _live_key(item.cell)
            if key is not None:
                if key in live_keys:
                    errors.append(LineError(number, f"cell {cid}: owner {key[0]!r} has two live cells with key {key[1]!r}"))
                live_keys.add(key)
            path = _live_path(item.cell)
            if path is not None:
                if path in live_paths:
                    errors.append(LineError(number, f"cell {cid}: owner {path[0]!r} has two live files at {path[1]!r}"))
                live_paths.add(path)
            if item.cell.lifecycle.superseded_by:
                superseded[cid] = item.cell.lifecycle.superseded_by
        elif isinstance(item, HistoryLine):
            if item.cell_id != history_cell:
                if item.cell_id in history_cells:
                    errors.append(LineError(number, f"history of {item.cell_id} is split; keep a cell's entries together"))
                history_cell, history_n = item.cell_id, 0
                history_cells.add(item.cell_id)
            if item.n != history_n + 1:
                errors.append(LineError(number, f"history of {item.cell_id}: entry {item.n} follows entry {history_n}"))
            history_n = item.n
        elif isinstance(item, SupersessionLine):
            if superseded.get(item.old_id) != item.new_id:
                errors.append(LineError(number, f"link {item.old_id} -> {item.new_id} does not match the cells "
                                                f"({item.old_id}.lifecycle.superseded_by is {superseded.get(item.old_id)})"))
        elif isinstance(item, FolderLine):
            if item.owner_id in folder_owners:
                errors.append(LineError(number, f"folder of {item.owner_id!r} appears twice"))
            folder_owners.add(item.owner_id)
        elif isinstance(item, ProposalLine):
            if item.proposal.id in proposal_ids:
                errors.append(LineError(number, f"proposal {item.proposal.id} appears twice"))
            proposal_ids.add(item.proposal.id)
        elif isinstance(item, EndLine):
            ended = True
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
    if lines and not ended and len(errors) < MAX_REPORTED_ERRORS:
        errors.append(LineError(lines, "the file has no end line (an interrupted export? resume it first)"))
    if not lines:
        errors.append(LineError(0, "the file is empty"))
    return lines, errors


def _live_key(cell: MemoryCell) -> Optional[tuple[str, str]]:
    """(owner, key) when the cell holds its key (cell keys: one live cell per owner and key)."""
    live = cell.lifecycle.status in ("active", "stale") and cell.lifecycle.superseded_by is None
    return (cell.identity.owner_id, cell.identity.key) if live and cell.identity.key else None


def _live_path(cell: MemoryCell) -> Optional[tuple[str, str]]:
    """(owner, path) when the cell is a live memory file (one live file per owner and path)."""
    live = cell.lifecycle.status in ("active", "stale") and cell.lifecycle.superseded_by is None
    return (cell.identity.owner_id, cell.identity.path) if live and cell.identity.path else None


def _comparable(cell: MemoryCell) -> dict[str, Any]:
    data = cell.model_dump(mode="json")
    data["scoring"]["access_count"] = 0  # reads move these without a new version
    data["lifecycle"]["last_accessed_at"] = None
    return data


def _same_history(a: list[HistoryEntry], b: list[HistoryLine]) -> bool:
    return len(a) == len(b) and all(
        (x.at, x.actor, x.action, x.changes) == (y.at, y.actor, y.action, y.changes) for x, y in zip(a, b, strict=True)
    )


def import_lines(
    store: Store,
    open_lines: Callable[[], Iterable[Union[str, bytes]]],
    retriever: Optional[Retriever] = None,
    progress: Callable[[int], None] = lambda n: None,
    batch_size: int = 256,
    limits: Limits = DEFAULT_LIMITS,
) -> ImportReport:
    """Validate the whole file (`open_lines()` is called once per pass; every cell within
    `limits`, as a create is), then write it in one transaction. Raises ImportInvalid or
    ImportConflict, having written nothing."""
    total, errors = validate(open_lines(), limits)
    if errors:
        raise ImportInvalid(
            f"{len(errors)} problem(s) in the file; nothing was imported",
            {"errors": [{"line": e.line, "error": e.error} for e in errors]},
        )
    retriever = retriever or Retriever()
    report = ImportReport(lines=total)
    conflicts: list[LineError] = []
    pending: list[MemoryCell] = []
    history: list[HistoryLine] = []
    history_first_line = 0

    with store.write() as tx:
        def flush_cells() -> None:
            vectors = retriever.vectors_for([c.content.text for c in pending])
            for cell, vector in zip(pending, vectors, strict=True):
                tx.insert(cell, vector)
            report.cells_written += len(pending)
            pending.clear()

        def flush_history() -> None:
            if not history:
                return
            # The store's committed history, as it was before this import began.
            existing = store.history(history[0].cell_id)
            if not existing:
                for h in history:
                    tx.add_history(HistoryRecord(h.cell_id, h.at, h.actor, h.action, h.changes))
                report.history_written += len(history)
            elif _same_history(existing, history):
                report.history_unchanged += len(history)
            else:
                conflicts.append(LineError(history_first_line, f"history of {history[0].cell_id} differs from the "
                                                               f"{len(existing)} entries the store holds"))
            history.clear()

        for number, item in parse_lines(open_lines()):
            progress(1)
            if isinstance(item, CellLine):
                existing_cell = tx.get(item.cell.id)
                key = _live_key(item.cell)
                holder = tx.key_holder(*key) if existing_cell is None and key else None
                file = _live_path(item.cell)
                file_holder = tx.path_holder(*file) if existing_cell is None and file else None
                if key is not None and holder is not None:
                    conflicts.append(LineError(number, f"cell {item.cell.id}: key {key[1]!r} of owner {key[0]!r} is held "
                                                       f"by {holder.id} in the store"))
                elif file is not None and file_holder is not None:
                    conflicts.append(LineError(number, f"cell {item.cell.id}: file {file[1]!r} of owner {file[0]!r} is "
                                                       f"{file_holder.id} in the store"))
                elif existing_cell is None:
                    pending.append(item.cell)
                    if len(pending) >= batch_size:
                        flush_cells()
                elif _comparable(existing_cell) == _comparable(item.cell):
                    report.cells_unchanged += 1
                else:
                    conflicts.append(LineError(number, f"cell {item.cell.id} already exists with other content "
                                                       f"(version {existing_cell.lifecycle.version} in the store, "
                                                       f"{item.cell.lifecycle.version} in the file)"))
            elif isinstance(item, HistoryLine):
                if pending:
                    flush_cells()
                if history and item.cell_id != history[0].cell_id:
                    flush_history()
                if not history:
                    history_first_line = number
                history.append(item)
            elif isinstance(item, FolderLine):
                flush_cells()
                flush_history()
                stored = store.folders(item.owner_id)
                if not stored:
                    folder = item.record()
                    tx.set_approval_mode(folder.owner_id, folder.approval_mode, folder.updated_at, folder.updated_by)
                    report.folders_written += 1
                elif stored[0] == item.record():
                    report.folders_unchanged += 1
                else:
                    conflicts.append(LineError(number, f"folder of {item.owner_id!r} is {stored[0].approval_mode!r} "
                                                       f"(set {stored[0].updated_at.isoformat()}) in the store"))
            elif isinstance(item, ProposalLine):
                flush_cells()
                flush_history()
                existing_proposal = tx.locked_proposal(item.proposal.id)
                if existing_proposal is None:
                    tx.put_proposal(item.record())
                    report.proposals_written += 1
                elif existing_proposal == item.record():
                    report.proposals_unchanged += 1
                else:
                    conflicts.append(LineError(number, f"proposal {item.proposal.id} already exists with other "
                                                       f"content (status {existing_proposal.status} in the store)"))
            elif isinstance(item, (SupersessionLine, EndLine)):
                flush_cells()
                flush_history()
            if len(conflicts) >= MAX_REPORTED_ERRORS:
                break
        flush_cells()
        flush_history()
        if conflicts:  # raising inside the transaction rolls everything back
            raise ImportConflict(
                f"{len(conflicts)} conflict(s) with what the store holds; nothing was imported",
                {"errors": [{"line": e.line, "error": e.error} for e in conflicts]},
            )
    return report


def iter_file(path: str) -> Callable[[], Iterator[bytes]]:
    """`open_lines` for a file on disk (read lazily, once per pass; bytes, so a line that is
    not UTF-8 is reported with its number like any other bad line)."""
    def open_lines() -> Iterator[bytes]:
        with open(path, "rb") as fh:
            yield from fh
    return open_lines


__all__ = [
    "FORMAT", "FORMAT_VERSION", "MEDIA_TYPE", "ImportConflict", "ImportInvalid", "ImportReport",
    "export_lines", "import_lines", "iter_file", "last_cursor", "validate",
]
