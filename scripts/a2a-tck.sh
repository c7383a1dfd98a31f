#!/usr/bin/env bash
# Run the A2A conformance kit (MUST level, JSON-RPC and HTTP+JSON) against a hub whose
# test-only member tck/sut follows the kit's scenarios. Usage: scripts/a2a-tck.sh KIT_DIR KIT_PYTHON
set -euo pipefail
kit_dir=$1
if [[ ! -f "$kit_dir/run_tck.py" && "$kit_dir" == "../shared/a2a-tck" ]]; then
    # a clone made elsewhere (git clone . /tmp/x): the kit beside the repository it was
    # cloned from, when that is a directory on this machine
    origin=$(git -C "$(dirname "$0")/.." remote get-url origin 2>/dev/null || true)
    if [[ -n "$origin" && -f "$origin/../shared/a2a-tck/run_tck.py" ]]; then
        kit_dir="$origin/../shared/a2a-tck"
    fi
fi
if [[ ! -f "$kit_dir/run_tck.py" ]]; then
    echo "a2a-tck: the A2A conformance kit is not at $1 (expected beside the repository," \
        "or beside the one it was cloned from, as ../shared/a2a-tck); point A2A_TCK at it:" \
        "make a2a-tck A2A_TCK=/path/to/a2a-tck" >&2
    exit 1
fi
kit=$(cd "$kit_dir" && pwd)
kit_python="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.cache/a2a-tck-run"
rm -rf "$work" && mkdir -p "$work" && chmod 700 "$work"
# a private copy: the kit writes its reports next to itself
cp -r "$kit/run_tck.py" "$kit/pyproject.toml" "$kit/tck" "$kit/tests" "$kit/specification" "$work/"
[ -d "$kit/codegen" ] && cp -r "$kit/codegen" "$work/"
port=$("$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$root/.venv/bin/python" -m tests.a2a_tck_sut --port "$port" --home "$work/hub" >"$work/sut.log" 2>&1 &
sut=$!
stop_sut() {
    kill "$sut" 2>/dev/null || return 0
    for _ in $(seq 1 100); do kill -0 "$sut" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$sut" 2>/dev/null || true
}
trap stop_sut EXIT
url="http://127.0.0.1:$port/a2a/tck/sut"
for _ in $(seq 1 200); do
    if curl -sf "$url/.well-known/agent-card.json" >/dev/null; then break; fi
    kill -0 $sut 2>/dev/null || { cat "$work/sut.log"; exit 1; }
    sleep 0.05
done
cd "$work"
"$kit_python" run_tck.py --sut-host "$url" --level must "${@:3}"
