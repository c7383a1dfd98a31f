"""Benchmark: many processes appending to ONE Claude Code inbox file.

    .venv/bin/python bench/bench_inbox.py [--writers 32] [--messages 200] [--node auto|yes|no]

Runs ``--writers`` processes × ``--messages`` appends into one inbox with
:class:`backchannel.delivery.claude_inbox.InboxWriter`, then (if Node.js is available)
the same with a Claude Code-style writer on the real ``proper-lockfile`` package
(``tests/delivery/node_writer.js``), then both kinds half and half. A reader thread
parses the file continuously meanwhile. Prints, per run: wall time, appends/s,
p50/p99 latency of one append, and the counts that matter: appends that failed or
gave up, accepted appends missing from the file (lost), ids present twice
(duplicated) and unparseable reads (corrupt).
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
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(REPO))

from bench.figures import Figure, Goal, write_results  # noqa: E402

NODE_WRITER = REPO / "tests" / "delivery" / "node_writer.js"
NPM_CACHE = REPO / ".cache" / "npm-test"
MODULE = REPO / "src" / "backchannel" / "delivery" / "claude_inbox.py"

# The writer module is loaded from its file, not through the ``backchannel`` package,
# so that 32 processes do not each import the whole hub before their first append.
PY_WRITER = r"""
import importlib.util, json, sys, time
module, root, team, member, writer, count, fsync = sys.argv[1:8]
spec = importlib.util.spec_from_file_location("claude_inbox", module)
claude_inbox = sys.modules["claude_inbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claude_inbox)
InboxWriteError, InboxWriter = claude_inbox.InboxWriteError, claude_inbox.InboxWriter
inbox = InboxWriter(root, deadline_s=60, fsync=fsync == "1")
out = {"writer": writer, "ok": [], "present": [], "errors": [], "latencies_ms": []}
for i in range(int(count)):
    msg_id = f"{writer}-{i}"
    started = time.perf_counter()
    try:
        result = inbox.append(team, member, msg_id=msg_id, from_=writer,
                              text=f"#{i}", color="blue")
    except InboxWriteError as exc:
        out["errors"].append([msg_id, str(exc)])
    else:
        out["ok" if result.written else "present"].append(msg_id)
    out["latencies_ms"].append((time.perf_counter() - started) * 1000)
print(json.dumps(out))
"""


def node_modules(kind: str) -> Path | None:
    """``node_modules`` with proper-lockfile@4 (installed into .cache/npm-test if needed)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if kind == "no" or node is None or npm is None:
        if kind == "yes":
            sys.exit("--node yes: node and npm must be on PATH")
        return None
    modules = NPM_CACHE / "node_modules"
    if not (modules / "proper-lockfile" / "package.json").is_file():
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        (REPO / ".cache" / ".gitignore").write_text("*\n")
        cmd = [
            npm,
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(NPM_CACHE),
            "proper-lockfile@4",
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return modules


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run(
    label: str, kinds: list[str], messages: int, fsync: bool, modules: Path | None, base: str | None
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-inbox-", dir=base))
    path = root / "bench" / "inboxes" / "lead.json"
    path.parent.mkdir(parents=True)
    path.write_text("[]")
    stop, reads = threading.Event(), Counter[str]()

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_bytes())
                reads["ok"] += 1
            except ValueError:
                reads["corrupt"] += 1
            stop.wait(0.01)

    procs = []
    for n, kind in enumerate(kinds):
        if kind == "py":
            cmd = [
                sys.executable,
                "-c",
                PY_WRITER,
                str(MODULE),
                str(root),
                "bench",
                "lead",
                f"py{n}",
                str(messages),
                "1" if fsync else "0",
            ]
        else:
            cmd = ["node", str(NODE_WRITER), str(modules), str(path), f"node{n}", str(messages)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    thread = threading.Thread(target=reader, daemon=True)
    started = time.perf_counter()
    thread.start()
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"a writer failed:\n{err.decode()}")
        results.append(json.loads(out))
    elapsed = time.perf_counter() - started
    stop.set()
    thread.join()
    final = Counter(e.get("msg_id") for e in json.loads(path.read_bytes()))
    shutil.rmtree(root, ignore_errors=True)
    accepted = [m for r in results for m in r["ok"]]
    latencies = [x for r in results for x in r["latencies_ms"]]
    return {
        "run": label,
        "appends": len(kinds) * messages,
        "seconds": elapsed,
        "per_s": len(accepted) / elapsed,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "accepted": len(accepted),
        "failed": sum(len(r.get("errors", [])) + len(r.get("elocked", [])) for r in results),
        "lost": sum(1 for m in accepted if final[m] == 0),
        "duplicated": sum(1 for c in final.values() if c > 1),
        "corrupt": reads["corrupt"],
        "reads": reads["ok"] + reads["corrupt"],
    }


def figures(rows: list[dict[str, Any]]) -> list[Figure]:
    """Nothing lost, duplicated or corrupt (DESIGN §7), for our writer alone and mixed
    with Claude Code's; how fast our writer appends."""
    out = []
    zero = Goal("==", 0, "DESIGN §7")
    for r in rows:
        if r["run"].startswith("InboxWriter"):
            out += [
                Figure("our writer: appends lost", r["lost"], "", zero),
                Figure("our writer: appends duplicated", r["duplicated"], "", zero),
                Figure("our writer: corrupt reads", r["corrupt"], "", zero),
                Figure("our writer: appends per second", r["per_s"], "/s"),
            ]
        elif r["run"].startswith("mixed"):
            bad = r["lost"] + r["duplicated"] + r["corrupt"]
            out.append(Figure("mixed with Claude Code's writer: lost + duplicated + corrupt",
                              bad, "", zero))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writers", type=int, default=32, help="writer processes (default 32)")
    parser.add_argument(
        "--messages", type=int, default=200, help="appends per writer (default 200)"
    )
    parser.add_argument(
        "--node", choices=["auto", "yes", "no"], default="auto", help="also run proper-lockfile"
    )
    parser.add_argument("--runs", default="ours,node,mixed", help="comma list of ours,node,mixed")
    parser.add_argument("--dir", help="where the inbox goes (default: the system temp dir)")
    parser.add_argument(
        "--no-fsync", action="store_true", help="our writer skips fsync (not for production)"
    )
    parser.add_argument("--results", help="write the figures for bench/all.py to this path")
    args = parser.parse_args(argv)
    modules = node_modules(args.node)
    n, m, fsync = args.writers, args.messages, not args.no_fsync
    runs = {
        "ours": ("InboxWriter (ours)", ["py"] * n),
        "node": ("proper-lockfile (Claude Code)", ["node"] * n),
        "mixed": ("mixed: half ours, half node", ["py", "node"] * (n // 2) + ["py"] * (n % 2)),
    }
    rows = []
    for name in args.runs.split(","):
        if name != "ours" and modules is None:
            print(f"skipping {name!r}: node/npm not found")
            continue
        rows.append(run(*runs[name], m, fsync, modules, args.dir))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\n{n} writer processes x {m} appends into one inbox in {args.dir or tempfile.gettempdir()}"
    )
    print(f"{os.cpu_count()} CPUs, load average {load}, our fsync={'on' if fsync else 'off'}\n")
    head = (
        f"{'writer':<30} {'total s':>8} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'accepted':>9} {'failed':>7} {'lost':>5} {'dup':>4} {'corrupt':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['run']:<30} {r['seconds']:>8.1f} {r['per_s']:>10.0f} {r['p50']:>8.1f} {r['p99']:>8.1f} "
            f"{r['accepted']:>9} {r['failed']:>7} {r['lost']:>5} {r['duplicated']:>4} {r['corrupt']:>8}"
        )
    print(
        "\nfailed: ours = InboxWriteError raised (the hub would retry); proper-lockfile = gave up "
        "with ELOCKED, which Claude Code logs and drops.\nlost = accepted but missing from the file; "
        "corrupt = reads of the file (by a concurrent reader) that did not parse."
    )
    write_results(args.results, "inbox", figures(rows), rows)


if __name__ == "__main__":
    main()
