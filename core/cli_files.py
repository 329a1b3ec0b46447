"""`ampkit files ...` and `ampkit proposals ...` (docs/files.md): an owner's memory folder on
the store named by --store or AMPKIT_STORE. The command line acts for the person running it:
an import lands directly (history records it as written by `--as`), and deciding a proposal
is that person's approval."""

from __future__ import annotations

import getpass
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import click

from .cli_common import OWNER_HELP, check_store, store_option
from .errors import AccessDenied, APIError
from .files import FileService

EXIT_INVALID = 1

_store_option = store_option
_owner_option = click.option("--owner", "owner_id", required=True, help=OWNER_HELP)
_as_option = click.option("--as", "actor", default=None,
                          help="who you are, as history records it [default: human:<your login name>]")


def _actor(actor: Optional[str]) -> str:
    return actor or f"human:{getpass.getuser()}"


@contextmanager
def _files(store_url: Optional[str], proposal_id: Optional[str] = None) -> Iterator[FileService]:
    """The files service on the store; an error ends the command with its message. The command
    line reads every proposal (it acts as the approver), so one it cannot find does not exist."""
    from .bootstrap import build_service, load_settings

    settings = load_settings(store=store_url)
    check_store(settings.store_url())
    service = build_service(settings)
    service.store.open()
    try:
        yield service.files
    except AccessDenied as exc:
        if proposal_id is None:
            _exit_with(exc)
        click.echo(f"ampkit: proposal not found: {proposal_id}", err=True)
        sys.exit(EXIT_INVALID)
    except APIError as exc:
        _exit_with(exc)
    finally:
        service.store.close()


def export_problems(root: Path, paths: list[str]) -> list[str]:
    """Why the folder cannot be written under `root`, checked before anything is written: a
    path that is also another path's directory (`a` and `a/b.md`), a symbolic link on the way
    (an export writes through none: it would write outside the folder), something other than
    a directory where one is needed, or other than a regular file where a file goes."""
    problems: list[str] = []
    directories = {p.rsplit("/", 1)[0] for p in paths if "/" in p}
    directories |= {d.rsplit("/", i)[0] for d in list(directories) for i in range(1, d.count("/") + 1)}
    for path in sorted(set(paths) & directories):
        inside = next(p for p in sorted(paths) if p.startswith(path + "/"))
        problems.append(f"{path}: a file, and also the directory of {inside}; a file system holds only one")
    seen: set[str] = set()
    for path in sorted(paths):
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            here = root.joinpath(*parts[:depth])
            if rel in seen:
                continue
            seen.add(rel)
            is_file = depth == len(parts)
            try:
                mode = here.lstat().st_mode
            except FileNotFoundError:
                break  # nothing there yet: nothing deeper either
            if stat.S_ISLNK(mode):
                problems.append(f"{rel}: a symbolic link; an export writes through none (remove it or pick "
                                "another directory)")
                break
            if not is_file and not stat.S_ISDIR(mode):
                problems.append(f"{rel}: exists and is not a directory, but {path} goes inside it")
                break
            if is_file and not stat.S_ISREG(mode):
                problems.append(f"{rel}: exists and is not a regular file")
    return problems


