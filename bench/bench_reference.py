"""The hub against autogen-core's in-memory runtime, interleaved in one run.

Issue 24 sets the in-process figure (16 senders, one message at a time, send →
received → acked) at 1.5× autogen-core's in-memory runtime on the same machine. The
machine's speed moves within a day, and the hub's figure by up to a quarter from run to
run (where its threads land), so an absolute figure taken an hour apart says little
about the ratio; this benchmark measures both in alternating rounds
(``--rounds``, the order turned every round) and reports the median of each and the
median of the rounds' ratios. The hub runs twice a round: as it comes, and on one CPU
(``--cpu``, what ``backchannel.pin_to_cpu`` does: its two threads hand work to each
other for less there on a virtual machine). A third run of the hub a round puts it and
its load on the memory store: nothing durable, so not the hub's figure but a bound on it,
what the hub's own work allows with the store's cost taken away.

The issue names batch sends, receives and acks among the ways to the figure, so each
round also runs both sides with batches (``--batch``, 50): the hub's member API in-process
(``bench.bench_batch --inproc``: each sender sends ``--batch`` messages a call, each
receiver acks a batch with its next receive), and autogen-core with each sender making
``--batch`` sends at once (it has no call that sends many). The batch ratio is taken
against the faster of autogen-core's two ways in that round.

- The hub: ``bench.bench_send inproc --rate 0`` (SQLite, every answered send fsynced),
  as a process of its own per round.
- The bound: ``bench.bench_send inproc --rate 0 --store memory``.
- autogen-core: ``bench/reference_autogen.py`` (the same senders, message count, text
  size and event loop; ``send_message`` returns once the receiver's handler ran; nothing
  is written anywhere), run by an interpreter of its own: autogen-core pins a protobuf
  older than the one the hub's A2A extra needs. Its environment is made once under
  ``.cache/bench/autogen`` (``--env``) with the same Python, then reused.

Run from the repository root: ``.venv/bin/python -m bench.bench_reference``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from backchannel.tuning import GC_YOUNG_THRESHOLD
from bench.bench_send import MEMORY_FIGURE
from bench.common import allowed_cpus
from bench.figures import Figure, Goal, machine, machine_line, read_results, write_results

REPO = Path(__file__).resolve().parent.parent
AUTOGEN_CORE = "0.7.5"  # the version measured; pinned so figures compare across days
SCRIPT = REPO / "bench" / "reference_autogen.py"
HUB_FIGURE = "in-process msgs/s, as fast as possible"
BATCH_FIGURE = "in-process batch sends and acks, msgs/s"
RATIO_GOAL = Goal(">=", 1.5, "issue 24")

ISSUE_GOAL = Goal(">=", 10_000, "issue 24")

FIGURES = (
    "autogen-core in memory, 16 senders: msgs/s",
    "in-process msgs/s, the same rounds",
    "in-process on one CPU (pin_to_cpu) msgs/s, the same rounds",
    "in-process ÷ autogen-core in memory, interleaved",
    "in-process on one CPU ÷ autogen-core in memory, interleaved",
    "bound: the hub on the memory store (nothing durable) msgs/s, the same rounds",
    "bound: the hub on the memory store ÷ autogen-core in memory, interleaved",
    "autogen-core in memory, a batch of sends at once a sender: msgs/s",
    "in-process, batches: msgs/s, the same rounds",
    "in-process, batches ÷ autogen-core's faster way, interleaved",
)
SIDES = (
    "hub",
    "hub on one CPU",
    "autogen",
    "hub on the memory store",
    "hub, batches",
    "autogen, batches",
)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _uvloop_pin() -> str:
    try:
        return f"uvloop=={metadata.version('uvloop')}"
    except metadata.PackageNotFoundError:
        return ""


def reference_python(env: Path) -> Path:
    """The interpreter of autogen-core's environment, made on first use (same Python as
    this one). Raises ``RuntimeError`` naming what failed and how to retry."""
    python = env / "bin" / "python"
    wanted = " ".join(filter(None, [f"autogen-core=={AUTOGEN_CORE}", _uvloop_pin()]))
    stamp = env / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    say(f"making autogen-core's environment in {env} (once: {wanted}) ...")
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [
        [base, "-m", "venv", str(env)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *wanted.split()],
    ]  # fmt: skip
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(
                f"{' '.join(cmd[:4])} failed ({'; '.join(tail)}); check that a package "
                f"index is reachable, then run again (or delete {env} to start over)"
            )
    stamp.write_text(wanted)
    return python


def run_reference(python: Path, args: argparse.Namespace, batch: int = 1) -> dict[str, Any]:
    """One run of autogen-core, its garbage collector tuned as the hub's program is
    (``tune_gc``: what the README tells an in-process program to do, and what
    ``bench_send`` does)."""
    cmd = [str(python), str(SCRIPT), "--senders", str(args.senders), "--messages",
           str(args.messages), "--size", str(args.size), "--warmup", str(args.warmup),
           "--gc-young", str(GC_YOUNG_THRESHOLD), "--batch", str(batch)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"autogen-core's run failed: {done.stderr.strip()[-400:]}")
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def run_hub(
    args: argparse.Namespace, scratch: Path, cpu: int | None = None, store: str = "sqlite"
) -> float:
    """One ``bench_send inproc`` run: its msgs/s."""
    results = scratch / "hub.json"
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.bench_send", "inproc", "--rate", "0",
           "--senders", str(args.senders), "--messages", str(args.messages),
           "--size", str(args.size), "--warmup", str(args.warmup),
           "--duration", str(args.duration), "--quiet-wait", "0",
           "--results", str(results)]  # fmt: skip
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    if store != "sqlite":
        cmd += ["--store", store]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO, env=env
    )
    figures = {f.name: f for f in read_results(results)} if results.exists() else {}
    # it exits with 1 when a target is missed
    found = figures.get(HUB_FIGURE if store == "sqlite" else MEMORY_FIGURE)
    if found is None or found.value is None:
        raise RuntimeError(f"the hub's run failed: {done.stderr.strip()[-400:]}")
    return float(found.value)


def run_batches(args: argparse.Namespace, scratch: Path) -> float:
    """One ``bench_batch --inproc`` run: its msgs/s received and acked."""
    results = scratch / "batch.json"
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.bench_batch", "--inproc",
           "--senders", str(args.senders), "--batch", str(args.batch),
           "--size", str(args.size), "--duration", str(args.duration),
           "--warmup", str(max(1, args.warmup // args.batch)), "--results", str(results)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO, env=env
    )
    figures = {f.name: f for f in read_results(results)} if results.exists() else {}
    found = figures.get(BATCH_FIGURE)
    if found is None or found.value is None:
        raise RuntimeError(f"the hub's batch run failed: {done.stderr.strip()[-400:]}")
    return float(found.value)


def measure(args: argparse.Namespace) -> tuple[list[Figure], dict[str, Any]]:
    try:
        python = reference_python(args.env)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        why = f"autogen-core not installed: {exc}"
        return [Figure(name, None, "", skipped=why) for name in FIGURES], {"error": why}
    rounds: list[dict[str, Any]] = []
    cpu = args.hub_cpu if args.hub_cpu is not None else max(allowed_cpus())
    with tempfile.TemporaryDirectory(prefix="bc-bench-ref-") as tmp:
        for k in range(args.rounds):
            turn = k % len(SIDES)  # each side first in turn
            order = SIDES[turn:] + SIDES[:turn]
            got: dict[str, Any] = {}
            for side in order:
                say(f"round {k + 1}/{args.rounds}: {side} ...")
                if side == "hub":
                    got["hub_msgs_s"] = run_hub(args, Path(tmp))
                elif side == "hub on one CPU":
                    got["pinned_msgs_s"] = run_hub(args, Path(tmp), cpu)
                elif side == "hub on the memory store":
                    got["memory_msgs_s"] = run_hub(args, Path(tmp), store="memory")
                elif side == "hub, batches":
                    got["batch_msgs_s"] = run_batches(args, Path(tmp))
                elif side == "autogen, batches":
                    ref = run_reference(python, args, args.batch)
                    got["autogen_batch_msgs_s"] = ref["msgs_s"]
                else:
                    ref = run_reference(python, args)
                    got["autogen_msgs_s"] = ref["msgs_s"]
                    got["autogen_cpu_us"] = ref["cpu_us_per_message"]
                    got["autogen"] = {key: ref[key] for key in ("autogen_core", "loop", "python")}
            got["ratio"] = got["hub_msgs_s"] / got["autogen_msgs_s"]
            got["pinned_ratio"] = got["pinned_msgs_s"] / got["autogen_msgs_s"]
            got["memory_ratio"] = got["memory_msgs_s"] / got["autogen_msgs_s"]
            faster = max(got["autogen_msgs_s"], got["autogen_batch_msgs_s"])
            got["batch_ratio"] = got["batch_msgs_s"] / faster
            say(f"  hub {got['hub_msgs_s']:,.0f} msgs/s, on CPU {cpu} "
                f"{got['pinned_msgs_s']:,.0f}, autogen-core {got['autogen_msgs_s']:,.0f}, "
                f"the hub on the memory store {got['memory_msgs_s']:,.0f}; batches of "
                f"{args.batch}: the hub {got['batch_msgs_s']:,.0f}, autogen-core "
                f"{got['autogen_batch_msgs_s']:,.0f}")  # fmt: skip
            rounds.append(got)
    med = statistics.median
    note = f"median of {len(rounds)} interleaved rounds" if len(rounds) > 1 else "one round"

    def each(key: str, digits: int) -> str:
        return "rounds: " + ", ".join(f"{r[key]:,.{digits}f}" for r in rounds)

    figures = [
        Figure(FIGURES[0], med(r["autogen_msgs_s"] for r in rounds), "msgs/s", None, note),
        Figure(FIGURES[1], med(r["hub_msgs_s"] for r in rounds), "msgs/s", ISSUE_GOAL,
               each("hub_msgs_s", 0)),
        Figure(FIGURES[2], med(r["pinned_msgs_s"] for r in rounds), "msgs/s", ISSUE_GOAL,
               f"CPU {cpu}; {each('pinned_msgs_s', 0)}"),
        Figure(FIGURES[3], med(r["ratio"] for r in rounds), "×", RATIO_GOAL, each("ratio", 2)),
        Figure(FIGURES[4], med(r["pinned_ratio"] for r in rounds), "×", RATIO_GOAL,
               each("pinned_ratio", 2)),
        Figure(FIGURES[5], med(r["memory_msgs_s"] for r in rounds), "msgs/s", None,
               each("memory_msgs_s", 0)),
        Figure(FIGURES[6], med(r["memory_ratio"] for r in rounds), "×", None,
               each("memory_ratio", 2)),
        Figure(FIGURES[7], med(r["autogen_batch_msgs_s"] for r in rounds), "msgs/s", None,
               f"{args.batch} at once; {each('autogen_batch_msgs_s', 0)}"),
        Figure(FIGURES[8], med(r["batch_msgs_s"] for r in rounds), "msgs/s", ISSUE_GOAL,
               f"{args.batch} a call, receive with ack; {each('batch_msgs_s', 0)}"),
        Figure(FIGURES[9], med(r["batch_ratio"] for r in rounds), "×", RATIO_GOAL,
               each("batch_ratio", 2)),
    ]  # fmt: skip
    return figures, {"rounds": rounds, "machine": machine()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="The hub in-process against autogen-core's in-memory runtime, "
        "interleaved (see the module docstring)."
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    p.add_argument("--senders", type=int, default=16)
    p.add_argument("--messages", type=int, default=50_000, help="messages a round")
    p.add_argument("--duration", type=float, default=10.0, help="the hub's seconds at most")
    p.add_argument("--size", type=int, default=256, help="text size in bytes")
    p.add_argument("--warmup", type=int, default=500, help="messages first, not counted")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a run at most")
    p.add_argument(
        "--batch", type=int, default=50, help="messages a call on the batch sides (default 50)"
    )
    p.add_argument(
        "--hub-cpu", type=int, default=None, metavar="N",
        help="the CPU of the pinned hub's runs [the highest this process may use]",
    )  # fmt: skip
    p.add_argument(
        "--env", type=Path, default=REPO / ".cache" / "bench" / "autogen",
        help="autogen-core's environment (made on first use)",
    )  # fmt: skip
    p.add_argument("--results", default=None, help="write the figures as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.hub_cpu is not None and args.hub_cpu not in allowed_cpus():
        raise SystemExit(f"--hub-cpu: CPU {args.hub_cpu} is not one this process may use; "
                         f"pick one of {', '.join(map(str, allowed_cpus()))}")  # fmt: skip
    if args.rounds < 1 or args.senders < 1 or args.batch < 1 or args.messages < args.senders:
        raise SystemExit("--rounds, --senders and --batch must be at least 1, --messages at "
                         "least --senders")  # fmt: skip
    start = machine()
    try:
        figures, raw = measure(args)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        say(f"error: {exc}")
        return 1
    print(machine_line(start, str(machine()["loadavg"])))
    for f in figures:
        value = "skipped" if f.value is None else f"{f.value:,.2f} {f.unit}"
        print(f"{f.name}: {value} ({f.note or f.skipped})")
    write_results(args.results, "reference", figures, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
