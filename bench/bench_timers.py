"""Timers at scale: many pending, a steady stream firing, lateness after due, memory.

Sets ``--pending`` timers (SQLite, in-process, the hub's own maintenance task firing
them): ``--firing`` of them due at ``--rate`` per second from a moment a little ahead,
the rest far in the future. Lateness is the time from a timer's due time to its
message being committed. Memory (RSS) is read with no timers, and after they are set.

    .venv/bin/python bench/bench_timers.py --pending 100000 --firing 5000 --rate 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from bench.figures import Figure, Goal, write_results

TARGET_P99_MS = 50.0  # a due timer's message committed within 50 ms p99


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(SqliteStore(Path(tmp) / "timers.db"))
        await hub.start()
        try:
            await hub.create_team(
                "t", settings={"anchor_policy": "off", "max_timers": args.pending}
            )
            sessions = []
            for i in range(args.sessions):
                await hub.add_member("t", f"m{i}")
                await hub.open_session("t", f"m{i}", f"m{i}-s")
                sessions.append((f"m{i}", f"m{i}-s"))
            rss_empty = rss_mb()
            start_at = time.time() + args.lead_in
            far = 30 * 24 * 3600.0
            t0 = time.perf_counter()
            marks: dict[int, float] = {}
            batch = []
            for i in range(args.pending):
                member, sid = sessions[i % len(sessions)]
                if i < args.firing:
                    due = start_at + i / args.rate
                    seconds = due - time.time()
                else:
                    seconds = far - i
                batch.append(
                    hub.set_timer("t", member, sid, "anchor", max(seconds, 0.001), f"note {i}")
                )
                if len(batch) >= 500:
                    await asyncio.gather(*batch)
                    batch.clear()
                if i in (args.firing, args.pending // 10, args.pending - 1):
                    marks[i] = rss_mb()
            await asyncio.gather(*batch)
            set_s = time.perf_counter() - t0
            rss_set = rss_mb()
            if time.time() > start_at:
                print(
                    f"warning: setting the timers took {set_s:.1f} s, past the lead-in; raise --lead-in"
                )
            # wait for the firing window to pass, then read each fired timer's lateness
            deadline = start_at + args.firing / args.rate + 10
            fired: list[float] = []
            while time.time() < deadline and len(fired) < args.firing:
                await asyncio.sleep(0.5)
                for member, sid in sessions:
                    got = await hub.receive(
                        "t", member, session=sid, limit=1000, lease_seconds=3600
                    )
                    for g in got:
                        fired.append(g.message.created_at - float(g.message.meta["due_at"]))
                    if got:
                        await hub.ack("t", member, [g.message.message_id for g in got])
            rss_after = rss_mb()
            pending_left = len(await hub.list_timers("t"))
        finally:
            await hub.close()
    late_ms = [x * 1000 for x in fired]
    return {
        "pending_timers": args.pending,
        "fired": len(late_ms),
        "rate_per_s": args.rate,
        "still_pending": pending_left,
        "set_per_s": round(args.pending / set_s),
        "lateness_p50_ms": round(statistics.median(late_ms), 2) if late_ms else None,
        "lateness_p99_ms": round(pct(late_ms, 99), 2) if late_ms else None,
        "lateness_max_ms": round(max(late_ms), 2) if late_ms else None,
        "rss_mb_no_timers": round(rss_empty, 1),
        "rss_mb_by_timers_set": {k: round(v, 1) for k, v in sorted(marks.items())},
        "rss_mb_all_set": round(rss_set, 1),
        "rss_mb_after_firing": round(rss_after, 1),
    }


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pending", type=int, default=100_000, help="timers set in all")
    p.add_argument("--firing", type=int, default=5_000, help="of which due during the run")
    p.add_argument("--rate", type=float, default=1000.0, help="due timers per second")
    p.add_argument("--sessions", type=int, default=100, help="sessions the timers are spread over")
    p.add_argument(
        "--lead-in",
        type=float,
        default=60.0,
        help="seconds before the first is due (setting them up)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py to PATH")
    a = p.parse_args(argv)
    out = asyncio.run(main(a))
    print(json.dumps(out) if a.json else "\n".join(f"{k:>22}: {v}" for k, v in out.items()))
    p99 = out["lateness_p99_ms"]
    figures = [
        Figure("due timer → its message committed, lateness p99",
               None if p99 is None else float(p99), "ms",  # type: ignore[arg-type]
               Goal("<=", TARGET_P99_MS, "bench/README.md"),
               "" if out["fired"] == a.firing else f"{out['fired']} of {a.firing} fired"),
        Figure("hub RSS with every timer set", float(out["rss_mb_all_set"]), "MB"),  # type: ignore[arg-type]
    ]  # fmt: skip
    write_results(a.results, "timers", figures, out)
    return 0 if figures[0].status == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(cli())
