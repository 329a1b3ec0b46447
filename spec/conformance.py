"""Black-box conformance runner for the `/amp/v1` wire protocol.

It speaks only HTTP (httpx + the standard library) and imports nothing from the server, so
it can hold any AMP/ampkit server to `spec/SPEC.md`. The cases are data: `spec/vectors/*.json`
(the format is described in `spec/CONFORMANCE.md`).

    python -m ampkit.spec.conformance --base-url http://127.0.0.1:8765/amp/v1
    ampkit conformance --base-url http://127.0.0.1:8765/amp/v1

Prints one line per failed case (case id, step, expected vs got), one line per skipped case,
and ends with `N passed, N failed` (`, N skipped` when any were skipped). Exit status 1 on
any failure.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import secrets
import sys
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Optional

import httpx

AGENT_HEADER = "X-AMP-Agent-ID"
_MISSING = object()
# `{name}`, `{a.b.c}`, `{name+5}`, `{name-25}`, `{created+52d}`, `{created-3s}`
_EXPR = re.compile(r"\{([A-Za-z_][\w.]*)(?:([+-])(\d+(?:\.\d+)?)([ds]?))?\}")


class CaseError(Exception):
    """A step did not get what the vector expects."""


# ---------------------------------------------------------------- loading


def load_cases(vectors_path: Optional[str] = None) -> list[dict[str, Any]]:
    """Every case of the bundled suite, or of one vector file / directory."""
    if vectors_path is None:
        root = resources.files("ampkit.spec").joinpath("vectors")
        files: Iterable[Any] = sorted((f for f in root.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
    else:
        path = Path(vectors_path)
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    cases: list[dict[str, Any]] = []
    for file in files:
        doc = json.loads(file.read_text(encoding="utf-8"))
        for case in doc["cases"]:
            cases.append({**case, "topic": doc.get("topic", file.name)})
    ids = [c["id"] for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    return cases


# ---------------------------------------------------------------- variables


def lookup(variables: dict[str, Any], name: str) -> Any:
    value: Any = variables
    for part in name.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise CaseError(f"unknown variable {{{name}}}")
    return value


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _evaluate(match: re.Match, variables: dict[str, Any]) -> Any:
    name, sign, number, unit = match.groups()
    value = lookup(variables, name)
    if sign is None:
        return value
    delta = float(number) * (-1 if sign == "-" else 1)
    if unit:  # a timestamp shifted by days or seconds
        shift = timedelta(days=delta) if unit == "d" else timedelta(seconds=delta)
        return (_parse_time(value) + shift).isoformat().replace("+00:00", "Z")
    if isinstance(value, int) and delta.is_integer():
        return value + int(delta)
    return value + delta


def resolve(value: Any, variables: dict[str, Any]) -> Any:
    """Substitute `{var}` everywhere; a string that is exactly one `{var}` keeps the value's type."""
    if isinstance(value, str):
        whole = _EXPR.fullmatch(value)
        if whole:
            return _evaluate(whole, variables)
        return _EXPR.sub(lambda m: str(_evaluate(m, variables)), value)
    if isinstance(value, list):
        return [resolve(v, variables) for v in value]
    if isinstance(value, dict):
        if "$repeat" in value:  # {"$repeat": "a", "times": 100} -> "aaaa..."
            return str(resolve(value["$repeat"], variables)) * int(resolve(value["times"], variables))
        return {resolve(k, variables): resolve(v, variables) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- JSON paths


def get_path(doc: Any, path: str) -> Any:
    """`a.b.0.c`; `*` maps over a list (`results.*.id` is the list of ids). `_MISSING` if absent.

    A path starting with `/` is a JSON Pointer (RFC 6901), for keys that contain dots."""
    if path in ("", "$"):
        return doc
    if path.startswith("/"):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
    else:
        parts = path.split(".")
    current, wildcard = [doc], False
    for part in parts:
        following = []
        for item in current:
            if part == "*":
                wildcard = True
                if isinstance(item, list):
                    following.extend(item)
            elif isinstance(item, dict) and part in item:
                following.append(item[part])
            elif isinstance(item, list) and re.fullmatch(r"-?\d+", part) and -len(item) <= int(part) < len(item):
                following.append(item[int(part)])
        current = following
    if wildcard:
        return current
    return current[0] if current else _MISSING


def _show(value: Any) -> str:
    if value is _MISSING:
        return "<absent>"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # JSON true is not 1
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)
    return a == b


