#!/usr/bin/env bash
# Each framework extra alone is a working install: for [langchain], [llamaindex], [crewai] and
# [autogen], a clean virtual environment installs the built wheel with that one extra and runs
# that framework's example against a real `ampkit serve` (and in process on SQLite, which
# needs no server extra), and the `ampkit` command names the extra it lacks.
# Called by .ci/run after the main tests; pip's cache is reused between runs. Prints the wall
# time per extra. Usage: .ci/extras.sh [extra ...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-python3}
SERVER_PY=${SERVER_PY:-$ROOT/.venv/bin/python}   # has ampkit[server] (make test installed it)
EXTRAS=("${@:-langchain llamaindex crewai autogen}")
read -r -a EXTRAS <<<"${EXTRAS[*]}"

work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
# CrewAI writes under $HOME on import and at kickoff; keep it in the throwaway dir.
export CREWAI_DISABLE_TELEMETRY=true CREWAI_TRACING_ENABLED=false OTEL_SDK_DISABLED=true
mkdir -p "$work/home"

t0=$(date +%s)
# README's install from a checkout: `make dist`, then pip install 'dist/ampkit-<version>-py3-none-any.whl[extra]'.
make -s dist DIST="$work/dist" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# A build warning (a data directory missing from `packages`, say) is an error in a later setuptools.
if grep -i "warning" "$work/build.log"; then echo "the wheel build warned (above)"; exit 1; fi
wheel=$(ls "$work"/dist/ampkit-*.whl)
echo "built $(basename "$wheel") in $(( $(date +%s) - t0 ))s"

port=$("$SERVER_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port/amp/v1
"$SERVER_PY" -m ampkit.cli serve --port "$port" --store "sqlite:///$work/memory.db" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 150); do
  "$SERVER_PY" -c 'import httpx, sys; httpx.get(sys.argv[1]).raise_for_status()' "$url/health" 2>/dev/null && break
  sleep 0.2
done

check_extra() {  # one extra, in its own venv; output in $work/$1.log
  local extra=$1 venv=$work/venv-$1 t out
  t=$(date +%s)
  run() { HOME=$work/home XDG_DATA_HOME=$work/home/data CREWAI_STORAGE_DIR=$work/crewai-$extra "$venv/bin/python" "$@"; }
  {
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "${wheel}[$extra]"
    echo "--- example against the server"
    AMPKIT_URL=$url run "examples/${extra}_agent.py"
    echo "--- example in process (sqlite:///, no server extra)"
    run "examples/${extra}_agent.py"
    echo "--- the ampkit command names the missing extra"
    # (click itself may be there: llama-index and crewai depend on it)
    if out=$(timeout 60 "$venv/bin/ampkit" serve --port 0 2>&1); then echo "ampkit served without the server extra?"; false; fi
    echo "$out"
    grep -q "the server extra" <<<"$out"
  } >"$work/$extra.log" 2>&1 || { echo "[$extra] FAILED in $(( $(date +%s) - t ))s"; grep -v "^WARNING: Location" "$work/$extra.log"; return 1; }
  echo "[$extra] ok in $(( $(date +%s) - t ))s"
}

# The extras install side by side (downloads and unpacking overlap; pip's cache is shared).
pids=()
for extra in "${EXTRAS[@]}"; do
  check_extra "$extra" & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
echo "extras total: $(( $(date +%s) - t0 ))s"
exit $status
