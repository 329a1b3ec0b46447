"""README's commands run as written from a fresh clone, and what it says they print is what they print.

Every fenced block of README is checked. Shell blocks: each command's program must be one
this file knows, and then `make` targets exist in the Makefile, `ampkit` subcommands and their
flags exist in the CLI, scripts and modules that `python` runs exist, `pip install` names only
extras pyproject.toml declares (and the wheel `make dist` builds), and the `curl` commands run
against a real server. Python blocks compile, their `ampkit` imports resolve, and a complete
program (one that starts with `import ampkit`) runs against a real server. JSON blocks parse,
and the cell and `/health` answers have the fields the server sends. Links point at files and
headings that exist; the conformance count and the MCP tool table match the code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from typing import Any, Iterator

import click
import httpx

import ampkit
from ampkit.cli import main as ampkit_cli
from support import ROOT, TLS, run_example

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

README = ROOT / "README.md"
README_URL = "http://127.0.0.1:8765"  # where README's commands expect `ampkit serve`
# Programs README may name whose use needs no further check (the venv, a browser).
PLAIN_PROGRAMS = {"source", "xdg-open", "open", "cd"}
SEPARATORS = {"|", "||", "&&", ";", "&"}


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line number) of each fenced block."""
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        found.append((match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1))
    return found


def shell_commands(body: str) -> Iterator[list[str]]:
    """Each simple command of a shell block as words, comments dropped, quoted text and
    backslash continuations joined; leading VAR=value assignments removed."""
    pending = ""
    for line in body.splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quotation continues on the next line
            continue
        if pending.rstrip().endswith("\\"):
            continue
        pending = ""
        command: list[str] = []
        for word in words + [";"]:
            if word in SEPARATORS:
                while command and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0]):
                    command.pop(0)
                if command:
                    yield command
                command = []
            else:
                command.append(word)
    assert pending == "", f"unterminated shell command: {pending!r}"


def readme_blocks(language: set[str]) -> list[tuple[str, str, int]]:
    return [b for b in blocks(README.read_text()) if b[0] in language]


def all_shell_commands() -> list[tuple[list[str], int]]:
    return [(cmd, line) for _, body, line in readme_blocks({"sh", "bash"}) for cmd in shell_commands(body)]


def test_readme_is_short_and_names_no_commits_or_issues():
    text = README.read_text()
    assert len(text.splitlines()) <= 350
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text.replace("mem_01M959YWC5B4KJSGM2P8VXVPH9", "")), "a commit hash"
    assert not re.search(r"(?i)\bissue\s*#?\d+|#\d{2,}\b", text), "an issue number"
    assert {lang for lang, _, _ in blocks(text)} <= {"sh", "python", "json", ""}


# ---------------------------------------------------------------- shell commands


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def check_ampkit(words: list[str]) -> None:
    """`ampkit SUB [SUB...] --flag ...`: each subcommand and each flag exists."""
    command: click.Command = ampkit_cli
    ctx = click.Context(ampkit_cli)
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"no command {' '.join(words[:len(words) - len(rest) + 1])!r}"
        command, rest = sub, rest[1:]
    assert not isinstance(command, click.Group), f"{' '.join(words)!r} names a group, not a command"
    flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for word in rest:
        if word.startswith("-"):
            assert word.split("=", 1)[0] in flags, f"{' '.join(words)!r}: no flag {word} (has {sorted(flags)})"


def check_python(words: list[str]) -> None:
    if words[1] == "-m":
        module = words[2]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        if module == "pytest":
            assert all((ROOT / w).exists() for w in words[3:] if w.startswith("tests/")), words
    elif words[1] != "-c":
        assert (ROOT / words[1]).is_file(), f"no script {words[1]}"


def check_pip(words: list[str]) -> None:
    assert words[1] == "install", words
    extras = set(pyproject()["project"]["optional-dependencies"])
    version = pyproject()["project"]["version"]
    for target in words[2:]:
        if target == "-e":
            continue
        match = re.fullmatch(r"(\.|dist/ampkit-(?P<version>[^-]+)-py3-none-any\.whl)\[(?P<extras>[\w,]+)\]", target)
        assert match, f"pip install {target!r}: not the checkout or the wheel `make dist` builds"
        if match.group("version"):
            assert match.group("version") == version
        assert set(match.group("extras").split(",")) <= extras, target


def test_every_shell_command_names_what_exists():
    seen: set[str] = set()
    for words, line in all_shell_commands():
        program = words[0].removeprefix(".venv/bin/")
        seen.add(program)
        where = f"README line {line}: {shlex.join(words)}"
        if program == "make":
            assert set(words[1:]) <= make_targets(), where
        elif program == "ampkit":
            check_ampkit(words)
        elif program in ("python", "python3"):
            check_python(words)
        elif program == "pip":
            check_pip(words)
        elif program == "curl":
            assert any(w.startswith((README_URL, "$B")) for w in words), where  # run below
        elif program == "source":
            assert words[1:] == [".venv/bin/activate"], where
        else:
            assert program in PLAIN_PROGRAMS, f"{where}: unknown program (add a check here)"
    assert {"make", "ampkit", "python", "pip", "curl"} <= seen  # the parser found the commands


