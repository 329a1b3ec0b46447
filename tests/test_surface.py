"""The callable surface is the operations table: every row names the client methods that send
it (hand-written `Client`/`AsyncClient` twins with one signature) and its MCP tools, or the
reason it has none; the MCP tool list and its read-only set come from the rows; MCP bounds
are the wire limits (docs/architecture.md#the-callable-surface)."""

from __future__ import annotations

import inspect

import pytest

from ampkit import limits
from ampkit.client import AsyncClient, Client
from ampkit.files.models import MAX_READ_LINES
from ampkit.mcp_server import READ_TOOLS, TOOL_NAMES, _tools
from ampkit.operations import OPERATIONS, McpTool, Operation

ROWS = {op.name: op for op in OPERATIONS}


@pytest.mark.parametrize("name", ROWS)
def test_every_row_has_sync_and_async_client_twins_with_one_signature(name):
    op = ROWS[name]
    assert op.client, f"{name}: no client method names this row"
    for method in op.client:
        sync, asynchronous = getattr(Client, method, None), getattr(AsyncClient, method, None)
        assert sync is not None and asynchronous is not None, f"{name}: Client.{method} and AsyncClient.{method}"
        assert not inspect.iscoroutinefunction(sync), method
        assert inspect.iscoroutinefunction(asynchronous) or inspect.isasyncgenfunction(asynchronous), method
        assert list(inspect.signature(sync).parameters.values()) == list(
            inspect.signature(asynchronous).parameters.values()), method


@pytest.mark.parametrize("name", ROWS)
def test_every_row_has_an_mcp_tool_or_a_reason_for_none(name):
    op = ROWS[name]
    assert bool(op.mcp) != bool(op.mcp_opt_out), name
    assert op.mcp_opt_out is None or len(op.mcp_opt_out) > 20, f"{name}: say why there is no tool"


def test_a_row_without_tool_or_reason_is_refused():
    with pytest.raises(ValueError, match="mcp_opt_out"):
        Operation("x", "GET", "/x", lambda c, i: None, client=("x",))
    with pytest.raises(ValueError, match="mcp_opt_out"):
        Operation("x", "GET", "/x", lambda c, i: None, mcp=(McpTool("x", read_only=True),), mcp_opt_out="both")


def test_the_mcp_tools_are_the_ones_the_rows_name_with_their_read_only_hint():
    tools = {tool.name: tool for tool in _tools()}
    named = [tool for op in OPERATIONS for tool in op.mcp]
    assert sorted(tools) == sorted(TOOL_NAMES) == sorted(t.name for t in named)
    assert len(set(TOOL_NAMES)) == len(TOOL_NAMES)
    for tool in named:
        assert tools[tool.name].annotations.readOnlyHint is tool.read_only, tool.name
        assert (tool.name in READ_TOOLS) is tool.read_only
        assert tools[tool.name].description, tool.name


def test_mcp_bounds_are_the_wire_limits():
    schemas = {tool.name: tool.parameters["properties"] for tool in _tools()}
    assert schemas["recall"]["limit"]["maximum"] == limits.MAX_SEARCH_LIMIT
    assert schemas["amp_recall"]["limit"]["maximum"] == limits.MAX_SEARCH_LIMIT
    assert schemas["list_memories"]["limit"]["maximum"] == limits.MAX_PAGE_SIZE
    assert schemas["amp_list_memories"]["limit"]["maximum"] == limits.MAX_PAGE_SIZE
    assert schemas["read_file"]["limit"]["maximum"] == MAX_READ_LINES
    note = schemas["record_outcome"]["note"]
    assert limits.MAX_OUTCOME_NOTE in [alt.get("maxLength") for alt in note.get("anyOf", [note])]


def test_the_names_table_in_the_architecture_doc_is_the_rows():
    """docs/architecture.md lists each row's route, client methods and tools (the one
    vocabulary): the table must say what the rows say."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if re.match(r"\| `\w+` \| `[A-Z]+ /", line)]
    listed = {}
    for line in rows:
        name, route, client, tools = (cell.strip() for cell in line.strip("|").split("|"))
        listed[name.strip("`")] = (route.strip("`"), re.findall(r"`(\w+)`", client),
                                   re.findall(r"`(\w+)`", tools) if not tools.startswith("none") else [])
    assert listed == {op.name: (f"{op.method} {op.path}", list(op.client), [t.name for t in op.mcp])
                      for op in OPERATIONS}
