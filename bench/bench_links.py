"""agent_stop -> the peer's input deliverable, with many active links (SQLite, in-process).

For each sample one side of a link finishes a turn; the latency is from the moment its
``agent_stop`` is reported to the moment the crossing can be leased by the peer's session
(its commit). Samples run from ``--concurrency`` links at once.

    .venv/bin/python bench/bench_links.py --links 100 --samples 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

TARGET_P99_MS = 20.0  # DESIGN §7: a waiting agent gets a message within 20 ms p99


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def main(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        hub = Hub(SqliteStore(Path(tmp) / "links.db"))
        await hub.start()
        try:
            await hub.create_team("t", settings={"anchor_policy": "off", "link_budget": 1000})
            pairs = []
            for i in range(args.links):
                a, b = f"a{i}", f"b{i}"
                for m in (a, b):
                    await hub.add_member("t", m)
                    await hub.open_session("t", m, f"{m}-s")
                await hub.report_event("t", a, f"{a}-s", "turn_start")
                await hub.send("t", a, b, "let's work", sender_session=f"{a}-s")
                await hub.report_event("t", a, f"{a}-s", "agent_stop", "")
                got = await hub.receive("t", b, session=f"{b}-s", limit=10)
                await hub.ack("t", b, [g.message.message_id for g in got])
                got = await hub.receive("t", a, session=f"{a}-s", limit=10)
                await hub.ack("t", a, [g.message.message_id for g in got])
                pairs.append((a, b))
            assert len(await hub.list_links("t", open_only=True)) == args.links

            latencies: list[float] = []
            per_link = max(1, args.samples // args.links)

            async def drive(a: str, b: str) -> None:
                for n in range(per_link):
                    sender, peer = (b, a) if n % 2 == 0 else (a, b)
                    await hub.report_event("t", sender, f"{sender}-s", "turn_start")
                    t0 = time.perf_counter()
                    await hub.report_event(
                        "t", sender, f"{sender}-s", "agent_stop", f"turn {n} of {sender}"
                    )
                    got = await hub.receive("t", peer, session=f"{peer}-s", limit=10)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    if not got or got[0].message.kind.value != "link":
                        raise RuntimeError(f"the crossing was not deliverable: {got}")
                    await hub.ack("t", peer, [g.message.message_id for g in got])

            sem = asyncio.Semaphore(args.concurrency)

            async def limited(a: str, b: str) -> None:
                async with sem:
                    await drive(a, b)

            started = time.perf_counter()
            await asyncio.gather(*(limited(a, b) for a, b in pairs))
            elapsed = time.perf_counter() - started
        finally:
            await hub.close()
    return {
        "links": args.links,
        "samples": len(latencies),
        "concurrency": args.concurrency,
        "crossings_per_s": round(len(latencies) / elapsed),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(pct(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
    }


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--links", type=int, default=100, help="active links (pairs of sessions)")
    p.add_argument("--samples", type=int, default=2000, help="crossings to measure")
    p.add_argument("--concurrency", type=int, default=10, help="links crossing at once")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py to PATH")
    a = p.parse_args(argv)
    out = asyncio.run(main(a))
    print(json.dumps(out) if a.json else "\n".join(f"{k:>16}: {v}" for k, v in out.items()))
    p99 = float(out["p99_ms"])  # type: ignore[arg-type]
    figures = [
        Figure("agent_stop → crossing deliverable to the peer, p99", p99, "ms",
               Goal("<=", TARGET_P99_MS, "DESIGN §7")),
        Figure("crossings per second", float(out["crossings_per_s"]), "/s"),  # type: ignore[arg-type]
    ]  # fmt: skip
    write_results(a.results, "links", figures, out)
    return 0 if p99 <= TARGET_P99_MS else 1


if __name__ == "__main__":
    raise SystemExit(cli())