def test_make_targets_readme_names_do_what_it_says():
    makefile = (ROOT / "Makefile").read_text()
    # the demo installs no test tools; `make test` does
    demo_install = re.search(r"^\$\(APP_STAMP\):.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "'.[all]'" in demo_install and "dev" not in demo_install
    assert re.search(r"^demo: \$\(APP_STAMP\)$", makefile, re.MULTILINE)
    assert re.search(r"^run: \$\(APP_STAMP\)$", makefile, re.MULTILINE)
    assert "$(BIN)/ampkit serve" in makefile
    assert "pip wheel -q --no-deps -w $(DIST) ." in makefile


def test_the_curl_commands_run_against_a_real_server(server, tmp_path):
    port = server.base_url.split(":")[2].split("/")[0]
    shell = "\n".join(body for _, body, _ in readme_blocks({"sh"}) if "curl" in body and "$B" in body)
    assert shell, "README has no curl walkthrough"
    lines = [line for line in shell.replace(README_URL, f"http://127.0.0.1:{port}").splitlines()]
    script = "set -euo pipefail\n" + "\n".join(lines) + "\necho\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    created, found = [json.loads(part) for part in re.split(r"(?<=\})(?=\{\"results\")", out.stdout.strip())]
    assert created["content"]["text"] == "The user prefers bullet-point summaries"
    assert found["results"][0]["id"] == created["id"] and found["total"] >= 1


def test_the_health_answer_has_the_fields_readme_shows(server):
    commands = [cmd for cmd, _ in all_shell_commands() if cmd[0] == "curl" and cmd[-1].endswith("/health")]
    assert commands == [["curl", f"{README_URL}/amp/v1/health"]]
    shown = next(json.loads(body) for lang, body, _ in readme_blocks({"json"}) if '"status": "ok"' in body)
    real = httpx.get(f"{server.base_url}/health", verify=TLS).json()
    assert shape(shown) == shape(real)
    assert shown["amp_version"] == real["amp_version"] and shown["embedding"]["model"] == real["embedding"]["model"]


def shape(value: Any) -> Any:
    return {k: shape(v) for k, v in value.items()} if isinstance(value, dict) else type(value).__name__


def test_the_cell_readme_shows_has_every_field_the_server_sends(server):
    shown = next(json.loads(body) for lang, body, _ in readme_blocks({"json"}) if '"amp_version"' in body and '"id"' in body)
    with ampkit.connect(server.base_url, agent_id="assistant") as memory:
        cell = memory.remember("a cell to compare", owner_id="readme-owner")
        real = json.loads(cell.model_dump_json())
    assert shape(shown).keys() == shape(real).keys()
    for part in real:
        if isinstance(real[part], dict):
            assert set(shown[part]) == set(real[part]), part


def test_the_mcp_tool_table_lists_every_tool():
    from ampkit.mcp_server import TOOL_NAMES

    text = README.read_text()
    section = text[text.index("## Use it from any MCP client"):text.index("## Memory as files")]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = re.findall(r"`(\w+)`", "".join(rows))
    assert sorted(listed) == sorted(TOOL_NAMES)


def test_the_conformance_count_is_the_number_of_cases():
    from ampkit.spec.conformance import load_cases

    text = README.read_text()
    assert f"ends: {len(load_cases())} passed, 0 failed" in text
    assert "ampkit serve --store sqlite:////tmp/scratch.db --allow-clock-override &" in text


# ---------------------------------------------------------------- Python


def test_python_blocks_compile_and_their_ampkit_imports_exist():
    for _, body, line in readme_blocks({"python"}):
        tree = ast.parse(body, filename=f"README.md:{line}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ampkit"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), f"README line {line}: {node.module}.{alias.name}"
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ampkit":
                assert hasattr(ampkit, node.attr), f"README line {line}: ampkit.{node.attr}"


def test_the_complete_python_programs_run_against_a_real_server(server, tmp_path):
    programs = [body for _, body, _ in readme_blocks({"python"}) if body.startswith("import ampkit\n")]
    assert programs
    for body in programs:
        script = tmp_path / "readme_program.py"
        script.write_text(body.replace(f"{README_URL}/amp/v1", server.base_url))
        proc = run_example(script, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- links


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_points_at_a_file_and_heading_that_exist():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        file = ROOT / path if path else README
        assert file.exists(), f"README links to missing {path}"
        if fragment:
            headings = re.findall(r"^#+ (.*)$", file.read_text(), re.MULTILINE)
            assert fragment in {anchor(h) for h in headings}, f"README links to missing heading {target}"
    for path in re.findall(r"`((?:examples|bench|spec|docs|tests)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), f"README names missing {path}"


def test_the_whole_tools_json_in_docs_files_is_valid():
    from ampkit.files.validate import problems_for

    text = (ROOT / "docs" / "files.md").read_text()
    body = next(body for lang, body, _ in blocks(text.replace("\n  ", "\n")) if lang == "json" and "mcpServers" in body)
    assert set(json.loads(body)) == {"mcpServers"}
    assert problems_for("tools.json", body) == []
