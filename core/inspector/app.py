"""The memory inspector: server-rendered pages at /ui (docs/inspector.md).

A Starlette app that `ampkit.server.app.create_app` mounts at /ui when `settings.ui` is on.
Pages call the same `MemoryService` methods as the /amp/v1 routes, with the signed-in agent as
the caller, so the one access rule decides what every page shows (a key with the admin scope
reads every owner's cells: inspector/operator.py); actions (edit, archive, restore, forget,
supersede) are the API's own service calls. No JavaScript: forms and links only.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..access import can_write
from ..client import _calls as calls
from ..client._calls import Call
from ..client._local import run_call
from ..errors import APIError, MethodNotAllowed, NotFound, ValidationFailed, validation_to_api_error
from ..files import ApproveRequest, FileInfo, Proposal, RejectRequest
from ..models import CellPatch, HistoryEntry, MemoryCell, MemoryType, SearchRequest, Status
from ..operations import split_values
from ..service import MemoryService
from . import charts
from .operator import OperatorReads
from .session import SESSION_COOKIE, SESSION_LIFETIME, SIGNIN_COOKIE, SessionSigner, UiSession

log = logging.getLogger("ampkit.inspector")

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 25
SEARCH_LIMIT = 20
CHAIN_LIMIT = 20  # supersession links followed each way
FILE_LINES = 2000  # lines of a file shown on its page (the files API's default read)
# Pages need no script and no third-party anything: the CSP says so.
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # forms then send their Origin (the Host allow-list refuses `null`)
    (b"cache-control", b"no-store"),
]
DONE_MESSAGES = {
    "updated": "Saved: the cell has a new version.",
    "archived": "Archived: the cell no longer appears in searches.",
    "restored": "Restored: the cell is active again and appears in searches.",
    "forgotten": "Forgotten: the cell is deleted (purged after the retention window).",
    "superseded": "Superseded: this cell replaces the old one, which stays readable with its history.",
    "approved": "Approved: the file has a new version, written by the proposer and approved by you.",
    "rejected": "Rejected: nothing was written; the agent sees your note in its proposals.md.",
    "signed-out": "Signed out.",
}


class SecurityHeaders:
    """Adds the CSP and friends to every inspector response (pages, redirects, static files)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *[(k, v) for k, v in SECURITY_HEADERS if k not in names]]
            await send(message)

        await self.app(scope, receive, with_headers)


class SignInNeeded(Exception):
    pass


