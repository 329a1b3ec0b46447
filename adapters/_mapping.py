"""What every adapter shares: the cell fields it writes, the scope tag that bounds its
`clear`/`reset`, and the sync/async client pair.

Each adapter writes cells through the public client API only. Every cell an adapter writes
carries two metadata tags:

- `ampkit_framework`: which adapter wrote it (`langgraph`, `llamaindex`, ...), for humans;
- `ampkit_scope`: the adapter instance's scope (a LangGraph namespace, a chat session, a
  crew name ...). `clear`/`reset` forget only cells that carry the adapter's scope tag AND
  were created by the adapter's own agent id, so one framework can never wipe another's
  memories, or another agent's, or the user's own notes.

Reads go through the server's search and list, so the access policy decides what an
adapter's agent sees: the same rule for every framework.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ampkit import MemoryCell

SCOPE_TAG = "ampkit_scope"
FRAMEWORK_TAG = "ampkit_framework"
# One search request returns at most this many hits (the server's MAX_SEARCH_LIMIT).
MAX_SEARCH = 100
# What recall puts into prompts by default: durable facts and procedures, not chat logs.
LONG_TERM_TYPES = ("semantic", "procedural")


@dataclass(frozen=True)
class Sharing:
    """Who else may read or write the cells an adapter writes (the cell's access policy).

    The owner (usually the user) and the writing agent always have full access; these
    patterns add other agents, e.g. `Sharing(readable_by=["team-*"])`."""

    readable_by: Sequence[str] = ()
    writable_by: Sequence[str] = ()
    public: bool = False

    def fields(self) -> dict[str, Any]:
        return {"readable_by": list(self.readable_by), "writable_by": list(self.writable_by), "public": self.public}


@dataclass
class Clients:
    """The sync and async client of one adapter, built from whichever one it was given.

    Frameworks that call memory from both sides (LangGraph, LlamaIndex) need both; the
    missing one is opened on the same URL with the same agent id and api key."""

    given: Any
    owned: bool = False  # True when the adapter opened `given` itself (then it closes it too)
    _sync: Any = field(default=None, repr=False)
    _async: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if _is_async(self.given):
            self._async = self.given
        else:
            self._sync = self.given

    @property
    def agent_id(self) -> str:
        if not self.given.agent_id:
            raise ValueError("adapters write as an agent: connect with agent_id=...")
        return self.given.agent_id

    @property
    def sync(self):
        if self._sync is None:
            self._sync = _connect_like(self.given)
        return self._sync

    @property
    def aio(self):
        if self._async is None:
            self._async = _connect_like(self.given, asynchronous=True)
        return self._async

    def _mine(self, client: Any) -> bool:
        return client is not None and (self.owned or client is not self.given)

    def close(self) -> None:
        """Close only the clients this object opened; the caller owns the one it passed."""
        if self._mine(self._sync):
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        self.close()
        if self._mine(self._async):
            await self._async.aclose()
            self._async = None


def _is_async(client: Any) -> bool:
    return asyncio.iscoroutinefunction(getattr(client, "remember", None))


def _connect_like(client: Any, asynchronous: bool = False):
    """The twin of `client`: same URL, agent id and api key, the other calling style."""
    from ampkit.client import AsyncClient, Client

    if client.config.scheme == "memory":
        # A memory:// store lives inside its one client; a second client would see another store.
        if asynchronous:
            return _ThreadedAsync(client)
        raise ValueError("this adapter needs a sync client; pass an ampkit.Client for a memory:// store")
    twin = AsyncClient if asynchronous else Client
    return twin(client.url, agent_id=client.agent_id, api_key=client.config.api_key)


class _ThreadedAsync:
    """Async calls on a sync in-process client, each in a worker thread (memory:// only)."""

    def __init__(self, client: Any):
        self._client = client
        self.agent_id = client.agent_id

    def __getattr__(self, name: str):
        method = getattr(self._client, name)

        async def threaded(*args: Any, **kwargs: Any):
            if name == "list":
                return await asyncio.to_thread(lambda: list(method(*args, **kwargs)))
            return await asyncio.to_thread(method, *args, **kwargs)

        return threaded

    async def aclose(self) -> None:
        return None


# Metadata keys the adapters write for their own bookkeeping; never shown to a model.
ADAPTER_KEY_PREFIXES = ("ampkit_", "langgraph_", "langchain_", "llamaindex_", "crewai_", "autogen_")


def tags(framework: str, scope: str, **extra: Any) -> dict[str, Any]:
    return {FRAMEWORK_TAG: framework, SCOPE_TAG: scope, **extra}


def user_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """A cell's metadata without any adapter's bookkeeping keys."""
    return {k: v for k, v in metadata.items() if not k.startswith(ADAPTER_KEY_PREFIXES)}


def owned_by_scope(cells: Iterable[MemoryCell], agent_id: str) -> list[str]:
    """Ids of the cells a clear may forget: created by this adapter's agent (the list was
    already filtered by scope tag). Cells others wrote into the same scope stay."""
    return [c.id for c in cells if c.identity.created_by == agent_id]


def render(texts: Iterable[str], header: str = "Relevant shared memory:") -> str:
    """The text an adapter puts into a prompt: one line per memory, best first."""
    lines = [f"- {t}" for t in texts]
    return "\n".join([header, *lines] if header else lines) if lines else ""


def search_text(texts: Iterable[Optional[str]], max_chars: int = 2000) -> str:
    """A search query from recent message texts (the server caps a query at 4096 chars)."""
    joined = " ".join(t for t in texts if t and t.strip())
    return joined[-max_chars:].strip()


# ---------------------------------------------------------------- sync and async from one plan
# Frameworks call memory from sync and async code. Rather than writing every operation twice,
# an operation is written once as a generator that yields client calls, `call("search", q,
# limit=5)`, and receives their results; `run_sync` executes the calls on a sync client and
# `run_async` awaits them on an async one. `list` results are collected into a Python list.


@dataclass(frozen=True)
class Call:
    method: str
    args: tuple
    kwargs: dict


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call(method, args, kwargs)


def _collect(step: Call, value: Any) -> Any:
    return list(value) if step.method == "list" else value


def run_sync(client: Any, plan):
    """Run `plan` on a sync client. A call's exception is thrown into the plan, so a plan can
    catch, say, a `Conflict` and go another way; uncaught, it leaves `run_sync`."""
    try:
        step = plan.send(None)
        while True:
            try:
                result = _collect(step, getattr(client, step.method)(*step.args, **step.kwargs))
            except Exception as exc:  # noqa: BLE001 - handed to the plan, which re-raises what it does not handle
                step = plan.throw(exc)
                continue
            step = plan.send(result)
    except StopIteration as done:
        return done.value


async def _await_step(client: Any, step: Call) -> Any:
    value = getattr(client, step.method)(*step.args, **step.kwargs)
    if step.method == "list":
        return [cell async for cell in value] if hasattr(value, "__aiter__") else list(await value)
    return await value


async def run_async(client: Any, plan):
    """`run_sync` on an async client."""
    try:
        step = plan.send(None)
        while True:
            try:
                result = await _await_step(client, step)
            except Exception as exc:  # noqa: BLE001 - see run_sync
                step = plan.throw(exc)
                continue
            step = plan.send(result)
    except StopIteration as done:
        return done.value


def forget_scope(owner_id: Optional[str], scope: str, agent_id: str):
    """Plan: forget the cells of one adapter scope that this agent created; returns how many."""
    cells = yield call("list", owner_id=owner_id, metadata={SCOPE_TAG: scope})
    ids = owned_by_scope(cells, agent_id)
    for cell_id in ids:
        yield call("forget", cell_id)
    return len(ids)
