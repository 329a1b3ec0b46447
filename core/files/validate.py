"""The validators of memory files: one registry, by path pattern (docs/files.md#validation).

Each validator takes the path and the whole new text and returns every problem it finds, each
with its location (`frontmatter.name`, `/mcpServers/github/command`, `line 3`) and a message
a model can act on. A write with any problem is refused with all of them (422), nothing stored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Optional

import yaml

from ..errors import ValidationFailed
from .paths import AGENTS_MD, TOOLS_JSON, matches

AGENTS_MD_MAX_BYTES = 32 * 1024  # instructions go into every model call: keep them short
SKILL_MAX_BYTES = 10 * 1024 * 1024  # DeepAgents' SkillsMiddleware limit (the cell limit is lower)
NAME_MAX, DESCRIPTION_MAX, COMPATIBILITY_MAX = 64, 1024, 500
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# DeepAgents' SkillsMiddleware reads frontmatter with this expression (next-capabilities.md).
_FRONTMATTER = re.compile(r"^---\s*\n(.*?)\n---\s*\n", re.DOTALL)
SKILL_FIELDS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


@dataclass(frozen=True)
class Problem:
    loc: str
    message: str

    def as_dict(self, path: str) -> dict[str, str]:
        return {"path": path, "loc": self.loc, "message": self.message}


Validator = Callable[[str, str], list[Problem]]


def _frontmatter(text: str, problems: list[Problem]) -> Optional[dict[str, Any]]:
    match = _FRONTMATTER.match(text)
    if match is None:
        problems.append(Problem("frontmatter", "the file must start with YAML frontmatter: a line '---', "
                                               "`name: ...` and `description: ...`, then a line '---'"))
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"frontmatter line {mark.line + 2}" if mark is not None else "frontmatter"
        problems.append(Problem(where, f"the frontmatter is not valid YAML: {getattr(exc, 'problem', exc)}"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem("frontmatter", "the frontmatter must be a YAML mapping (`key: value` lines)"))
        return None
    return data


def frontmatter(text: str) -> Optional[dict[str, Any]]:
    """The YAML frontmatter of a SKILL.md or subagent file as a mapping, None without one."""
    return _frontmatter(text, [])


def _check_name(data: dict[str, Any], expected: str, what: str, problems: list[Problem]) -> None:
    name = data.get("name")
    if name is None:
        problems.append(Problem("frontmatter.name", f"`name` is required; it must equal the {what} ({expected!r})"))
        return
    if not isinstance(name, str):
        problems.append(Problem("frontmatter.name", "`name` must be a string"))
        return
    if len(name) > NAME_MAX:
        problems.append(Problem("frontmatter.name", f"`name` is {len(name)} characters; at most {NAME_MAX}"))
    if not _NAME.match(name):
        problems.append(Problem("frontmatter.name", f"`name` {name!r} must be lowercase letters, digits and single "
                                                    "hyphens (no leading, trailing or double hyphen)"))
    if name != expected:
        problems.append(Problem("frontmatter.name", f"`name` {name!r} must equal the {what} ({expected!r})"))


def _check_description(data: dict[str, Any], problems: list[Problem]) -> None:
    description = data.get("description")
    if description is None:
        problems.append(Problem("frontmatter.description", "`description` is required: say what it does and when to use it"))
    elif not isinstance(description, str) or not description.strip():
        problems.append(Problem("frontmatter.description", "`description` must be a non-empty string"))
    elif len(description) > DESCRIPTION_MAX:
        problems.append(Problem("frontmatter.description",
                                f"`description` is {len(description)} characters; at most {DESCRIPTION_MAX}"))


def validate_skill(path: str, text: str) -> list[Problem]:
    """`skills/<name>/SKILL.md`, the Agent Skills convention as DeepAgents reads it."""
    problems: list[Problem] = []
    if len(text.encode("utf-8")) > SKILL_MAX_BYTES:
        problems.append(Problem("file", f"a SKILL.md is at most {SKILL_MAX_BYTES} bytes"))
    data = _frontmatter(text, problems)
    if data is None:
        return problems
    directory = path.split("/")[-2]
    _check_name(data, directory, "skill's directory name", problems)
    _check_description(data, problems)
    for key in sorted(set(data) - SKILL_FIELDS, key=str):
        problems.append(Problem(f"frontmatter.{key}", f"unknown field {key!r}; allowed: {sorted(SKILL_FIELDS)} "
                                                      "(put anything else under `metadata`)"))
    compatibility = data.get("compatibility")
    if compatibility is not None and (not isinstance(compatibility, str) or len(compatibility) > COMPATIBILITY_MAX):
        problems.append(Problem("frontmatter.compatibility", f"`compatibility` must be a string of at most {COMPATIBILITY_MAX} characters"))
    if "license" in data and not isinstance(data["license"], str):
        problems.append(Problem("frontmatter.license", "`license` must be a string"))
    metadata = data.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict)
                                 or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        problems.append(Problem("frontmatter.metadata", "`metadata` must map strings to strings"))
    tools = data.get("allowed-tools")
    if tools is not None and not (isinstance(tools, str) or (isinstance(tools, list) and all(isinstance(t, str) for t in tools))):
        problems.append(Problem("frontmatter.allowed-tools", "`allowed-tools` must be a string (space-separated) or a list of strings"))
    return problems


def validate_subagent(path: str, text: str) -> list[Problem]:
    """`subagents/<name>.md`: frontmatter `name` (= file name) and `description`; the body is
    the helper's system prompt; `tools` and `model` are optional."""
    problems: list[Problem] = []
    data = _frontmatter(text, problems)
    if data is None:
        return problems
    stem = path.rsplit("/", 1)[-1][: -len(".md")]
    _check_name(data, stem, "file name without .md", problems)
    _check_description(data, problems)
    tools = data.get("tools")
    if tools is not None and not (isinstance(tools, str) or (isinstance(tools, list) and all(isinstance(t, str) for t in tools))):
        problems.append(Problem("frontmatter.tools", "`tools` must be a list of tool names (or one comma-separated string)"))
    if "model" in data and not isinstance(data["model"], str):
        problems.append(Problem("frontmatter.model", "`model` must be a string"))
    match = _FRONTMATTER.match(text)
    if match is not None and not text[match.end():].strip():
        problems.append(Problem("body", "the body after the frontmatter is the subagent's system prompt; it is empty"))
    return problems