def _ago(value: Optional[datetime], now: datetime) -> str:
    if value is None:
        return "never"
    seconds = (now - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            text = f"{n} {unit}{'s' if n != 1 else ''}"
            return f"in {text}" if future else f"{text} ago"
    return "just now"


# Words, runs of punctuation and runs of white space: "tea," is the word "tea" and a comma,
# so adding ", no sugar" after "tea" inserts just that and keeps "tea".
_TOKENS = re.compile(r"\w+|\s+|[^\w\s]+")


def text_diff(old: str, new: str) -> list[tuple[str, str]]:
    """Word-level diff: (op, text) with op in "same", "del", "ins"; the texts, joined with
    nothing between them, give `old` (same and del) and `new` (same and ins)."""
    a, b = _TOKENS.findall(old), _TOKENS.findall(new)
    out: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("same", "".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(("del", "".join(a[i1:i2])))
        if j2 > j1:
            out.append(("ins", "".join(b[j1:j2])))
    return out


def change_label(p: Proposal) -> str:
    """What a proposal does to its file, in words: a write to a file that exists is an edit
    (edit_file proposes the whole new text as a write)."""
    if p.action == "delete":
        return "delete"
    return "edit" if p.base_version is not None else "create"


def history_rows(entries: list[HistoryEntry]) -> list[dict[str, Any]]:
    """Each history entry with its changes split into field diffs (old -> new, with a word
    diff for texts) and notes (reason, similarity...)."""
    rows = []
    for entry in entries:
        fields, notes = [], []
        for path, value in entry.changes.items():
            if isinstance(value, list) and len(value) == 2:
                old, new = value
                words = text_diff(old, new) if isinstance(old, str) and isinstance(new, str) and path.endswith("text") else None
                fields.append({"path": path, "old": _show(old), "new": _show(new), "words": words})
            else:
                notes.append({"name": path, "value": _show(value)})
        rows.append({"entry": entry, "fields": fields, "notes": notes})
    return rows


def _show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _lines(raw: Optional[str]) -> list[str]:
    return [part.strip() for part in (raw or "").replace(",", "\n").splitlines() if part.strip()]


class FormInvalid(ValidationFailed):
    """A form with problems: each one in words, by the form field it is about (the page shows
    it next to that field), every problem at once rather than the first."""

    def __init__(self, fields: dict[str, list[str]]):
        count = sum(len(problems) for problems in fields.values())
        super().__init__(f"{count} problem{'' if count == 1 else 's'} in the form; nothing was saved",
                         {"fields": fields})


# pydantic's location of a value in the cell -> the form field that holds it
_FORM_FIELD = {("content", "text"): "text", ("content", "metadata"): "metadata",
               ("scoring", "importance"): "importance", ("scoring", "confidence"): "confidence",
               ("access_policy", "readable_by"): "readable_by", ("access_policy", "writable_by"): "writable_by",
               ("access_policy", "public"): "public"}


def _in_words(error: dict[str, Any]) -> str:
    msg = str(error.get("msg", "is not valid"))
    msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
    loc = error.get("loc", ())
    entry = f"line {loc[2] + 1}: " if len(loc) > 2 and isinstance(loc[2], int) else ""
    return entry + msg[:1].lower() + msg[1:]


def form_problems(exc: ValidationError, problems: dict[str, list[str]]) -> None:
    """Add each of pydantic's errors to `problems`, under its form field (`form` for the rest)."""
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())] + ["", ""]
        field = _FORM_FIELD.get((loc[0], loc[1]), "form")
        problems.setdefault(field, []).append(_in_words(dict(error)))


