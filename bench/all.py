"""Every benchmark, one after the other, and one table of what they measured.

Each benchmark runs as a process of its own with its default sizes (``--quick``: small
sizes, to check the harness itself; the figures then mean nothing), writes its figures
with ``--results`` and its output to a log; then one table shows, per figure, the
value, its unit, the target from DESIGN.md section 7 or issue 24, and whether the
target was met (``pass``) or not (``short``), with the machine it ran on. A benchmark
that failed leaves its figures ``missing`` (its log says why); one whose prerequisite
(Node.js, PostgreSQL) is not installed leaves them ``skipped``.

Run from the repository root: ``make bench`` (``make bench-quick``), or
``.venv/bin/python bench/all.py --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(REPO))

from bench.bench_reference import FIGURES as REFERENCE_FIGURES  # noqa: E402
from bench.bench_send import THREAD_FIGURES  # noqa: E402
from bench.figures import (  # noqa: E402
    Figure,
    Goal,
    machine,
    machine_line,
    read_results,
    summary,
    table,
)

Parser = Callable[[str], list[Figure]]


@dataclass(frozen=True)
class Bench:
    """One benchmark: how to run it (full and quick) and the figures it must give."""

    name: str
    command: str  # the interpreter's arguments
    figures: tuple[str, ...]
    quick: str = ""  # added in quick mode ({scratch}: a directory of its own)
    needs: str = ""  # "node" or "postgres"
    full_only: bool = False
    timeout: float = 1800.0  # seconds, full size
    parse: Parser | None = None  # figures from the output, for a test that prints them
    sizes: str = ""  # what the full run measures, for the table's footnotes

    def args(self, quick: bool, results: Path, scratch: Path) -> list[str]:
        extra = self.quick.replace("{scratch}", str(scratch)) if quick else ""
        out = shlex.split(self.command) + shlex.split(extra)
        if self.parse is None:
            out += ["--results", str(results)]
        return out


# -- figures printed by the slow tests that measure them ------------------------------------------


def _seconds(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def parse_crash(text: str) -> list[Figure]:
    back = _seconds(r"serving again ([0-9.]+) s after", text)
    return [
        Figure("kill -9 mid-stream → serving again", back, "s", Goal("<=", 2, "DESIGN §7"),
               "" if back is not None else "the test failed; see its log"),
    ]  # fmt: skip


def parse_failover(text: str) -> list[Figure]:
    out = []
    for kind, label in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        took = _seconds(rf"{kind}: failover ([0-9.]+) s from kill -9", text)
        out.append(Figure(f"{label}: kill -9 of the pushing hub → the other's first push",
                          took, "s", None, "" if took is not None else "not printed"))  # fmt: skip
    return out


HTTP_RATES = "0,100,1000,3000"
PYTEST = "-m pytest -q -s -p no:randomly -p no:cacheprovider"

BENCHES: tuple[Bench, ...] = (
    Bench(
        "send in-process",
        "-m bench.bench_send inproc",
        quick="--messages 2000 --duration 1 --warmup 100 --quiet-wait 0",
        figures=(
            "in-process msgs/s, as fast as possible",
            *THREAD_FIGURES.values(),
            "in-process p99 send→delivered at 1,000 msgs/s",
        ),
        sizes="16 senders, 50,000 messages or 10 s a phase, as fast as possible and at 1,000/s",
    ),
    Bench(
        "in-process against autogen-core",
        "-m bench.bench_reference",
        quick="--rounds 1 --messages 2000 --duration 1 --warmup 100",
        figures=REFERENCE_FIGURES,
        sizes="3 rounds, each running the hub, the hub on one CPU, autogen-core (in an "
        "environment of its own) and the hub on the memory store, the order turned each "
        "round: 16 senders one message at a time, 50,000 messages (the hub: or 10 s); then "
        "the hub's member API and autogen-core with batches of 50",
    ),
    Bench(
        "send HTTP",
        f"-m bench.bench_send http --client raw --rate {HTTP_RATES}",
        quick="--messages 2000 --duration 1 --warmup 100 --overrun 2 --drain-timeout 10 "
        "--quiet-wait 0",
        figures=(
            "HTTP msgs/s, as fast as possible",
            "HTTP p50 send at 100 msgs/s",
            "HTTP p50 send at 1,000 msgs/s",
            "HTTP p99 send→delivered at 1,000 msgs/s",
            "HTTP p50 send at 3,000 msgs/s",
            "HTTP msgs/s delivered at 3,000 msgs/s offered",
        ),
        sizes="16 senders over HTTP (raw client), 10 s a phase, at 0/100/1,000/3,000 msgs/s",
    ),
    Bench(
        "send HTTP, batches",
        "-m bench.bench_batch",
        quick="--senders 4 --batch 10 --duration 1 --warmup 0.5",
        figures=("HTTP batch sends and acks, msgs/s", "HTTP batch send→received, p99"),
        sizes="16 senders posting batches of 50, receivers acking in batches, 10 s",
    ),
    Bench(
        "send in-process, batches",
        "-m bench.bench_batch --inproc",
        quick="--senders 4 --batch 10 --duration 1 --warmup 0.5",
        figures=(
            "in-process batch sends and acks, msgs/s",
            "in-process batch send→received, p99",
        ),
        sizes="16 senders sending batches of 50 on the member API, receivers acking, 10 s",
    ),
    Bench(
        "send wake-up",
        "-m bench.bench_send wakeup",
        quick="--samples 20 --wake-warmup 2 --quiet-wait 0",
        figures=(
            "in-process receive: waiting receiver woken, p99",
            "HTTP long-poll: waiting receiver woken, p99",
        ),
        sizes="2,000 messages one at a time to a blocked receiver",
    ),
    Bench(
        "floors",
        "-m bench.bench_floors",
        quick="--calls 300 --seconds 0.5",
        figures=(
            "event loop → thread → event loop, CPU",
            "SQLite commit of one row, synchronous=FULL, CPU",
            "SQLite commit of one row, synchronous=NORMAL, CPU",
            "SQLite store: empty transaction, one at a time, CPU",
            "the hub's own work: a send, CPU a message",
            "the hub's own work: receive and ack, 2 at a time, CPU a message",
            "HTTP request to a bare ASGI app, server CPU",
            "HTTP GET /healthz, server CPU",
            "HTTP receive finding nothing, server CPU",
            "HTTP send, server CPU",
            "HTTP request to a bare ASGI app at a low rate, server CPU",
            "HTTP send at a low rate, server CPU",
        ),
        sizes="5,000 round trips and transactions; 5 s of each request at 16 connections, "
        "as fast as the server answers and at 200 requests/s",
    ),
    Bench(
        "growth",
        "-m bench.bench_growth",
        quick="--messages 2000 --sessions 100 --links 200 --agents 10 --duration 1 "
        "--cache {scratch}/growth-cache",
        figures=(
            *(
                f"{phase}: {what}"
                for phase in ("in-process K=1", "HTTP K=1", "in-process K=16", "HTTP K=16")
                for what in ("empty msgs/s ÷ grown", "grown send p50 ÷ empty")
            ),
            "grown hub's peak RSS (HTTP)",
        ),
        timeout=3600.0,
        sizes="1,000,000 messages, 10,000 sessions, 20,000 links against an empty hub; 8 s a phase",
    ),
    Bench(
        "receivers",
        "-m bench.bench_receivers",
        quick="--receivers 20 --samples 20",
        figures=(
            "long-poll, every receiver held: p99 send→received",
            "long-poll: server memory per held receiver",
            "SSE, every receiver held: p99 send→received",
            "SSE: server memory per held receiver",
        ),
        sizes="1,000 receivers held, 500 messages to one of them at random",
    ),
    Bench(
        "hooks",
        "-m bench.bench_hooks",
        quick="--turns 1 --mcp-runs 1",
        figures=(
            "Claude Code command hook answered, p50",
            "Codex command hook answered, p50",
            "Gemini CLI command hook answered, p50",
            "MCP server ready (tools/list answered), p50",
        ),
        sizes="20 turns of 5 hook processes per runtime; 10 MCP starts",
    ),
    Bench(
        "timers",
        "bench/bench_timers.py",
        quick="--pending 500 --firing 100 --rate 200 --sessions 5 --lead-in 3",
        figures=(
            "due timer → its message committed, lateness p99",
            "hub RSS with every timer set",
        ),
        sizes="100,000 timers pending, 5,000 of them due at 1,000/s",
    ),
    Bench(
        "links",
        "bench/bench_links.py",
        quick="--links 5 --samples 50",
        figures=("agent_stop → crossing deliverable to the peer, p99", "crossings per second"),
        sizes="100 open links, 2,000 crossings, 10 at once",
    ),
    Bench(
        "inbox files",
        "bench/bench_inbox.py",
        quick="--writers 4 --messages 20",
        figures=(
            "our writer: appends lost",
            "our writer: appends duplicated",
            "our writer: corrupt reads",
            "our writer: appends per second",
        ),
        sizes="32 writer processes × 200 appends into one inbox (and mixed with Node.js's)",
    ),
    Bench(
        "inbox fairness",
        "bench/bench_inbox_fair.py",
        quick="--node-writers 2 --messages 5 --rounds 1",
        figures=(
            "Claude Code's ELOCKED rate, its writers only",
            "Claude Code's ELOCKED rate, the hub's writer in place of one",
            "ELOCKED rate with the hub's writer − without",
            "appends lost or duplicated",
        ),
        needs="node",
        sizes="9 Claude Code-style writers against 8 + the hub's, 60 appends each, 3 rounds",
    ),
    Bench(
        "PostgreSQL, two hubs",
        "-m bench.bench_postgres",
        quick="--duration 1 --rate 0 --warmup 50 --samples 20 --wake-warmup 2 --quiet-wait 0",
        figures=(
            "two hubs: msgs/s, as fast as possible",
            "two hubs: messages lost or duplicated",
            "send on hub A → receiver on hub B woken, p99",
            "send on hub A → receiver on hub A woken, p99",
        ),
        needs="postgres",
        sizes="16 senders across two hubs, 10 s a phase; 300 cross-hub wake-ups",
    ),
    Bench(
        "push, PostgreSQL and SQLite",
        "-m bench.bench_push",
        quick="--messages 200 --members 4",
        figures=tuple(
            f"push {store}, {how}: {what}"
            for store in ("PostgreSQL", "SQLite")
            for how in ("sending and pushing", "pushes alone (a backlog)")
            for what in ("pushed/s", "transactions a message")
        ),
        needs="postgres",
        sizes="8 webhook members, 16 senders, 4,000 messages; then a backlog of 4,000",
    ),
    Bench(
        "crash (slow test)",
        f"{PYTEST} tests/test_durability.py::test_kill_9_loses_no_answered_send",
        figures=("kill -9 mid-stream → serving again",),
        full_only=True,
        parse=parse_crash,
        sizes="50,000 messages from 8 senders over HTTP, kill -9 after 25,000",
    ),
    Bench(
        "push failover (slow test)",
        f"{PYTEST} tests/stores/test_dispatch_failover.py",
        figures=(
            "SQLite: kill -9 of the pushing hub → the other's first push",
            "PostgreSQL: kill -9 of the pushing hub → the other's first push",
        ),
        full_only=True,
        parse=parse_failover,
        sizes="two hubs, --dispatch-lease 2, a paced stream to a webhook member",
    ),
)


# -- running them -------------------------------------------------------------------------------


def missing_prerequisite(needs: str) -> str:
    """Why a benchmark cannot run here ("" when it can)."""
    if needs == "node" and not (shutil.which("node") and shutil.which("npm")):
        return "Node.js and npm not found"
    if needs == "postgres" and not os.environ.get("BACKCHANNEL_TEST_POSTGRES_URL"):
        try:
            from tests.pg_harness import find_bindir

            find_bindir()
        except Exception:
            return "no PostgreSQL (pgserver, /usr/lib/postgresql or a test server URL)"
    return ""


@dataclass
class Outcome:
    bench: Bench
    figures: list[Figure] = field(default_factory=list)
    seconds: float = 0.0
    log: Path | None = None
    error: str = ""


def complete(bench: Bench, got: Sequence[Figure], why_missing: str) -> list[Figure]:
    """``got`` in the order the benchmark declares its figures: those it did not give are
    ``missing`` (with ``why_missing``); any it gave beyond those come after."""
    by_name = {f.name: f for f in got}
    out = [
        by_name.pop(name) if name in by_name else Figure(name, None, "", note=why_missing)
        for name in bench.figures
    ]
    return out + list(by_name.values())


def skipped(bench: Bench, why: str) -> list[Figure]:
    return [Figure(name, None, "", skipped=why) for name in bench.figures]


def run_one(bench: Bench, quick: bool, out: Path, timeout: float) -> Outcome:
    """Run ``bench`` in a process group of its own; bounded by ``timeout`` seconds."""
    slug = re.sub(r"[^a-z0-9]+", "-", bench.name.lower()).strip("-")
    results, log_path = out / f"{slug}.json", out / f"{slug}.log"
    scratch = out / f"{slug}-scratch"
    scratch.mkdir(exist_ok=True)
    cmd = [sys.executable, *bench.args(quick, results, scratch)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    outcome = Outcome(bench, log=log_path)
    started = time.monotonic()
    with log_path.open("wb") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
            outcome.error = f"stopped after {timeout:.0f} s"
    outcome.seconds = time.monotonic() - started
    shutil.rmtree(scratch, ignore_errors=True)
    got: list[Figure] = []
    if bench.parse is not None:
        got = [f for f in bench.parse(log_path.read_text(errors="replace")) if f.value is not None]
        if code != 0:  # printed, then an assertion failed: the figure stands, flagged
            got = [dataclasses.replace(f, note=f"the test exited with {code}") for f in got]
    elif results.exists():
        try:
            got = read_results(results)
        except (ValueError, KeyError) as exc:
            outcome.error = outcome.error or f"unreadable results: {exc}"
    if not outcome.error and not got:
        outcome.error = f"exited with {code} and gave no figures"
    outcome.figures = complete(bench, got, outcome.error or "not measured; see the log")
    return outcome


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the benchmark's own process group (its servers too), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def select(names: Sequence[str] | None, skip: Sequence[str]) -> list[Bench]:
    def key(s: str) -> str:
        return re.sub(r"[^a-z0-9]+", "", s.lower())

    known = {key(b.name): b for b in BENCHES}
    for n in [*(names or ()), *skip]:
        if not any(k.startswith(key(n)) for k in known):
            raise SystemExit(f"no benchmark {n!r}; there are: {', '.join(b.name for b in BENCHES)}")
    chosen = [b for b in BENCHES if not names or any(key(b.name).startswith(key(n)) for n in names)]
    return [b for b in chosen if not any(key(b.name).startswith(key(n)) for n in skip)]


def report(outcomes: Sequence[Outcome], start: dict[str, object], quick: bool, out: Path) -> str:
    results = [(o.bench.name, o.figures) for o in outcomes]
    end = machine()
    lines = [
        "quick mode: small sizes, to check the harness; the figures mean nothing"
        if quick
        else "full sizes (bench/README.md keeps the figures with the machine they came from)",
        machine_line(start, str(end["loadavg"])),
        "",
        table(results),
        "",
        summary(results),
        "",
    ]
    for o in outcomes:
        how = f"{o.seconds:.0f} s" if o.log is not None else "not run"
        sizes = "" if quick or not o.bench.sizes else f"; {o.bench.sizes}"
        lines.append(f"- {o.bench.name}: {how}{sizes}" + (f" ({o.error})" if o.error else ""))
    lines.append(f"logs and each benchmark's results: {out}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python bench/all.py",
        description=__doc__.split("\n\n")[0],
        epilog="benchmarks: " + "; ".join(b.name for b in BENCHES),
    )
    p.add_argument("--quick", action="store_true", help="small sizes: checks the harness only")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run these benchmarks (by name)")
    p.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="leave these out")
    p.add_argument("--out", metavar="DIR", help="where the logs go [a new temporary directory]")
    p.add_argument("--results", metavar="PATH", help="also write every figure as JSON to PATH")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds each benchmark may take at most "
        "[its own limit; 300 in quick mode]",
    )  # fmt: skip
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when a figure is short of its target too"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    benches = select(args.only, args.skip)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bc-bench-all-"))
    out.mkdir(parents=True, exist_ok=True)
    start = machine()
    print(machine_line(start), file=sys.stderr, flush=True)
    outcomes: list[Outcome] = []
    for bench in benches:
        if args.quick and bench.full_only:
            outcomes.append(Outcome(bench, skipped(bench, "full run only")))
            continue
        why = missing_prerequisite(bench.needs)
        if why:
            outcomes.append(Outcome(bench, skipped(bench, why)))
            continue
        timeout = args.timeout or (300.0 if args.quick else bench.timeout)
        print(f"[{bench.name}] ...", file=sys.stderr, flush=True)
        o = run_one(bench, args.quick, out, timeout)
        print(f"[{bench.name}] {o.seconds:.0f} s{' — ' + o.error if o.error else ''}",
              file=sys.stderr, flush=True)  # fmt: skip
        outcomes.append(o)
    print(report(outcomes, start, args.quick, out))
    if args.results:
        Path(args.results).write_text(
            json.dumps(
                {
                    "quick": args.quick,
                    "machine": start,
                    "loadavg_at_end": machine()["loadavg"],
                    "benchmarks": {
                        o.bench.name: [f.to_json() for f in o.figures] for o in outcomes
                    },
                },
                indent=1,
            )
            + "\n"
        )
    figures = [f for o in outcomes for f in o.figures]
    if any(f.status == "missing" for f in figures):
        return 2
    if args.strict and any(f.status == "short" for f in figures):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
