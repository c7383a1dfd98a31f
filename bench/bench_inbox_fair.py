"""Benchmark: does the hub's inbox writer make Claude Code's own appends give up more?

    .venv/bin/python bench/bench_inbox_fair.py [--node-writers 8] [--messages 60] [--rounds 3]

Claude Code's writer (``proper-lockfile``, ``retries: {retries: 10, minTimeout: 5,
maxTimeout: 100}``, stale 10 s) gives up with ``ELOCKED`` when it cannot take the inbox
lock within its ~655 ms of retries, and the message is lost. Two set-ups, alternated
``--rounds`` times so the machine's load falls on both alike:

* ``claude x 9``: 9 Claude Code-style writers (``tests/delivery/node_writer.js``, real
  proper-lockfile) append ``--messages`` each into one inbox;
* ``claude x 8 + hub``: 8 of them plus the hub's ``InboxWriter`` (fsync on, as ``serve``
  runs it) appending ``--messages`` of its own, back to back.

Fair means the Claude Code writers' ELOCKED rate in the second set-up is no higher than
in the first: the hub's writer takes the lock no more often than one more Claude Code
writer would. Give-ups are rare (a few in a thousand appends), so one more or fewer moves
the rate; the difference is judged against the 95 % noise of the two counts (two
proportions, pooled), not against zero. Prints each round and the totals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.figures

from bench.bench_inbox import MODULE, NODE_WRITER, PY_WRITER, node_modules
from bench.figures import Figure, Goal, write_results


def one_run(
    modules: Path, base: Path, node_writers: int, hub: bool, messages: int
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="fair-", dir=base))
    inbox = root / "t" / "inboxes" / "lead.json"
    inbox.parent.mkdir(parents=True)
    inbox.write_text("[]")
    procs = []
    for n in range(node_writers):
        cmd = ["node", str(NODE_WRITER), str(modules), str(inbox), f"cc{n}", str(messages)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    if hub:
        cmd = [sys.executable, "-c", PY_WRITER, str(MODULE), str(root), "t", "lead", "hub",
               str(messages), "1"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    started = time.monotonic()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=110)
        if p.returncode != 0:
            sys.exit(f"a writer failed: {err.decode()}")
        results.append(json.loads(out))
    elapsed = time.monotonic() - started
    cc = [r for r in results if r["writer"].startswith("cc")]
    ours = [r for r in results if r["writer"] == "hub"]
    final = json.loads(inbox.read_text())
    ids = [e.get("msg_id") for e in final]
    return {
        "elapsed": elapsed,
        "cc_attempts": sum(len(r["ok"]) + len(r["elocked"]) for r in cc),
        "cc_elocked": sum(len(r["elocked"]) for r in cc),
        "hub_ok": sum(len(r["ok"]) for r in ours),
        "hub_failed": sum(len(r["errors"]) for r in ours),
        "lost": sum(1 for r in results for m in r["ok"] if m not in ids),
        "duplicated": len(ids) - len(set(ids)),
    }


def figures(totals: dict[str, dict[str, float]], n: int) -> list[Figure]:
    """Claude Code's give-up rate with the hub's writer against one more of its own."""
    alone, shared = totals[f"claude x {n + 1}"], totals[f"claude x {n} + hub"]

    def pct(t: dict[str, float]) -> float:
        return 100 * t["cc_elocked"] / max(1, t["cc_attempts"])

    bad = sum(t["lost"] + t["duplicated"] for t in (alone, shared))
    noise = noise_points(alone, shared)
    fair = Goal("<=", round(noise, 2), "fair: no higher, within the 95 % noise of the counts")
    return [
        Figure("Claude Code's ELOCKED rate, its writers only", pct(alone), "%"),
        Figure("Claude Code's ELOCKED rate, the hub's writer in place of one", pct(shared), "%"),
        Figure("ELOCKED rate with the hub's writer − without",
               pct(shared) - pct(alone), "points", fair),
        Figure("appends lost or duplicated", bad, "", Goal("==", 0, "DESIGN §7")),
    ]  # fmt: skip


def noise_points(a: dict[str, float], b: dict[str, float]) -> float:
    """1.96 standard errors of the difference of two give-up rates, in points: what
    chance alone moves it by, 95 times in 100 (0 when neither set-up gave up)."""
    n1, n2 = max(1.0, a["cc_attempts"]), max(1.0, b["cc_attempts"])
    p = (a["cc_elocked"] + b["cc_elocked"]) / (n1 + n2)
    return 100 * 1.96 * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--node-writers", type=int, default=8)
    parser.add_argument("--messages", type=int, default=60, help="appends per writer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where the inboxes go (default: the system temp dir)")
    parser.add_argument("--results", help="write the figures for bench/all.py to this path")
    args = parser.parse_args(argv)
    modules = node_modules("yes")
    assert modules is not None
    base = Path(args.dir or tempfile.gettempdir())
    n = args.node_writers
    totals: dict[str, dict[str, float]] = {}
    print(f"{n + 1} writers x {args.messages} appends into one inbox under {base}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for r in range(args.rounds):
        for label, cc, hub in (
            (f"claude x {n + 1}", n + 1, False),
            (f"claude x {n} + hub", n, True),
        ):
            res = one_run(modules, base, cc, hub, args.messages)
            t = totals.setdefault(label, dict.fromkeys(res, 0.0))
            for k, v in res.items():
                t[k] += v
            rate = res["cc_elocked"] / max(1, res["cc_attempts"])
            print(f"round {r + 1} {label:18} {res['elapsed']:6.1f} s  claude ELOCKED "
                  f"{res['cc_elocked']:4d}/{res['cc_attempts']:4d} = {rate:6.1%}  hub wrote "
                  f"{res['hub_ok']:3d}, failed {res['hub_failed']}  lost {res['lost']}  "
                  f"duplicated {res['duplicated']}")  # fmt: skip
    print()
    for label, t in totals.items():
        rate = t["cc_elocked"] / max(1, t["cc_attempts"])
        print(f"total {label:18} claude ELOCKED {int(t['cc_elocked'])}/{int(t['cc_attempts'])} "
              f"= {rate:.1%}; hub failed {int(t['hub_failed'])}; lost {int(t['lost'])}; "
              f"duplicated {int(t['duplicated'])}")  # fmt: skip

    write_results(args.results, "inbox_fair", figures(totals, n), totals)


if __name__ == "__main__":
    main()