# ---------------------------------------------------------------- expectations


def _check_envelope(body: Any, code: str) -> list[str]:
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return [f"expected an error envelope {{'error': {{...}}}} with code {code}, got {_show(body)}"]
    err = body["error"]
    problems = []
    if set(err) != {"code", "message", "details"}:
        problems.append(f"envelope keys: expected code, message, details; got {sorted(err)}")
    if err.get("code") != code:
        problems.append(f"error.code: expected {code}, got {_show(err.get('code'))}")
    if not isinstance(err.get("message"), str) or not err.get("message"):
        problems.append(f"error.message: expected a non-empty string, got {_show(err.get('message'))}")
    if not isinstance(err.get("details"), dict):
        problems.append(f"error.details: expected an object, got {_show(err.get('details'))}")
    return problems


def check(expect: dict[str, Any], response: httpx.Response, body: Any, variables: dict[str, Any]) -> list[str]:
    """Every way the response differs from `expect` (empty: it matches)."""
    expect = resolve(expect, variables)
    problems: list[str] = []
    if "status" in expect and response.status_code != expect["status"]:
        problems.append(f"status: expected {expect['status']}, got {response.status_code} {_show(body)}")
        return problems  # the rest would only repeat it
    if "error" in expect:
        problems += _check_envelope(body, expect["error"])
    if "raw_equals" in expect:
        want = variables.get(expect["raw_equals"])
        if response.content != want:
            problems.append(f"raw body: expected the bytes of {{{expect['raw_equals']}}} {_show(want)}, got {_show(response.content)}")

    def each(key: str):
        for path, want in (expect.get(key) or {}).items():
            yield path, want, get_path(body, path)

    for path, want, got in each("equals"):
        if got is _MISSING or not _equal(got, want):
            problems.append(f"{path}: expected {_show(want)}, got {_show(got)}")
    for path, want, got in each("not_equals"):
        if got is _MISSING or _equal(got, want):
            problems.append(f"{path}: expected a value other than {_show(want)}, got {_show(got)}")
    for path in expect.get("present", []):
        if get_path(body, path) in (_MISSING, None):
            problems.append(f"{path}: expected present (not null), got {_show(get_path(body, path))}")
    for path in expect.get("absent", []):
        if get_path(body, path) not in (_MISSING, None):
            problems.append(f"{path}: expected absent or null, got {_show(get_path(body, path))}")
    for path, pattern, got in each("matches"):
        if not isinstance(got, str) or not re.fullmatch(pattern, got):
            problems.append(f"{path}: expected to match /{pattern}/, got {_show(got)}")
    for path, n, got in each("length"):
        if not isinstance(got, (list, dict, str)) or len(got) != n:
            problems.append(f"{path}: expected length {n}, got {_show(got)}")
    for path, want, got in each("contains"):
        missing = [w for w in _as_list(want) if not isinstance(got, list) or w not in got]
        if missing:
            problems.append(f"{path}: expected to contain {_show(missing)}, got {_show(got)}")
    for path, want, got in each("excludes"):
        found = [w for w in _as_list(want) if isinstance(got, list) and w in got]
        if not isinstance(got, list) or found:
            problems.append(f"{path}: expected a list without {_show(found or want)}, got {_show(got)}")
    for path, want, got in each("same_set"):
        if not isinstance(got, list) or sorted(map(_show, got)) != sorted(map(_show, want)):
            problems.append(f"{path}: expected the same items as {_show(want)}, got {_show(got)}")
    for path, (want, tolerance), got in each("approx"):
        if not isinstance(got, (int, float)) or abs(got - want) > tolerance:
            problems.append(f"{path}: expected {want} +/- {tolerance}, got {_show(got)}")
    for path, bound, got in each("at_least"):
        if not isinstance(got, (int, float)) or got < bound:
            problems.append(f"{path}: expected >= {bound}, got {_show(got)}")
    for path, bound, got in each("at_most"):
        if not isinstance(got, (int, float)) or got > bound:
            problems.append(f"{path}: expected <= {bound}, got {_show(got)}")
    for name, want in (expect.get("headers") or {}).items():
        if response.headers.get(name) != want:
            problems.append(f"header {name}: expected {_show(want)}, got {_show(response.headers.get(name))}")
    return problems


# ---------------------------------------------------------------- running