@lru_cache(maxsize=1)
def tools_schema() -> dict[str, Any]:
    """The published schema, spec/tools.schema.json."""
    return json.loads(resources.files("ampkit.spec").joinpath("tools.schema.json").read_text(encoding="utf-8"))


def _schema_errors(instance: Any, schema: dict[str, Any], prefix: str) -> list[Problem]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    out = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        loc = prefix + "".join(f"/{p}" for p in error.absolute_path)
        out.append(Problem(loc or "/", error.message))
    return out


def validate_tools_json(path: str, text: str) -> list[Problem]:
    """tools.json against spec/tools.schema.json. Each server is checked against the stdio or
    the remote shape it chose (by `command` or `url`), so the errors name real fields."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        return [Problem(f"line {line}" if line else "/", f"not valid JSON: {exc}")]
    schema = tools_schema()
    top = {**schema, "properties": {**schema["properties"], "mcpServers": {
        **schema["properties"]["mcpServers"], "additionalProperties": True}}}
    problems = _schema_errors(data, top, "")
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        return problems
    variants = schema["$defs"]["server"]["oneOf"]
    for name, server in servers.items():
        where = f"/mcpServers/{name}"
        if not isinstance(server, dict):
            problems.append(Problem(where, "a server must be an object with `command` (stdio) or `url` (remote)"))
            continue
        if "command" in server and "url" in server:
            problems.append(Problem(where, "give either `command` (a stdio server) or `url` (a remote server), not both"))
            continue
        if "command" not in server and "url" not in server:
            problems.append(Problem(where, "a server needs `command` (stdio) or `url` (remote)"))
            continue
        variant = variants[0] if "command" in server else variants[1]
        problems += _schema_errors(server, {**variant, "$defs": schema["$defs"]}, where)
    return problems


def validate_agents_md(path: str, text: str) -> list[Problem]:
    size = len(text.encode("utf-8"))
    if size > AGENTS_MD_MAX_BYTES:
        return [Problem("file", f"AGENTS.md is {size} bytes; at most {AGENTS_MD_MAX_BYTES}: it goes into every "
                                "model call, so move details into skills/ or other files and keep the core rules")]
    return []


# The registry: (path pattern, validator). Every validator whose pattern matches runs.
VALIDATORS: list[tuple[str, Validator]] = [
    (AGENTS_MD, validate_agents_md),
    ("skills/*/SKILL.md", validate_skill),
    ("subagents/*.md", validate_subagent),
    (TOOLS_JSON, validate_tools_json),
]


def problems_for(path: str, text: str) -> list[Problem]:
    return [p for pattern, check in VALIDATORS if _exact(path, pattern) for p in check(path, text)]


def _exact(path: str, pattern: str) -> bool:
    # Registry patterns are anchored at the folder root (`AGENTS.md` is not `docs/AGENTS.md`).
    return matches(path, pattern) if "/" in pattern else path == pattern


def check(files: dict[str, str]) -> None:
    """Raise one 422 listing every problem of every file (path -> new text), or return."""
    found = [p.as_dict(path) for path, text in files.items() for p in problems_for(path, text)]
    if found:
        lines = "; ".join(f"{e['path']} {e['loc']}: {e['message']}" for e in found)
        raise ValidationFailed(f"{len(found)} problem(s), nothing was written: {lines}", {"errors": found})