def _write_new_or_regular(target: Path, data: bytes) -> None:
    """Write `target`, refusing a symbolic link that appeared since the check (O_NOFOLLOW)."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def folder_files(root: Path) -> tuple[dict[str, str], list[str]]:
    """The regular files under `root` (relative path -> text) and every problem: a symbolic
    link (an import follows none, so nothing outside the folder comes in), anything that is not
    a regular file, a file that is not UTF-8."""
    texts: dict[str, str] = {}
    problems: list[str] = []
    for directory, subdirectories, names in os.walk(root, followlinks=False):
        here = Path(directory)
        for name in sorted(subdirectories + names):
            item = here / name
            rel = item.relative_to(root).as_posix()
            mode = item.lstat().st_mode
            if stat.S_ISLNK(mode):
                problems.append(f"  {rel}: a symbolic link (to {os.readlink(item)}); an import follows none: "
                                "copy the file in instead")
            elif stat.S_ISDIR(mode):
                continue
            elif not stat.S_ISREG(mode):
                problems.append(f"  {rel}: not a regular file")
            else:
                fd = os.open(item, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                with os.fdopen(fd, "rb") as source:
                    data = source.read()
                try:
                    texts[rel] = data.decode("utf-8")
                except UnicodeDecodeError:
                    problems.append(f"  {rel}: not UTF-8 text")
    return dict(sorted(texts.items())), sorted(problems)


def _exit_with(exc: APIError) -> None:
    """The error, each listed problem once on a line of its own (the message repeats them all
    on one line, for API callers that read only the message)."""
    problems = [e for e in exc.details.get("errors") or [] if isinstance(e, dict) and "path" in e]
    if problems:
        click.echo(f"ampkit: {exc.code}: {len(problems)} problem(s), nothing was changed:", err=True)
        for e in problems:
            where = f"{e['path']} {e.get('loc', '')}".strip()
            click.echo(f"  {where}: {e.get('message', '')}", err=True)
    else:
        click.echo(f"ampkit: {exc.code}: {exc.message}", err=True)
    sys.exit(EXIT_INVALID)


def _diff(text: str) -> None:
    """A unified diff, coloured when the terminal shows colour (click strips it otherwise)."""
    for line in text.splitlines():
        colour = ("green" if line.startswith("+") and not line.startswith("+++") else
                  "red" if line.startswith("-") and not line.startswith("---") else
                  "cyan" if line.startswith("@@") else None)
        click.echo(click.style(line, fg=colour) if colour else line)


def register(main: click.Group) -> None:
    @main.group()
    def files() -> None:
        """An owner's memory folder: AGENTS.md, skills/, subagents/, tools.json, notes."""

    @files.command("ls")
    @_owner_option
    @click.option("--glob", default=None, help="only paths matching this glob (`*`, `**`)")
    @_store_option
    def files_ls(owner_id: str, glob: Optional[str], store_url: Optional[str]) -> None:
        """List the folder's files: path, type, version, size."""
        with _files(store_url) as f:
            for info in f.list(None, owner_id, glob).results:
                click.echo(f"{info.path}\t{info.type}\tv{info.version}\t{info.size} bytes")

    @files.command("read")
    @click.argument("path")
    @_owner_option
    @_store_option
    def files_read(path: str, owner_id: str, store_url: Optional[str]) -> None:
        """Print a file's current text (as stored, byte for byte)."""
        with _files(store_url) as f:
            folder = f.folder(None, owner_id)
        text = folder.get(path.lstrip("/"))
        if text is None:
            click.echo(f"ampkit: no file {path.lstrip('/')} in {owner_id}'s folder (`ampkit files ls --owner "
                       f"{owner_id}` lists them)", err=True)
            sys.exit(EXIT_INVALID)
        click.echo(text, nl=False)

    @files.command("history")
    @click.argument("path")
    @_owner_option
    @_store_option
    def files_history(path: str, owner_id: str, store_url: Optional[str]) -> None:
        """Every version: who wrote it, who approved it, the diff."""
        with _files(store_url) as f:
            for v in f.history(None, owner_id, path).results:
                approved = f", approved by {v.approved_by}" if v.approved_by else ""
                click.echo(click.style(f"version {v.version}  {v.at.isoformat()}  {v.action} by {v.actor}{approved}",
                                       bold=True))
                _diff(v.diff)

    @files.command("export")
    @click.argument("directory", type=click.Path(file_okay=False))
    @_owner_option
    @_store_option
    def files_export(directory: str, owner_id: str, store_url: Optional[str]) -> None:
        """Write the folder as real files (what Deep Agents CLI or Claude Code-style harnesses read).
        Everything is checked first: a path that cannot be written (a file that is also a
        directory, a symbolic link on the way) refuses the whole export, nothing written."""
        with _files(store_url) as f:
            folder = f.folder(None, owner_id)
        root = Path(directory)
        problems = export_problems(root, list(folder))
        if problems:
            click.echo("ampkit: nothing was exported:\n" + "\n".join(f"  {p}" for p in problems), err=True)
            sys.exit(EXIT_INVALID)
        for path, text in folder.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_new_or_regular(target, text.encode("utf-8"))
        click.echo(f"wrote {len(folder)} file(s) to {root}", err=True)

    @files.command("import")
    @click.argument("directory", type=click.Path(exists=True, file_okay=False))
    @_owner_option
    @_as_option
    @_store_option
    def files_import(directory: str, owner_id: str, actor: Optional[str], store_url: Optional[str]) -> None:
        """Bring a folder in through validation: one invalid file refuses the whole import
        (every problem listed), nothing stored. Symbolic links are refused, never followed."""
        texts, problems = folder_files(Path(directory))
        if problems:
            click.echo("ampkit: nothing was imported:\n" + "\n".join(problems), err=True)
            sys.exit(EXIT_INVALID)
        with _files(store_url) as f:
            results = f.import_folder(_actor(actor), owner_id, texts)
        for r in results:
            click.echo(f"{r.status}\t{r.path}\tv{r.version}")

    @files.command("mode")
    @click.argument("mode", type=click.Choice(["review", "yolo"]), required=False)
    @_owner_option
    @_as_option
    @_store_option
    def files_mode(mode: Optional[str], owner_id: str, actor: Optional[str], store_url: Optional[str]) -> None:
        """Show or set the folder's approval mode: review (writes wait for approval) or yolo."""
        from .files import ApprovalMode

        with _files(store_url) as f:
            if mode is not None:
                f.set_approval_mode(_actor(actor), ApprovalMode(owner_id=owner_id, approval_mode=mode))
            click.echo(f.approval_mode(owner_id).approval_mode)

    @main.group()
    def proposals() -> None:
        """Proposed changes to memory files, awaiting a person's decision."""

    @proposals.command("list")
    @click.option("--owner", "owner_id", default=None, help="only proposals for this owner's folder [default: every owner]")
    @click.option("--status", type=click.Choice(["pending", "approved", "rejected"]), default="pending",
                  show_default=True, help="which proposals: those awaiting a decision, or those decided")
    @_store_option
    def proposals_list(owner_id: Optional[str], status: str, store_url: Optional[str]) -> None:
        """List proposals, one a line: id, owner, action and path, who proposed it, why."""
        with _files(store_url) as f:
            for p in f.proposals(None, owner_id, status).results:
                click.echo(f"{p.id}\t{p.owner_id}\t{p.action} {p.path}\tby {p.proposed_by}\t{p.reason or ''}")

    @proposals.command("show")
    @click.argument("proposal_id")
    @_store_option
    def proposals_show(proposal_id: str, store_url: Optional[str]) -> None:
        """Show one proposal: what it changes, who proposed it and why, and the diff."""
        with _files(store_url, proposal_id) as f:
            p = f.proposal(None, proposal_id)
        click.echo(click.style(f"{p.id}: {p.action} {p.path} in {p.owner_id}'s folder, by {p.proposed_by} "
                               f"({p.status})", bold=True))
        if p.reason:
            click.echo(f"why: {p.reason}")
        _diff(p.diff)

    @proposals.command("approve")
    @click.argument("proposal_id")
    @click.option("--content-file", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="edit, then approve: write this file's text instead")
    @click.option("--message", "-m", default=None, help="a note on the decision, told to the agent that proposed it")
    @_as_option
    @_store_option
    def proposals_approve(proposal_id: str, content_file: Optional[str], message: Optional[str],
                          actor: Optional[str], store_url: Optional[str]) -> None:
        """Apply a pending proposal (or, with --content-file, your edited text) as the file's
        next version, recorded as written by the proposer and approved by you."""
        from .files import ApproveRequest

        content = Path(content_file).read_bytes().decode("utf-8") if content_file else None
        with _files(store_url, proposal_id) as f:
            p = f.approve(_actor(actor), proposal_id, ApproveRequest(content=content, message=message),
                          may_approve=True)
        click.echo(f"approved {p.id}: {p.path} is now at version {p.result_version}")

    @proposals.command("reject")
    @click.argument("proposal_id")
    @click.option("--message", "-m", default=None, help="told to the agent that proposed it")
    @_as_option
    @_store_option
    def proposals_reject(proposal_id: str, message: Optional[str], actor: Optional[str],
                         store_url: Optional[str]) -> None:
        """Decline a pending proposal; the file stays as it is."""
        from .files import RejectRequest

        with _files(store_url, proposal_id) as f:
            p = f.reject(_actor(actor), proposal_id, RejectRequest(message=message), may_approve=True)
        click.echo(f"rejected {p.id}; {p.path} is unchanged")