def _unit(form: FormData, name: str, problems: dict[str, list[str]]) -> Optional[float]:
    raw = str(form.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        problems.setdefault(name, []).append(f"{raw!r} is not a number: write one between 0 and 1, like 0.7")
        return None
    return value


def _metadata_filter(raw: Optional[str], problems: dict[str, list[str]]) -> Optional[dict[str, Any]]:
    return None if raw is None else _json_object(raw, problems)


def _metadata(form: FormData, problems: dict[str, list[str]]) -> dict[str, Any]:
    return _json_object(str(form.get("metadata") or "").strip() or "{}", problems)


def _json_object(raw: str, problems: dict[str, list[str]]) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        problems.setdefault("metadata", []).append(f"not JSON: {getattr(exc, 'msg', exc)} "
                                                    "(write an object, like {\"topic\": \"travel\"})")
        return {}
    if not isinstance(value, dict):
        problems.setdefault("metadata", []).append("must be a JSON object, like {\"topic\": \"travel\"}, "
                                                    f"not a {type(value).__name__}")
        return {}
    return value


def _version(form: FormData) -> Optional[int]:
    raw = str(form.get("version") or "").strip()
    return int(raw) if raw.isdigit() else None


NAV = (("/files", "Files"), ("/proposals", "Approvals"))


@functools.cache
def _templates() -> Environment:
    """The pages' templates, one environment per process: jinja compiles each template once
    per environment, so every inspector app shares it."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    env.globals["types"] = [t.value for t in MemoryType]
    env.globals["statuses"] = [s.value for s in Status if s != Status.deleted]
    env.filters["change"] = change_label
    return env


def create_inspector_app(service: MemoryService, *, auth_required: bool, secret: Optional[str] = None,
                         rate_check: Optional[Callable[[str], None]] = None) -> ASGIApp:
    """The inspector for `service`. `auth_required`: sign in with an API key (else with an
    agent id, marked unverified). `secret` signs the cookies (random per process when None).
    `rate_check(agent)` applies the server's per-agent rate limit to pages too."""
    signer = SessionSigner(service.store, auth_required=auth_required, secret=secret, clock=service.clock)
    operator = OperatorReads(service)
    env = _templates()
    weights = {"decay": service.retriever.config.decay_weight}

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def render(request: Request, template: str, session: Optional[UiSession], status: int = 200,
               **context: Any) -> HTMLResponse:
        now = service.clock()
        html = env.get_template(template).render(
            ui=base(request), session=session, auth_required=auth_required, now=now,
            ago=lambda value: _ago(value, now), nav=NAV, done=DONE_MESSAGES.get(request.query_params.get("done", "")),
            qs=lambda **params: urlencode({k: v for k, v in params.items() if v not in (None, "", False)}, doseq=True),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def error_page(request: Request, session: Optional[UiSession], exc: APIError) -> HTMLResponse:
        return render(request, "error.html", session, status=exc.status, error=exc)

    async def current(request: Request) -> UiSession:
        session = await run_in_threadpool(signer.session, request.cookies.get(SESSION_COOKIE))
        if session is None:
            raise SignInNeeded()
        if rate_check is not None:
            rate_check(session.agent)
        return session

    def page(handler: Callable[[Request, UiSession], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """A signed-in page: no session -> the sign-in page; an APIError -> the error page
        with its status; a POST must carry the session's CSRF token."""
        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            session: Optional[UiSession] = None
            try:
                session = await current(request)
                if request.method == "POST":
                    form = await request.form()
                    signer.check_csrf(session, str(form.get("csrf") or ""))
                return await handler(request, session)
            except SignInNeeded:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{base(request)}/signin?{urlencode({'next': target})}", status_code=303)
            except APIError as exc:
                return error_page(request, session, exc)
        return endpoint

    def redirect(request: Request, path: str, done: Optional[str] = None) -> RedirectResponse:
        return RedirectResponse(f"{base(request)}{path}" + (f"?done={done}" if done else ""), status_code=303)

    # ------------------------------------------------------------ sign in / out
    def _safe_next(request: Request, value: Optional[str]) -> str:
        root = base(request) + "/"
        if value and value.startswith(root) and not value.startswith("//") and "\\" not in value:
            return value
        return root + "owners"

    async def signin(request: Request) -> Response:
        if request.method == "GET":
            nonce = signer.signin_nonce()
            form_page: Response = render(request, "signin.html", None, token=signer.signin_token(nonce),
                                     next=request.query_params.get("next", ""))
            _set_cookie(request, form_page, SIGNIN_COOKIE, nonce, 3600)
            return form_page
        form = await request.form()
        try:
            signer.check_signin_token(request.cookies.get(SIGNIN_COOKIE), str(form.get("csrf") or ""))
            credential = str(form.get("credential") or "")
            cookie, session = await run_in_threadpool(signer.sign_in, credential)
            if rate_check is not None:
                rate_check(session.agent)
        except APIError as exc:
            nonce = signer.signin_nonce()
            refused = render(request, "signin.html", None, status=exc.status, error=exc,
                             token=signer.signin_token(nonce), next=str(form.get("next") or ""))
            _set_cookie(request, refused, SIGNIN_COOKIE, nonce, 3600)
            return refused
        response = RedirectResponse(_safe_next(request, str(form.get("next") or "")), status_code=303)
        _set_cookie(request, response, SESSION_COOKIE, cookie, int(SESSION_LIFETIME.total_seconds()))
        response.delete_cookie(SIGNIN_COOKIE, path=base(request) + "/")
        return response

    @page
    async def signout(request: Request, session: UiSession) -> Response:
        signer.sign_out(session)
        response = redirect(request, "/signin", "signed-out")
        response.delete_cookie(SESSION_COOKIE, path=base(request) + "/")
        return response

    def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
        response.set_cookie(name, value, max_age=max_age, path=base(request) + "/", httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")

    async def home(request: Request) -> Response:
        return redirect(request, "/owners")

    # ------------------------------------------------------------ owners
    @page
    async def owners(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        cursor = request.query_params.get("cursor") or None
        if session.operator:
            rows, next_cursor = await run_in_threadpool(lambda: operator.owners(limit=PAGE_SIZE, cursor=cursor))
        else:
            rows, next_cursor = await run_in_threadpool(service.owners, agent, limit=PAGE_SIZE, cursor=cursor)
        return render(request, "owners.html", session, rows=rows, next_cursor=next_cursor, cursor=cursor)

    # ------------------------------------------------------------ cells
    @page
    async def cells(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        q = request.query_params
        owner, session_id, metadata = q.get("owner") or None, q.get("session") or None, q.get("metadata") or None
        kinds, statuses, superseded = q.getlist("type") or None, q.getlist("status") or None, q.get("superseded") == "1"
        filters: dict[str, Any] = {"owner": owner, "type": kinds, "status": statuses, "session": session_id,
                                   "metadata": metadata, "superseded": superseded}
        cursor = q.get("cursor") or None
        problems: dict[str, list[str]] = {}
        wanted = _metadata_filter(metadata, problems)
        if problems:  # the filters again, the problem next to its field
            error = FormInvalid(problems)
            return render(request, "cells.html", session, status=error.status, results=[], total=0, next_cursor=None,
                          cursor=None, filters=filters, error=error)
        chosen: dict[str, Any] = dict(owner_id=owner, types=split_values(kinds, MemoryType),
                                      status=split_values(statuses, Status), session_id=session_id, metadata=wanted,
                                      include_superseded=superseded, limit=PAGE_SIZE, cursor=cursor)
        if session.operator:
            results, total, next_cursor = await run_in_threadpool(lambda: operator.list(**chosen))
        else:
            results, total, next_cursor = await run_in_threadpool(lambda: service.list(agent, **chosen))
        return render(request, "cells.html", session, results=results, total=total, next_cursor=next_cursor,
                      cursor=cursor, filters=filters)

    # ------------------------------------------------------------ search
    @page
    async def search(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        q = request.query_params
        query = (q.get("q") or "").strip()
        filters = {"owner": q.get("owner") or None, "type": q.getlist("type") or None, "stale": q.get("stale") == "1"}
        response = None
        if query:
            try:
                req = SearchRequest(query=query, owner_id=filters["owner"],
                                    types=split_values(filters["type"], MemoryType),  # type: ignore[arg-type]
                                    include_stale=filters["stale"], limit=SEARCH_LIMIT, explain=True,
                                    include_files=True)  # a person sees files too, shown as files
            except ValidationError as exc:
                raise validation_to_api_error([{**e, "loc": ("query", *e.get("loc", ()))} for e in exc.errors()]) from None
            response = await run_in_threadpool(service.search, agent, req)
        charts_by_id = {hit.id: charts.explain_chart(hit.explain or {}, weights, f"x{n}")
                        for n, hit in enumerate(response.results if response else [])}
        return render(request, "search.html", session, query=query, filters=filters, response=response,
                      charts=charts_by_id, weights=weights)

    # ------------------------------------------------------------ one cell
    def _peek(session: UiSession) -> Callable[[str], MemoryCell]:
        """How the session reads one cell: under the read rule, or as the operator."""
        return operator.peek if session.operator else functools.partial(service.peek, session.agent)

    def _chain(peek: Callable[[str], MemoryCell], cell: MemoryCell) -> tuple[list[Optional[MemoryCell]], list[Optional[MemoryCell]]]:
        """The supersession chain around `cell`: older cells (nearest first) and newer ones.
        A link the caller cannot read ends its side with None (shown as 'not available',
        exactly as a missing cell would be)."""
        older: list[Optional[MemoryCell]] = []
        newer: list[Optional[MemoryCell]] = []
        for side, attr in ((older, "supersedes"), (newer, "superseded_by")):
            current = cell
            for _ in range(CHAIN_LIMIT):
                link = getattr(current.lifecycle, attr)
                if link is None:
                    break
                try:
                    current = peek(link)
                except APIError:
                    side.append(None)
                    break
                side.append(current)
        return older, newer

    def _cell_context(session: UiSession, cell_id: str) -> dict[str, Any]:
        agent, peek = session.agent, _peek(session)
        cell = peek(cell_id)
        history = operator.history(cell_id) if session.operator else service.history(agent, cell_id)
        older, newer = _chain(peek, cell)
        now = service.clock()
        threshold = service.policy.stale_threshold
        consolidation = cell.content.metadata.get("consolidation") if isinstance(
            cell.content.metadata.get("consolidation"), dict) else None
        episodes: list[tuple[str, Optional[MemoryCell]]] = []
        for episode_id in cell.provenance.supporting_episode_ids or []:
            try:
                episodes.append((episode_id, peek(episode_id)))
            except APIError:
                episodes.append((episode_id, None))
        return {
            "cell": cell, "history": history_rows(history), "older": older, "newer": newer,
            "decay_chart": charts.decay_chart(cell, now, threshold), "threshold": threshold,
            "decay_sentence": charts.decay_sentence(cell, now, threshold), "writable": can_write(cell, agent),
            "consolidation": consolidation, "episodes": episodes, "isfinite": math.isfinite,
        }

    @page
    async def cell_page(request: Request, session: UiSession) -> Response:
        session.need("read")
        context = await run_in_threadpool(_cell_context, session, request.path_params["cell_id"])
        context["writable"] = context["writable"] and session.may("write")
        return render(request, "cell.html", session, **context)

    # ------------------------------------------------------------ actions
    async def _form(request: Request) -> FormData:
        return await request.form()

    def _edit_values(cell: MemoryCell) -> dict[str, str]:
        return {
            "text": cell.content.text,
            "metadata": json.dumps(cell.content.metadata, ensure_ascii=False, indent=2, sort_keys=True),
            "importance": f"{cell.scoring.importance:g}", "confidence": f"{cell.scoring.confidence:g}",
            "readable_by": "\n".join(cell.access_policy.readable_by),
            "writable_by": "\n".join(cell.access_policy.writable_by),
            "public": "1" if cell.access_policy.public else "", "version": str(cell.lifecycle.version),
        }

    def _patch_from(form: FormData) -> CellPatch:
        """The form as a PATCH; every problem at once (FormInvalid), each by its field."""
        problems: dict[str, list[str]] = {}
        text = str(form.get("text") or "").replace("\r\n", "\n")  # a textarea sends CRLF; texts keep LF
        body: dict[str, Any] = {
            "content": {"text": text, "metadata": _metadata(form, problems)},
            "scoring": {k: v for k in ("importance", "confidence") if (v := _unit(form, k, problems)) is not None},
            "access_policy": {"readable_by": _lines(str(form.get("readable_by") or "")),
                              "writable_by": _lines(str(form.get("writable_by") or "")),
                              "public": form.get("public") == "1"},
        }
        try:
            patch = CellPatch.model_validate(body)
        except ValidationError as exc:
            form_problems(exc, problems)
        if problems:
            raise FormInvalid({field: list(dict.fromkeys(found)) for field, found in problems.items()})
        return patch

    @page
    async def edit(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        cell_id = request.path_params["cell_id"]
        cell = await run_in_threadpool(service.peek, agent, cell_id)
        if request.method == "GET":
            return render(request, "edit.html", session, cell=cell, values=_edit_values(cell), mode="edit")
        form = await _form(request)
        values = {k: str(form.get(k) or "") for k in _edit_values(cell)}
        try:
            patch = _patch_from(form)
            writer = session.need("write")
            await run_in_threadpool(lambda: service.update(writer, cell_id, patch, expected_version=_version(form),
                                                           may_read=session.may("read"),
                                                           admin_key=session.verified and session.may("admin")))
        except APIError as exc:  # the form again, with what was typed: nothing is lost
            return render(request, "edit.html", session, status=exc.status, cell=cell, values=values, error=exc,
                          mode="edit")
        return redirect(request, f"/cells/{quote(cell_id)}", "updated")

    def _drive(agent: str, session: UiSession, flow: Any) -> Any:
        """Run a client flow (`ampkit.client._calls`) through the operations rows, as the API's
        in-process transport does, with the session's scopes."""
        try:
            item: Call[Any] = next(flow)
            while True:
                item = flow.send(run_call(service, agent, item, scopes=session.scopes))
        except StopIteration as stop:
            return stop.value

    def _archive(agent: str, cell_id: str, version: Optional[int]) -> None:
        archive = CellPatch.model_validate({"lifecycle": {"status": Status.archived.value}})
        service.update(agent, cell_id, archive, expected_version=version)

    @page
    async def archive(request: Request, session: UiSession) -> Response:
        writer = session.need("write")
        cell_id = request.path_params["cell_id"]
        form = await _form(request)
        await run_in_threadpool(_archive, writer, cell_id, _version(form))
        return redirect(request, f"/cells/{quote(cell_id)}", "archived")

    @page
    async def restore(request: Request, session: UiSession) -> Response:
        writer = session.need("write")
        cell_id = request.path_params["cell_id"]
        form = await _form(request)
        await run_in_threadpool(lambda: service.restore(writer, cell_id, expected_version=_version(form),
                                                        may_read=session.may("read")))
        return redirect(request, f"/cells/{quote(cell_id)}", "restored")

    @page
    async def forget(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        cell_id = request.path_params["cell_id"]
        if request.method == "GET":
            cell = await run_in_threadpool(service.peek, agent, cell_id)
            return render(request, "forget.html", session, cell=cell)
        writer = session.need("write")
        form = await _form(request)

        # The clients' forget: archive (conditional on the version shown), then delete.
        await run_in_threadpool(_drive, writer, session, calls.forget_flow(cell_id, _version(form)))
        return redirect(request, "/cells", "forgotten")

    @page
    async def supersede(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        cell_id = request.path_params["cell_id"]
        cell = await run_in_threadpool(service.peek, agent, cell_id)
        if request.method == "GET":
            return render(request, "edit.html", session, cell=cell, values=_edit_values(cell), mode="supersede")
        form = await _form(request)
        values = {k: str(form.get(k) or "") for k in _edit_values(cell)}
        try:
            patch = _patch_from(form)
            writer = session.need("write")
            assert patch.content is not None and patch.content.text is not None and patch.access_policy is not None
            scoring = patch.scoring.model_dump(exclude_none=True) if patch.scoring else {}
            fields = {
                "metadata": patch.content.metadata, "session_id": cell.identity.session_id, "key": cell.identity.key,
                "importance": scoring.get("importance", cell.scoring.importance),
                "confidence": scoring.get("confidence", cell.scoring.confidence),
                "decay_rate": cell.scoring.decay_rate, **patch.access_policy.model_dump(mode="json"),
                "source_type": "user_explicit", "extraction_method": "user_explicit", "source_ref": "ampkit:inspector",
                "dedup": "off",
            }
            # The clients' supersede (the create row with `supersedes`), from the cell shown:
            # a person looking is not a use, so no GET.
            try:
                new = await run_in_threadpool(_drive, writer, session,
                                              calls.supersede_flow(cell_id, patch.content.text, fields, old=cell))
            except ValidationError as exc:
                found: dict[str, list[str]] = {}
                form_problems(exc, found)
                raise FormInvalid(found) from None
        except APIError as exc:
            return render(request, "edit.html", session, status=exc.status, cell=cell, values=values, error=exc,
                          mode="supersede")
        return redirect(request, f"/cells/{quote(new.id)}", "superseded")


    # ------------------------------------------------------------ memory files (docs/files.md)
    def _tree(infos: list[FileInfo]) -> dict[str, Any]:
        root: dict[str, Any] = {"dirs": {}, "files": []}
        for info in infos:
            node = root
            for part in info.path.split("/")[:-1]:
                node = node["dirs"].setdefault(part, {"dirs": {}, "files": []})
            node["files"].append(info)
        return root

    @page
    async def files(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        owner = (request.query_params.get("owner") or "").strip() or agent

        def load() -> dict[str, Any]:
            listing = service.files.list(agent, owner)
            pending: dict[str, int] = {}
            for p in service.files.proposals(agent, owner, "pending", may_approve=session.may_approve).results:
                pending[p.path] = pending.get(p.path, 0) + 1
            return {"root": _tree(listing.results), "count": len(listing.results), "pending": pending,
                    "mode": service.files.approval_mode(owner).approval_mode}
        return render(request, "files.html", session, owner=owner, **await run_in_threadpool(load))

    @page
    async def file_view(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        owner = (request.query_params.get("owner") or "").strip() or agent
        path = request.query_params.get("path") or ""
        if not path:
            raise ValidationFailed("the query parameter path is required", {"param": "path"})

        def load() -> dict[str, Any]:
            content = service.files.read(agent, owner, path, 0, FILE_LINES)
            versions = [] if content.read_only else service.files.history(agent, owner, path).results
            pending = [p for p in service.files.proposals(agent, owner, "pending", may_approve=session.may_approve).results
                       if p.path == content.path]
            cell_id = next((f.id for f in service.files.list(agent, owner).results if f.path == content.path), None)
            return {"content": content, "versions": versions, "pending": pending, "cell_id": cell_id}
        return render(request, "file.html", session, owner=owner, **await run_in_threadpool(load))

    @page
    async def proposals(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        owner = (request.query_params.get("owner") or "").strip() or None
        status = request.query_params.get("status", "pending")
        if status not in ("", "pending", "approved", "rejected"):
            raise ValidationFailed("status must be pending, approved or rejected", {"param": "status"})
        found = await run_in_threadpool(lambda: service.files.proposals(
            agent, owner, status or None, may_approve=session.may_approve).results)
        return render(request, "proposals.html", session, proposals=list(reversed(found)), owner=owner,
                      status_filter=status)

    @page
    async def proposal(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        found = await run_in_threadpool(service.files.proposal, agent, request.path_params["proposal_id"],
                                        may_approve=session.may_approve)
        return render(request, "proposal.html", session, p=found)

    @page
    async def decide(request: Request, session: UiSession) -> Response:
        agent = session.need("read")
        proposal_id, decision = request.path_params["proposal_id"], request.path_params["decision"]
        if decision not in ("approve", "reject"):
            raise NotFound("no such page")
        form = await _form(request)
        message = str(form.get("message") or "").strip() or None
        content: Optional[str] = None
        current = await run_in_threadpool(service.files.proposal, agent, proposal_id, may_approve=session.may_approve)
        if decision == "approve" and "content" in form:
            content = str(form.get("content"))
            if "\r" not in (current.content or ""):
                content = content.replace("\r\n", "\n")  # a form sends a textarea's lines with CRLF
            if content == current.content:
                content = None  # approved as proposed
        try:
            if decision == "approve":
                try:
                    approval = ApproveRequest(content=content, message=message)
                except ValidationError as exc:
                    raise validation_to_api_error(
                        [{**e, "loc": ("form", *e.get("loc", ()))} for e in exc.errors()]) from None
                await run_in_threadpool(lambda: service.files.approve(
                    agent, proposal_id, approval, may_approve=session.may_approve, may_write=session.may("write"),
                    in_person=True))  # the inspector is a person's page, not an agent's tool
            else:
                await run_in_threadpool(lambda: service.files.reject(
                    agent, proposal_id, RejectRequest(message=message), may_approve=session.may_approve,
                    may_write=session.may("write")))
        except APIError as exc:  # the proposal again, with what was typed
            return render(request, "proposal.html", session, status=exc.status, p=current, error=exc,
                          content=content, message=message)
        return redirect(request, f"/proposals/{quote(proposal_id)}", "approved" if decision == "approve" else "rejected")

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own 404 and 405, as the inspector's error page."""
        session = await run_in_threadpool(signer.session, request.cookies.get(SESSION_COOKIE))
        status = getattr(exc, "status_code", 404)
        error: APIError = NotFound("no such page") if status == 404 else MethodNotAllowed(
            f"{request.method} is not allowed here", {"method": request.method})
        return error_page(request, session, error)

    routes = [
        Route("/", home),
        Route("/signin", signin, methods=["GET", "POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/owners", owners),
        Route("/cells", cells),
        Route("/search", search),
        Route("/cells/{cell_id}", cell_page),
        Route("/cells/{cell_id}/edit", edit, methods=["GET", "POST"]),
        Route("/cells/{cell_id}/archive", archive, methods=["POST"]),
        Route("/cells/{cell_id}/restore", restore, methods=["POST"]),
        Route("/cells/{cell_id}/forget", forget, methods=["GET", "POST"]),
        Route("/cells/{cell_id}/supersede", supersede, methods=["GET", "POST"]),
        Route("/files", files),
        Route("/files/view", file_view),
        Route("/proposals", proposals),
        Route("/proposals/{proposal_id}", proposal),
        Route("/proposals/{proposal_id}/{decision:str}", decide, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: http_error, 405: http_error})
    return SecurityHeaders(app)


__all__ = ["create_inspector_app", "history_rows", "text_diff"]
