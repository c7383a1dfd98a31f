"""Cost stays flat as the hub grows: an empty hub against a grown one, side by side.

The grown hub holds ``--messages`` stored messages (1,000,000 by default, every one
delivered and acked, with its history), ``--sessions`` sessions (10,000) and ``--links``
links (20,000, a tenth of them open), all written through the store's own transaction
functions in large batches; it is built once and cached under ``.cache/bench/`` (keyed by
the schema and the sizes), then copied for each run. The load is the one of
``bench_send``: K senders send, receivers receive and ack, each message counted once
received and acked; K=1 and K=16, in-process (a Hub in this process) and over HTTP (a
``backchannel serve`` subprocess), closed loop for ``--duration`` seconds. The hub's
memory is the server's peak RSS (``VmHWM``) in the HTTP phases.

Target (DESIGN.md section 7): every figure of the grown hub within 2x of the empty one,
and the hub's RSS at most 200 MB.

Run from the repository root: ``.venv/bin/python -m bench.bench_growth`` (``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_send import HttpTransport, HubTransport, run_load
from bench.common import ServerProcess, log, loop_name, machine_info, run
from bench.figures import Figure, Goal, write_results

TEAM = "bench"
MAX_RATIO = 2.0
MAX_RSS_MB = 200.0
T0 = 1_700_000_000.0


def _cache_path(root: Path, args: argparse.Namespace) -> Path:
    import hashlib

    from backchannel.stores.sqlite import MIGRATIONS

    schema = hashlib.sha256("".join(MIGRATIONS).encode()).hexdigest()[:10]
    name = f"grown-{schema}-m{args.messages}-s{args.sessions}-l{args.links}-a{args.agents}.db"
    return root / name


async def _build(db: Path, args: argparse.Namespace, load_members: list[str]) -> dict[str, str]:
    """Write the grown hub through the store, in batches; returns the load members' tokens."""
    from backchannel.hub import Hub, hash_token, new_token
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.types import (
        Link,
        LinkState,
        Member,
        MemberKind,
        Message,
        MessageKind,
        Recipient,
        Session,
        SessionState,
        Team,
    )

    agents = [f"agent-{i}" for i in range(max(2, args.agents))]
    tokens = {m: new_token() for m in load_members}
    store = SqliteStore(db)
    await store.open()
    try:

        def people(tx: Any) -> None:
            tx.insert_team(Team(TEAM, T0, {"anchor_policy": "off"}))
            for name in [*agents, *load_members]:
                tok = tokens.get(name) or new_token()
                tx.insert_member(Member(TEAM, name, MemberKind.LLM, T0, hash_token(tok)))

        await store.transact(people)

        per_agent = max(1, args.sessions // len(agents))

        def sessions(tx: Any, lo: int, hi: int) -> None:
            for i in range(lo, hi):
                agent = agents[i % len(agents)]
                state = SessionState.TERMINATED if i % 3 == 0 else SessionState.IDLE
                at = T0 + i
                tx.put_session(Session(TEAM, f"{agent}-s{i}", agent, state, at, at, turn=4))

        for lo in range(0, args.sessions, 5_000):
            await store.transact(partial(sessions, lo=lo, hi=min(lo + 5_000, args.sessions)))
        log(f"  {args.sessions} sessions ({per_agent} per agent)")

        pairs = [(a, b) for i, a in enumerate(agents) for b in agents[i + 1 :]]

        def links(tx: Any, lo: int, hi: int) -> None:
            for k in range(lo, hi):
                a, b = pairs[k % len(pairs)]
                open_ = k % 10 == 0 and k < len(pairs)
                tx.insert_link(
                    Link(
                        TEAM,
                        f"lnk_pre{k:08d}",
                        a,
                        f"{a}-s{k}",
                        b,
                        f"{b}-s{k}",
                        8,
                        T0 + k,
                        LinkState.OPEN if open_ else LinkState.CLOSED,
                        8 if not open_ else 2,
                        None if open_ else T0 + k + 60,
                        None if open_ else "budget_exhausted",
                    )
                )

        for lo in range(0, args.links, 5_000):
            await store.transact(partial(links, lo=lo, hi=min(lo + 5_000, args.links)))
        log(f"  {args.links} links")

        text = "x" * args.size
        everyone = [*agents, *load_members]
        batch = 5_000
        started = time.perf_counter()

        def messages(tx: Any, lo: int, hi: int) -> None:
            now = T0 + lo / 100
            to_of: dict[str, list[str]] = {}
            for n in range(lo, hi):
                sender = everyone[n % len(everyone)]
                to = everyone[(n * 7 + 3) % len(everyone)]
                if to == sender:
                    to = everyone[(n * 7 + 4) % len(everyone)]
                mid = f"pre{n:09d}"
                msg = Message(TEAM, mid, sender, to, text, MessageKind.DIRECT, now, mid)
                tx.insert_message(msg, [Recipient(to)])
                to_of.setdefault(to, []).append(mid)
            for to, ids in to_of.items():
                tx.lease(TEAM, to, None, now, now + 60, len(ids))
                tx.ack(TEAM, to, ids, now + 1)

        for lo in range(0, args.messages, batch):
            await store.transact(partial(messages, lo=lo, hi=min(lo + batch, args.messages)))
            done = min(lo + batch, args.messages)
            if done % 100_000 == 0 or done == args.messages:
                rate = done / (time.perf_counter() - started)
                log(f"  {done:,} messages stored ({rate:,.0f}/s)")
        async with Hub(store, background=False) as hub:
            assert await hub.pending(TEAM, load_members[0]) == 0
    finally:
        await store.close()
    return tokens


def _grown(args: argparse.Namespace, dest: Path, load_members: list[str]) -> dict[str, str]:
    """Copy the cached grown hub to ``dest`` (building it first if needed)."""
    cache = _cache_path(Path(args.cache), args)
    tokens_file = cache.with_suffix(".tokens.json")
    if not (cache.exists() and tokens_file.exists()):
        cache.parent.mkdir(parents=True, exist_ok=True)
        building = cache.with_suffix(".building")
        building.unlink(missing_ok=True)
        log(f"building the grown hub once into {cache} ...")
        built = asyncio.run(_build(building, args, load_members))
        for suffix in ("-wal", "-shm"):
            Path(str(building) + suffix).unlink(missing_ok=True)
        building.rename(cache)
        tokens_file.write_text(json.dumps(built))
    shutil.copyfile(cache, dest)
    tokens: dict[str, str] = json.loads(tokens_file.read_text())
    return tokens


async def _empty(db: Path, load_members: list[str]) -> dict[str, str]:
    from backchannel.hub import Hub
    from backchannel.stores.sqlite import SqliteStore

    tokens = {}
    async with Hub(SqliteStore(db), background=False) as hub:
        await hub.create_team(TEAM, settings={"anchor_policy": "off"})
        for name in load_members:
            tokens[name] = (await hub.add_member(TEAM, name))[1]
    return tokens


def _common(args: argparse.Namespace, k: int) -> dict[str, Any]:
    return {
        "senders": k,
        "receivers": [f"r{j}" for j in range(k)],
        "size": args.size,
        "drain_timeout": 60.0,
        "recv_wait": 1.0,
    }


async def _inproc(db: Path, args: argparse.Namespace, k: int) -> dict[str, Any]:
    from backchannel.hub import Hub
    from backchannel.stores.sqlite import SqliteStore

    async with Hub(SqliteStore(db)) as hub:
        senders = [f"s{i}" for i in range(k)]
        tp = HubTransport(hub, senders, [f"r{j}" for j in range(k)], 64, 1.0)
        await run_load(tp, total=200, rate=0, duration=10, **_common(args, k))  # warm-up
        return await run_load(tp, total=10**9, rate=0, duration=args.duration, **_common(args, k))


async def _http(url: str, tokens: dict[str, str], args: argparse.Namespace, k: int) -> Any:
    senders = [f"s{i}" for i in range(k)]
    tp = HttpTransport(url, tokens, senders, [f"r{j}" for j in range(k)], 64, 1.0, "raw")
    try:
        await run_load(tp, total=200, rate=0, duration=10, **_common(args, k))
        return await run_load(tp, total=10**9, rate=0, duration=args.duration, **_common(args, k))
    finally:
        await tp.aclose()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(args: argparse.Namespace, base: Path) -> dict[str, dict[str, Any]]:
    load_members = [f"s{i}" for i in range(16)] + [f"r{j}" for j in range(16)]
    out: dict[str, dict[str, Any]] = {}
    for hub_kind in ("empty", "grown"):
        row: dict[str, Any] = {}
        for k in args.k:
            for transport in args.transports:
                d = base / f"{hub_kind}-{transport}-{k}"
                d.mkdir()
                db = d / "hub.db"
                if hub_kind == "empty":
                    tokens = asyncio.run(_empty(db, load_members))
                else:
                    tokens = _grown(args, db, load_members)
                log(f"{hub_kind} hub, {transport}, K={k} ...")
                if transport == "inproc":
                    m = run(_inproc, db, args, k, use_uvloop=True)
                else:
                    srv = ServerProcess(d / "home", f"sqlite:///{db}")
                    srv.start(timeout=120)
                    try:
                        assert srv.proc is not None
                        m = run(_http, srv.url, tokens, args, k, use_uvloop=True)
                        m["rss_mb"] = _rss_mb(srv.proc.pid)
                    finally:
                        srv.stop()
                row[f"{transport} K={k}"] = m
                log(
                    f"  {m['throughput_msgs_s']:,.0f} msgs/s, send p50 "
                    f"{m['send_ms']['p50_ms']:.2f} ms, e2e p99 {m['e2e_ms']['p99_ms']:.1f} ms"
                    + (f", RSS {m['rss_mb']:.0f} MB" if "rss_mb" in m else "")
                )
                shutil.rmtree(d)
        out[hub_kind] = row
    return out


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> bool:
    ok = True
    print(
        f"\nGrowth: {args.messages:,} messages, {args.sessions:,} sessions, {args.links:,} links "
        f"(loop {loop_name(True)})\n"
    )
    head = f"{'phase':<14} {'empty msgs/s':>13} {'grown msgs/s':>13} {'ratio':>6} "
    head += f"{'send p50 e/g (ms)':>18} {'e2e p99 e/g (ms)':>18} {'RSS e/g (MB)':>14}"
    print(head)
    for phase, e in results["empty"].items():
        g = results["grown"][phase]
        ratio = e["throughput_msgs_s"] / max(g["throughput_msgs_s"], 1e-9)
        ok &= ratio <= MAX_RATIO
        rss = ""
        if "rss_mb" in e:
            rss = f"{e['rss_mb']:.0f} / {g['rss_mb']:.0f}"
            ok &= g["rss_mb"] <= MAX_RSS_MB
        print(
            f"{phase:<14} {e['throughput_msgs_s']:>13,.0f} {g['throughput_msgs_s']:>13,.0f} "
            f"{ratio:>5.2f}x {e['send_ms']['p50_ms']:>8.2f} / {g['send_ms']['p50_ms']:<7.2f} "
            f"{e['e2e_ms']['p99_ms']:>8.1f} / {g['e2e_ms']['p99_ms']:<7.1f} {rss:>14}"
        )
    print(f"\ntarget: grown within {MAX_RATIO:g}x of empty, RSS <= {MAX_RSS_MB:g} MB: ", end="")
    print("met" if ok else "MISSED")
    return ok


def figures(results: dict[str, dict[str, Any]]) -> list[Figure]:
    """Per phase, how much slower the grown hub is than the empty one (throughput and send
    p50), and the grown hub's peak RSS over HTTP."""
    src = "DESIGN §7"
    out = []
    rss: list[float] = []
    for phase, e in results["empty"].items():
        g = results["grown"][phase]
        name = phase.replace("inproc", "in-process").replace("http", "HTTP")
        slower = e["throughput_msgs_s"] / max(g["throughput_msgs_s"], 1e-9)
        out.append(Figure(f"{name}: empty msgs/s ÷ grown", slower, "×",
                          Goal("<=", MAX_RATIO, src)))  # fmt: skip
        p50 = g["send_ms"].get("p50_ms", float("nan")) / max(e["send_ms"].get("p50_ms", 0), 1e-9)
        out.append(Figure(f"{name}: grown send p50 ÷ empty", p50, "×",
                          Goal("<=", MAX_RATIO, src)))  # fmt: skip
        if "rss_mb" in g:
            rss.append(g["rss_mb"])
    if rss:
        out.append(Figure("grown hub's peak RSS (HTTP)", max(rss), "MB",
                          Goal("<=", MAX_RSS_MB, src)))  # fmt: skip
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="stored messages")
    p.add_argument("--sessions", type=int, default=10_000, help="stored sessions")
    p.add_argument("--links", type=int, default=20_000, help="stored links")
    p.add_argument("--agents", type=int, default=210, help="members the history is spread over")
    p.add_argument("--size", type=int, default=100, help="text bytes per message")
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per phase")
    p.add_argument("-k", type=int, nargs="+", default=[1, 16], help="sender counts")
    p.add_argument(
        "--transports", nargs="+", default=["inproc", "http"], choices=["inproc", "http"]
    )
    p.add_argument("--cache", default=".cache/bench", help="where the grown hub is kept")
    p.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    p.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py to PATH")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bc-growth-") as tmp:
        base = Path(tmp)
        info = machine_info(base, loop_name(True))
        log(
            f"machine: {info['cpu_model']}, {info['cpus']} CPUs, "
            f"load {info['loadavg_at_start']}, fsync p50 {info['fsync_p50_ms']:.2f} ms"
        )
        results = measure(args, base)
    ok = report(results, args)
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    write_results(args.results, "growth", figures(results), {"machine": info, **results})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
