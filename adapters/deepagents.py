"""DeepAgents: an agent's memory folder in ampkit (docs/files.md#deepagents).

`AmpkitBackend` implements DeepAgents' backend protocol (`deepagents.backends.protocol`,
sync and async), so a deep agent keeps its AGENTS.md, skills and notes in ampkit:

    from deepagents import create_deep_agent
    from deepagents.backends import CompositeBackend, StateBackend
    from ampkit.adapters.deepagents import AmpkitBackend

    agent = create_deep_agent(
        model=model,
        backend=CompositeBackend(default=StateBackend(),
                                 routes={"/memories/": AmpkitBackend(client, owner_id="agent-42")}),
        memory=["/memories/AGENTS.md"], skills=["/memories/skills/"])

Writes go through ampkit's validation and the owner's approval mode: in `review` mode a write
or an edit becomes a proposal and the tool answers the model that it awaits a person's
approval (the file is unchanged); a refused file (an invalid SKILL.md, tools.json...)
answers every problem. The outcomes of the agent's proposals are in `/proposals.md`; put it
in `memory=[...]` to show them to the agent at the start of each session.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, TypeVar, cast

try:
    from deepagents.backends.protocol import (
        BackendProtocol,
        DeleteResult,
        EditResult,
        FileDownloadResponse,
        FileInfo,
        FileUploadResponse,
        GlobResult,
        GrepMatch,
        GrepResult,
        LsResult,
        ReadResult,
        WriteResult,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the DeepAgents adapter needs deepagents: pip install 'ampkit[deepagents]'") from exc

from ampkit.errors import AccessDenied, APIError
from ampkit.files import FileInfo as AmpkitFileInfo
from ampkit.files import FileWriteResult

from ._mapping import Clients

R = TypeVar("R")


def _key(path: str) -> str:
    """DeepAgents' absolute path inside this backend (`/AGENTS.md`) -> the folder's path."""
    return path.lstrip("/")


def _dir(path: Optional[str]) -> str:
    """A directory as a path prefix: `/` -> "", `/skills` -> "skills/"."""
    bare = (path or "/").strip("/")
    return bare + "/" if bare else ""


def _info(f: AmpkitFileInfo) -> FileInfo:
    info: dict[str, Any] = {"path": "/" + f.path, "is_dir": False, "size": f.size}
    if f.modified_at is not None:
        info["modified_at"] = f.modified_at.isoformat()
    return cast(FileInfo, info)


def _children(files: list[AmpkitFileInfo], prefix: str) -> list[FileInfo]:
    """The direct children of the directory `prefix`: its files, and its subdirectories once."""
    out: list[FileInfo] = []
    seen: set[str] = set()
    for f in files:
        if not f.path.startswith(prefix):
            continue
        rest = f.path[len(prefix):]
        if "/" in rest:
            sub = prefix + rest.split("/", 1)[0] + "/"
            if sub not in seen:
                seen.add(sub)
                out.append(cast(FileInfo, {"path": "/" + sub, "is_dir": True}))
        else:
            out.append(_info(f))
    return out


def _said(result: FileWriteResult) -> Optional[str]:
    """What the model is told when a write did not land: a proposal awaiting approval."""
    return result.message if result.status == "proposed" else None


class AmpkitBackend(BackendProtocol):
    """A DeepAgents backend over one owner's ampkit memory folder. `client` is an
    `ampkit.Client` or `AsyncClient` (the other twin is opened as needed)."""

    def __init__(self, client: Any, *, owner_id: str, reason: Optional[str] = "written by a DeepAgents agent"):
        self.clients = Clients(client)
        self.owner_id = owner_id
        self.reason = reason

    # ------------------------------------------------------------ one translation, two calling styles
    def _sync(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.clients.sync, name)(*args, owner_id=self.owner_id, **kwargs)

    async def _async(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.clients.aio, name)(*args, owner_id=self.owner_id, **kwargs)

    @staticmethod
    def _guard(path: str, done: Callable[[], R], failed: Callable[[str], R]) -> R:
        try:
            return done()
        except AccessDenied:
            return failed(f"Error: file '{path}' not found")
        except APIError as exc:
            return failed(f"Error: {exc.message}")

    # ------------------------------------------------------------ reads
    def _ls(self, listed: Any, path: str) -> LsResult:
        return LsResult(entries=_children(listed.results, _dir(path)))

    def ls(self, path: str) -> LsResult:
        return self._guard(path, lambda: self._ls(self.clients.sync.list_files(self.owner_id), path),
                           lambda e: LsResult(error=e))

    async def als(self, path: str) -> LsResult:
        try:
            return self._ls(await self.clients.aio.list_files(self.owner_id), path)
        except APIError as exc:
            return LsResult(error=f"Error: {exc.message}")

    @staticmethod
    def _read(content: Any, offset: int) -> ReadResult:
        if content.total_lines and offset >= content.total_lines:
            return ReadResult(error=f"Line offset {offset} exceeds file length ({content.total_lines} lines)")
        data: Any = {"content": content.content, "encoding": "utf-8"}
        if not content.content:
            return ReadResult(file_data=data)
        return ReadResult(file_data=data, total_lines=content.total_lines, start_line=content.start_line,
                          end_line=content.end_line, next_offset=content.next_offset)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        if limit <= 0:
            return ReadResult(no_lines_requested=True)
        return self._guard(file_path, lambda: self._read(self._sync("read_file", _key(file_path), offset=offset,
                                                                    limit=limit), offset),
                           lambda e: ReadResult(error=e))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        if limit <= 0:
            return ReadResult(no_lines_requested=True)
        try:
            return self._read(await self._async("read_file", _key(file_path), offset=offset, limit=limit), offset)
        except AccessDenied:
            return ReadResult(error=f"Error: file '{file_path}' not found")
        except APIError as exc:
            return ReadResult(error=f"Error: {exc.message}")

    @staticmethod
    def _grep_glob(path: Optional[str], glob: Optional[str]) -> Optional[str]:
        prefix = _dir(path)
        if glob:
            return prefix + glob.lstrip("/") if prefix else glob
        return prefix + "**" if prefix else None

    @staticmethod
    def _grep(found: Any) -> GrepResult:
        matches = [cast(GrepMatch, {"path": "/" + m.path, "line": m.line, "text": m.text}) for m in found.matches]
        return GrepResult(matches=matches, truncated=found.truncated)

    def grep(self, pattern: str, path: Optional[str] = None, glob: Optional[str] = None, *,
             max_count: Optional[int] = None) -> GrepResult:
        return self._guard(path or "/", lambda: self._grep(self._sync(
            "grep_files", pattern, glob=self._grep_glob(path, glob), max_count=max_count or 1000)),
            lambda e: GrepResult(error=e))

    async def agrep(self, pattern: str, path: Optional[str] = None, glob: Optional[str] = None, *,
                    max_count: Optional[int] = None) -> GrepResult:
        try:
            return self._grep(await self._async("grep_files", pattern, glob=self._grep_glob(path, glob),
                                                max_count=max_count or 1000))
        except APIError as exc:
            return GrepResult(error=f"Error: {exc.message}")

    def glob(self, pattern: str, path: Optional[str] = None) -> GlobResult:
        return self._guard(pattern, lambda: GlobResult(matches=[
            _info(f) for f in self.clients.sync.list_files(self.owner_id, glob=self._grep_glob(path, pattern)).results]),
            lambda e: GlobResult(error=e))

    async def aglob(self, pattern: str, path: Optional[str] = None) -> GlobResult:
        try:
            listed = await self.clients.aio.list_files(self.owner_id, glob=self._grep_glob(path, pattern))
            return GlobResult(matches=[_info(f) for f in listed.results])
        except APIError as exc:
            return GlobResult(error=f"Error: {exc.message}")

    # ------------------------------------------------------------ writes: validated, maybe proposed
    def write(self, file_path: str, content: str) -> WriteResult:
        def done() -> WriteResult:
            result = self._sync("write_file", _key(file_path), content, reason=self.reason)
            return WriteResult(path=file_path, error=_said(result))
        return self._guard(file_path, done, lambda e: WriteResult(error=e))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        try:
            result = await self._async("write_file", _key(file_path), content, reason=self.reason)
            return WriteResult(path=file_path, error=_said(result))
        except APIError as exc:
            return WriteResult(error=f"Error: {exc.message}")

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        def done() -> EditResult:
            result = self._sync("edit_file", _key(file_path), old_string, new_string, replace_all=replace_all,
                                reason=self.reason)
            return EditResult(path=file_path, occurrences=result.occurrences, error=_said(result))
        return self._guard(file_path, done, lambda e: EditResult(error=e))

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        try:
            result = await self._async("edit_file", _key(file_path), old_string, new_string, replace_all=replace_all,
                                       reason=self.reason)
            return EditResult(path=file_path, occurrences=result.occurrences, error=_said(result))
        except AccessDenied:
            return EditResult(error=f"Error: file '{file_path}' not found")
        except APIError as exc:
            return EditResult(error=f"Error: {exc.message}")

    def delete(self, file_path: str) -> DeleteResult:
        def done() -> DeleteResult:
            result = self._sync("delete_file", _key(file_path), reason=self.reason)
            return DeleteResult(path=file_path, error=_said(result))
        return self._guard(file_path, done, lambda e: DeleteResult(error=e))

    async def adelete(self, file_path: str) -> DeleteResult:
        return await asyncio.to_thread(self.delete, file_path)

    # ------------------------------------------------------------ bulk transfer
    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, data in files:
            try:
                result = self.write(path, data.decode("utf-8"))
                out.append(FileUploadResponse(path=path, error=result.error if result.path is None else None))
            except UnicodeDecodeError:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
        return out

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await asyncio.to_thread(self.upload_files, files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            try:
                text = self._sync("read_file", _key(path), limit=10000).content
                out.append(FileDownloadResponse(path=path, content=text.encode("utf-8")))
            except APIError:
                out.append(FileDownloadResponse(path=path, error="file_not_found"))
        return out

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            try:
                text = (await self._async("read_file", _key(path), limit=10000)).content
                out.append(FileDownloadResponse(path=path, content=text.encode("utf-8")))
            except APIError:
                out.append(FileDownloadResponse(path=path, error="file_not_found"))
        return out


__all__ = ["AmpkitBackend"]