def _request(client: httpx.Client, step: dict[str, Any], variables: dict[str, Any], agent: Any) -> httpx.Response:
    headers = {str(k): str(v) for k, v in resolve(step.get("headers", {}), variables).items()}
    agent = step.get("agent", agent)
    if agent is not None:
        headers[AGENT_HEADER] = str(resolve(agent, variables))
    content: Optional[bytes] = None
    if "body" in step:
        content = json.dumps(resolve(step["body"], variables), ensure_ascii=False).encode("utf-8")
        headers.setdefault("Content-Type", "application/json")
    elif "raw_body" in step:
        content = str(resolve(step["raw_body"], variables)).encode("utf-8")
    params = {k: v for k, v in resolve(step.get("params", {}), variables).items() if v is not None}
    path = str(resolve(step["path"], variables))
    # Paths are relative to the base URL, unless the step says the path is server-absolute
    # (as /spec advertises manual_run_endpoint).
    url = client.base_url.join(path) if step.get("absolute") else path.lstrip("/")
    return client.request(step["method"], url, params=params or None, content=content, headers=headers)


def _run_step(client: httpx.Client, step: dict[str, Any], variables: dict[str, Any], agent: Any) -> None:
    response = _request(client, step, variables, agent)
    try:
        body: Any = response.json() if response.content else None
    except ValueError:
        body = _MISSING
    problems = check(step.get("expect", {}), response, body, variables)
    if problems:
        raise CaseError("; ".join(problems))
    for name, path in step.get("capture", {}).items():
        value = get_path(body, path)
        if value is _MISSING:
            raise CaseError(f"capture {name}: {path} is absent in {_show(body)}")
        if "repeat" in step:
            variables.setdefault(name, []).append(value)
        else:
            variables[name] = value
    if "capture_raw" in step:
        variables[step["capture_raw"]] = response.content


def run_case(client: httpx.Client, case: dict[str, Any], variables: dict[str, Any]) -> Optional[str]:
    """None when the case passes, else the failure line."""
    agent = case.get("agent")
    for number, step in enumerate(case["steps"], start=1):
        label = f"step {number}" + (f" ({step['name']})" if step.get("name") else "")
        try:
            for i in range(int(step.get("repeat", 1))):
                variables["i"] = i
                _run_step(client, step, variables, agent)
        except CaseError as exc:
            where = f"{step.get('method')} {step.get('path')}"
            return f"FAIL {case['id']} [{case.get('tier', 'MUST')}] {label} {where}: {exc}"
        except httpx.HTTPError as exc:
            return f"FAIL {case['id']} [{case.get('tier', 'MUST')}] {label}: transport error {type(exc).__name__}: {exc}"
    return None


def main(base_url: str, vectors_path: Optional[str] = None, only: Optional[str] = None) -> int:
    """Run the suite against `base_url` (ending in /amp/v1); 0 when every case passes."""
    cases = load_cases(vectors_path)
    if only:
        cases = [c for c in cases if only in c["id"]]
    run = "cf" + secrets.token_hex(4)
    passed = failed = skipped = 0
    with httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=60.0) as client:
        try:
            spec = client.get("spec").raise_for_status().json()
        except (httpx.HTTPError, ValueError) as exc:
            print(f"FAIL setup: GET {base_url}/spec did not answer a JSON document: {exc}")
            print("0 passed, 1 failed")
            return 1
        extensions = set(spec.get("capabilities", {}).get("extensions", []))
        for number, case in enumerate(cases):
            missing = [r for r in case.get("requires", []) if r not in extensions]
            if missing:
                print(f"SKIP {case['id']}: server does not advertise {', '.join(missing)}")
                skipped += 1
                continue
            variables = {"run": run, "uid": f"{run}x{number}", "spec": spec, "caps": spec.get("capabilities", {})}
            failure = run_case(client, case, variables)
            if failure is None:
                passed += 1
            else:
                print(failure)
                failed += 1
    summary = f"{passed} passed, {failed} failed"
    print(summary + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


def cli(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampkit.spec.conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8765/amp/v1")
    parser.add_argument("--vectors", default=None, help="a vector file or directory [default: the bundled suite]")
    parser.add_argument("--only", default=None, help="run only cases whose id contains this text")
    args = parser.parse_args(argv)
    return main(args.base_url, args.vectors, args.only)


if __name__ == "__main__":
    sys.exit(cli())
