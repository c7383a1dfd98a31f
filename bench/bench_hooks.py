"""What an attached agent pays for backchannel: the command hook's round trip and the
MCP server's time to ready.

* **hook round trip** — a real ``backchannel hook RUNTIME`` process per call, as the
  runtime runs it, against a real ``backchannel serve``: process start, payload on
  stdin, the hub's answer on stdout. For each runtime a turn's events in order (its
  session start, prompt, a tool call before and after, the stop), repeated ``--turns``
  times; p50 and p95 per runtime. ``--compare`` also times the full CLI path (what every
  hook cost before the lean path), the full CLI (``backchannel.interfaces.cli``).
* **MCP ready** — ``backchannel mcp`` started over stdio, from process start to the
  answer to ``initialize`` and then to ``tools/list``, ``--mcp-runs`` times.

Targets (DESIGN.md section 7): a command hook answers in <= 100 ms p50; the MCP server
is ready in <= 300 ms. Run: ``.venv/bin/python -m bench.bench_hooks``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ServerProcess, log, percentile
from bench.figures import Figure, Goal, write_results

HOOK_P50_MS = 100.0
MCP_READY_MS = 300.0
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "runtimes" / "fixtures"
TURN = {
    "claude-code": ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"],
    "codex": ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"],
    "gemini": ["SessionStart", "BeforeAgent", "BeforeTool", "AfterTool", "AfterAgent"],
}
KIND = {"claude-code": "claude-code", "codex": "codex", "gemini": "gemini"}
LABEL = {"claude-code": "Claude Code", "codex": "Codex", "gemini": "Gemini CLI"}


def _payload(runtime: str, event: str, session: str) -> str:
    data: dict[str, Any] = json.loads((FIXTURES / runtime / f"{event}.json").read_text())
    data["session_id"] = session
    return json.dumps(data)


def _team(url: str, admin: str) -> dict[str, str]:
    import httpx

    h = {"Authorization": f"Bearer {admin}"}
    tokens = {}
    with httpx.Client(base_url=url, headers=h, timeout=10) as c:
        body = {"name": "hooks", "settings": {"anchor_policy": "off"}}
        c.post("/v1/teams", json=body).raise_for_status()
        for runtime in TURN:
            r = c.post("/v1/teams/hooks/members", json={"name": runtime, "kind": KIND[runtime]})
            r.raise_for_status()
            tokens[runtime] = r.json()["token"]
    return tokens


def _hook_times(command: list[str], runtime: str, env: dict[str, str], turns: int) -> list[float]:
    out = []
    for t in range(turns):
        for event in TURN[runtime]:
            payload = _payload(runtime, event, f"{runtime}-bench-{t}")
            started = time.perf_counter()
            run = subprocess.run(
                [*command, "hook", runtime], input=payload, capture_output=True, text=True,
                env=env, timeout=60,
            )  # fmt: skip
            out.append(time.perf_counter() - started)
            if run.returncode != 0 or run.stderr:
                raise RuntimeError(f"hook {runtime} {event} failed: {run.stderr[:300]}")
    return out


def _mcp_ready(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from process start to the initialize answer and to the tools/list answer."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*command, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1,
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None

    def call(msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()

    def answer(want: int) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the MCP server exited before answering")
            msg: dict[str, Any] = json.loads(line)
            if msg.get("id") == want:
                return msg

    try:
        call({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}},
        })  # fmt: skip
        answer(1)
        ready = time.perf_counter() - started
        call({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = answer(2)
        listed = time.perf_counter() - started
        if not tools.get("result", {}).get("tools"):
            raise RuntimeError(f"tools/list answered {tools}")
        return ready, listed
    finally:
        proc.kill()
        proc.wait()


def _ms(values: list[float], q: float) -> float:
    return percentile(sorted(values), q) * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=20, help="turns per runtime (5 hooks each)")
    p.add_argument("--mcp-runs", type=int, default=10)
    p.add_argument("--compare", action="store_true", help="also time the full CLI path")
    p.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py to PATH")
    args = p.parse_args(argv)
    figures: list[Figure] = []
    raw: dict[str, Any] = {}
    bin_dir = Path(sys.executable).parent
    lean = [str(bin_dir / "backchannel")]
    full = [sys.executable, "-c", "from backchannel.interfaces.cli import main; main()"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="bc-hooks-") as tmp:
        srv = ServerProcess(Path(tmp) / "home", f"sqlite:///{tmp}/hub.db")
        srv.start()
        try:
            tokens = _team(srv.url, srv.admin_token)
            base = {k: v for k, v in os.environ.items() if not k.startswith("BACKCHANNEL_")}
            print(f"\n{'runtime':<12} {'path':<6} {'hooks':>6} {'p50 ms':>8} {'p95 ms':>8}")
            for runtime in TURN:
                env = {**base, "BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens[runtime]}
                paths = [("lean", lean)] + ([("full", full)] if args.compare else [])
                for name, command in paths:
                    times = _hook_times(command, runtime, env, args.turns)
                    p50 = _ms(times, 50)
                    if name == "lean":
                        ok &= p50 <= HOOK_P50_MS
                        figures.append(Figure(f"{LABEL[runtime]} command hook answered, p50", p50,
                                              "ms", Goal("<=", HOOK_P50_MS, "DESIGN §7")))  # fmt: skip
                    raw[f"{runtime} {name}"] = {"p50_ms": p50, "p95_ms": _ms(times, 95)}
                    print(
                        f"{runtime:<12} {name:<6} {len(times):>6} {p50:>8.1f} {_ms(times, 95):>8.1f}"
                    )
            env = {**base, "BACKCHANNEL_URL": srv.url, "BACKCHANNEL_TOKEN": tokens["claude-code"]}
            runs = [_mcp_ready(lean, env) for _ in range(args.mcp_runs)]
            init = [r[0] for r in runs]
            listed = [r[1] for r in runs]
            ok &= _ms(listed, 50) <= MCP_READY_MS
            figures.append(Figure("MCP server ready (tools/list answered), p50", _ms(listed, 50),
                                  "ms", Goal("<=", MCP_READY_MS, "DESIGN §7")))  # fmt: skip
            raw["mcp"] = {"initialize_p50_ms": _ms(init, 50), "tools_list_p50_ms": _ms(listed, 50)}
            print(
                f"\nMCP server over stdio ({args.mcp_runs} starts): initialize answered p50 "
                f"{_ms(init, 50):.0f} ms (p95 {_ms(init, 95):.0f}); tools/list answered p50 "
                f"{_ms(listed, 50):.0f} ms (p95 {_ms(listed, 95):.0f})"
            )
        finally:
            srv.stop()
    print(
        f"targets: hook p50 <= {HOOK_P50_MS:g} ms, MCP ready <= {MCP_READY_MS:g} ms: "
        + ("met" if ok else "MISSED")
    )
    log(f"load average: {os.getloadavg()}")
    write_results(args.results, "hooks", figures, raw)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
