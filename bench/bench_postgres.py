"""Several hubs on one PostgreSQL: throughput, send→delivered and cross-hub wake-up.

Two ``backchannel serve --store postgresql://...`` processes (hub A and hub B, standing
for two hosts) share one database. Phases (see ``--help``):

* ``load``   — ``--senders`` members (16) spread over the hubs (sender *i* posts to hub
  *i mod 2*), each sending to its own receiver, which long-polls and acks on the
  *other* hub: every message crosses hubs. Closed loop (as fast as possible) and
  open-loop phases (``--rate``); msgs/s received+acked, send latency, send→delivered.
* ``wakeup`` — one receiver blocked in ``GET /v1/inbox?wait=...`` on hub B, one sender
  posting to hub A, one message at a time: the LISTEN/NOTIFY wake-up across hubs
  (target p99 ≤ 50 ms); then the same with both on hub A, for comparison.

PostgreSQL comes from the test harness (``tests/pg_harness.py``): a private server, or
``$BACKCHANNEL_TEST_POSTGRES_URL``. The harness runs its server with ``fsync=off``;
unless ``--no-durable``, the bench restarts it on the same data directory with
PostgreSQL's defaults for ``fsync``, ``synchronous_commit`` and ``full_page_writes``, so
that each answered send has been flushed to disk, as in production. With an external
server its own settings are used (and shown).

Run from the repository root: ``.venv/bin/python -m bench.bench_postgres``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from tests.pg_harness import PgServer, _die_with_parent, _run_as, find_bindir, start_postgres

from bench.bench_send import HttpInbox, rate_label, run_load
from bench.common import (
    Result,
    ServerProcess,
    Target,
    cpu_of,
    cpus,
    finish,
    json_client,
    latency_row,
    loadavg,
    log,
    loop_name,
    machine_busy,
    machine_info,
    make_text,
    print_results,
    quiet_before,
    run,
    setup_team_http,
    summarize,
)
from bench.figures import Figure, Goal

perf = time.perf_counter
WAKE_P99_MS = 50.0  # the target for a send on hub A waking a receiver on hub B
DURABLE = ("fsync", "synchronous_commit", "full_page_writes")


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_settings(pg: PgServer) -> dict[str, str]:
    names = ("server_version", *DURABLE, "max_connections", "shared_buffers")
    with psycopg.connect(pg.admin_url, autocommit=True, connect_timeout=10) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def make_durable(pg: PgServer) -> None:
    """Restart the harness's server on its data directory without its fsync=off flags (they
    are command-line settings, which ALTER SYSTEM cannot override): every commit is flushed."""
    proc = pg._process
    if proc is None or pg.data_dir is None or pg.log_path is None:
        raise RuntimeError("only the harness's own server can be restarted")
    port = urlsplit(pg.admin_url).port
    sock = pg.data_dir.parent / "sock"
    proc.send_signal(signal.SIGINT)  # fast shutdown: a clean checkpoint
    proc.wait(30)
    account = _run_as()
    user = group = None
    if account is not None:
        user, group = account.pw_uid, account.pw_gid
    with open(pg.log_path, "ab") as out:
        pg._process = subprocess.Popen(
            [str(find_bindir() / "postgres"), "-D", str(pg.data_dir), "-p", str(port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sock}",
             "-c", "max_connections=300", "-c", "shared_buffers=64MB"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=pg.data_dir.parent, start_new_session=True, user=user, group=group,
            extra_groups=[] if account is not None else None, preexec_fn=_die_with_parent,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            if pg_settings(pg)["fsync"] == "on":
                return
        except psycopg.OperationalError:
            pass
        if pg._process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL did not come back with fsync=on:\n{pg.log_tail()}")
        time.sleep(0.05)


def pg_cpu(pg: PgServer) -> float | None:
    """CPU seconds of the harness's postmaster and its children (backends alive now)."""
    proc = pg._process
    if proc is None:
        return None
    root, total = proc.pid, cpu_of(proc.pid) or 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == root:  # ppid
                total += cpu_of(int(entry.name)) or 0.0
    return total


class Hubs:
    """Two ``backchannel serve`` processes on one fresh database, one admin token."""

    def __init__(self, pg: PgServer, base: Path, name: str, extra: Sequence[str]) -> None:
        self.url = pg.new_database("bcbench")
        token = "bca_" + secrets.token_urlsafe(32)
        self.servers = []
        for tag in ("a", "b"):
            home = base / f"{name}-{tag}"
            home.mkdir(parents=True)
            fd = os.open(home / "admin.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            self.servers.append(ServerProcess(home, self.url, extra))

    def __enter__(self) -> Hubs:
        try:
            for s in self.servers:
                s.start(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def cpu(self) -> float | None:
        values = [s.cpu_seconds() for s in self.servers]
        return None if any(v is None for v in values) else sum(v or 0.0 for v in values)


# -- load: senders on both hubs, each receiver on the other hub ----------------------------------


class CrossHubTransport(HttpInbox):
    """Sender *i* posts to hub *i mod 2*; receiver *i* polls and acks on the other hub.

    Each receiver's long-poll and its acks take turns on one keep-alive connection."""

    def __init__(
        self,
        urls: Sequence[str],
        tokens: dict[str, str],
        senders: Sequence[str],
        receivers: Sequence[str],
        limit: int,
        wait: float,
        client: str,
    ) -> None:
        n = len(urls)
        super().__init__(
            [json_client(client, urls[i % n], tokens[s], 30.0) for i, s in enumerate(senders)],
            [
                json_client(client, urls[(j + 1) % n], tokens[r], 30.0 + wait)
                for j, r in enumerate(receivers)
            ],
            limit,
            wait,
        )

    async def send(self, sender: int, to: str, text: str) -> None:
        status, data = await self._senders[sender].call(
            "POST", "/v1/messages", {"to": to, "text": text, "link": False}
        )
        if status != 201:
            raise RuntimeError(f"POST /v1/messages answered {status}: {str(data)[:200]}")


def setup_teams(hubs: Hubs, n_pairs: int, n_teams: int) -> dict[str, str]:
    """Pair *i* (``s<i>`` → ``r<i>``) lives in team ``bench<i mod n_teams>``; made on hub A."""
    tokens: dict[str, str] = {}
    a = hubs.servers[0]
    for t in range(n_teams):
        names = [f"{p}{i}" for i in range(t, n_pairs, n_teams) for p in ("s", "r")]
        tokens.update(setup_team_http(a.url, a.admin_token, f"bench{t}", names))
    return tokens


async def _load_phase(
    args: argparse.Namespace, hubs: Hubs, tokens: dict[str, str], rate: float, pg: PgServer
) -> dict[str, Any]:
    senders = [f"s{i}" for i in range(args.senders)]
    receivers = [f"r{i}" for i in range(args.senders)]
    tp = CrossHubTransport(
        hubs.urls, tokens, senders, receivers, args.limit, args.poll_wait, args.client
    )
    common: dict[str, Any] = {
        "senders": args.senders,
        "receivers": receivers,
        "size": args.size,
        "drain_timeout": args.drain_timeout,
        "overrun": 5.0,
        "recv_wait": args.poll_wait,
    }
    try:
        if args.warmup:
            await run_load(tp, total=args.warmup, rate=0, duration=30, **common)
        pg0 = pg_cpu(pg)
        m = await run_load(
            tp,
            total=args.messages,
            rate=rate,
            duration=args.duration,
            server_cpu=hubs.cpu,
            **common,
        )
        pg1 = pg_cpu(pg)
        m["pg_cpu_s"] = (pg1 - pg0) if pg0 is not None and pg1 is not None else None
        return m
    finally:
        await tp.aclose()


def bench_load(args: argparse.Namespace, pg: PgServer, base: Path) -> list[Result]:
    results = []
    for rate in [float(r) for r in args.rate.split(",") if r.strip()]:
        label = rate_label(rate)
        label += f", {args.senders} senders in {args.teams} team(s)"
        log(f"[load] {label} ...")
        quiet_before(args.quiet_wait)
        with Hubs(pg, base, f"load-{rate:g}-{args.teams}", args.server_arg or ()) as hubs:
            tokens = setup_teams(hubs, args.senders, args.teams)
            m = run(_load_phase, args, hubs, tokens, rate, pg, use_uvloop=args.uvloop)
        wall = max(m["wall_s"], 1e-9)
        n = max(m["received_unique"], 1)
        rows = [
            (
                "messages sent / received",
                f"{m['sent']} / {m['received_unique']} (duplicates {m['duplicates']}, "
                f"errors {m['errors']}, drained {m['drained']})",
            ),
            (
                "throughput (received+acked)",
                f"{m['throughput_msgs_s']:,.0f} msgs/s over {m['elapsed_s']:.2f} s",
            ),
            ("send call latency", latency_row(m["send_ms"])),
            ("send→delivered" + (" (from due time)" if rate else ""), latency_row(m["e2e_ms"])),
            (
                "CPU per message",
                f"hubs {1e3 * (m['server_cpu_s'] or 0) / n:.2f} ms, PostgreSQL "
                f"{1e3 * (m['pg_cpu_s'] or 0) / n:.2f} ms, load generator "
                f"{1e3 * m['cpu_s'] / n:.2f} ms",
            ),
            (
                "machine busy",
                f"{100 * m['machine_busy_s'] / wall / cpus():.0f}% of {cpus()} CPUs",
            ),
        ]
        res = Result(
            "postgres",
            label,
            {
                "hubs": 2,
                "senders": args.senders,
                "teams": args.teams,
                "rate": rate,
                "size": args.size,
                "client": args.client,
                "loadavg_after": loadavg(),
            },
            rows=rows,
            metrics=m,
        )
        res.notes.append(
            "every message is sent through one hub and received+acked through the other; the "
            f"load generator, both hubs and PostgreSQL share the same {cpus()} CPUs"
        )
        if m["errors"]:
            res.notes.append(f"{m['errors']} errors, first: {'; '.join(m['first_errors'])}")
        res.targets.append(
            Target(
                "nothing lost or duplicated",
                f"{m['received_unique']} of {m['sent']} received, {m['duplicates']} twice",
                m["duplicates"],
                m["drained"] and m["duplicates"] == 0 and m["received_unique"] >= m["sent"],
            )
        )
        results.append(res)
    return results


# -- wake-up: a receiver waiting on hub B, a send on hub A ---------------------------------------


async def _wake(
    args: argparse.Namespace, send_url: str, recv_url: str, tokens: dict[str, str]
) -> dict[str, Any]:
    tx = json_client(args.client, send_url, tokens["tx"], 30.0)
    rx = json_client(args.client, recv_url, tokens["rx"], args.wake_wait + 30.0)
    ready = asyncio.Event()
    arrivals: asyncio.Queue[float] = asyncio.Queue()
    errors: list[str] = []

    async def receiver() -> None:
        while True:
            ready.set()  # about to block in the long-poll
            status, data = await rx.call(
                "GET", "/v1/inbox", params={"wait": args.wake_wait, "limit": 1}
            )
            t = perf()
            if status != 200:
                errors.append(f"GET /v1/inbox {status}: {str(data)[:200]}")
                await asyncio.sleep(0.05)
                continue
            got = data["messages"]
            if got:
                arrivals.put_nowait(t)
                ready.clear()
                await rx.call("POST", "/v1/inbox/ack", {"message_ids": [got[0]["message_id"]]})

    start_wake: list[float] = []
    commit_wake: list[float] = []
    send_lat: list[float] = []
    timeouts = 0
    busy0, wall0 = machine_busy(), perf()
    task = asyncio.create_task(receiver())
    try:
        for k in range(args.samples + args.wake_warmup):
            await asyncio.wait_for(ready.wait(), 30)
            ready.clear()
            await asyncio.sleep(args.gap_ms / 1000)  # let it settle into its wait
            t0 = perf()
            status, data = await tx.call(
                "POST",
                "/v1/messages",
                {"to": "rx", "text": make_text(args.size, t0, t0), "link": False},
            )
            t1 = perf()
            if status != 201:
                raise RuntimeError(f"POST /v1/messages answered {status}: {str(data)[:200]}")
            try:
                t2 = await asyncio.wait_for(arrivals.get(), args.wake_wait + 5)
            except TimeoutError:
                timeouts += 1
                continue
            if k >= args.wake_warmup:
                start_wake.append(t2 - t0)
                commit_wake.append(t2 - t1)
                send_lat.append(t1 - t0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await tx.aclose()
        await rx.aclose()
    return {
        "samples": len(start_wake),
        "timeouts": timeouts,
        "errors": len(errors),
        "first_errors": errors[:3],
        "send_start_to_wake_ms": summarize(start_wake),
        "commit_to_wake_ms": summarize(commit_wake),
        "send_ms": summarize(send_lat),
        "machine_busy_s": machine_busy() - busy0,
        "wall_s": perf() - wall0,
    }


def bench_wakeup(args: argparse.Namespace, pg: PgServer, base: Path) -> list[Result]:
    results = []
    with Hubs(pg, base, "wake", args.server_arg or ()) as hubs:
        a = hubs.servers[0]
        tokens = setup_team_http(a.url, a.admin_token, "wake", ["tx", "rx"])
        for via in [v.strip() for v in args.wake_via.split(",") if v.strip()]:
            if via not in ("cross", "same"):
                raise SystemExit(f"unknown --wake-via {via!r}; use cross and/or same")
            recv_url = hubs.urls[1] if via == "cross" else hubs.urls[0]
            log(f"[wakeup] {via}: {args.samples} samples ...")
            quiet_before(args.quiet_wait)
            m = run(_wake, args, hubs.urls[0], recv_url, tokens, use_uvloop=args.uvloop)
            phase = (
                "send on hub A → receiver waiting on hub B (LISTEN/NOTIFY)"
                if via == "cross"
                else "send on hub A → receiver waiting on hub A (in-process wake-up)"
            )
            wall = max(m["wall_s"], 1e-9)
            res = Result(
                "postgres wakeup",
                phase,
                {"samples": args.samples, "gap_ms": args.gap_ms, "wait": args.wake_wait},
                rows=[
                    ("samples", f"{m['samples']} (timeouts {m['timeouts']}, errors {m['errors']})"),
                    ("send start→wake", latency_row(m["send_start_to_wake_ms"])),
                    ("POST answered→wake", latency_row(m["commit_to_wake_ms"])),
                    ("send call", latency_row(m["send_ms"])),
                    (
                        "machine busy",
                        f"{100 * m['machine_busy_s'] / wall / cpus():.0f}% of {cpus()} CPUs",
                    ),
                ],
                metrics=m,
                notes=[
                    "send start→wake is an upper bound (it includes the POST); the other "
                    "hub's fallback wake-up is every 2 s, so anything well below that came "
                    "from NOTIFY"
                ],
            )
            p99 = m["send_start_to_wake_ms"].get("p99_ms", float("inf"))
            if via == "cross":
                res.targets.append(
                    Target(
                        "cross-hub wake-up",
                        f"p99 ≤ {WAKE_P99_MS:g} ms (got {p99:.2f} ms)",
                        p99,
                        p99 <= WAKE_P99_MS and m["timeouts"] == 0,
                    )
                )
            results.append(res)
    return results


def figures(results: Sequence[Result]) -> list[Figure]:
    """Two hubs on one database: throughput, nothing lost, the cross-hub wake-up."""
    out: list[Figure] = []
    lost = 0.0
    loads = [r for r in results if r.mode == "postgres"]
    for r in loads:
        m = r.metrics
        lost += max(0, m["sent"] - m["received_unique"]) + m["duplicates"]
        if not r.config.get("rate"):
            out.append(Figure("two hubs: msgs/s, as fast as possible", m["throughput_msgs_s"],
                              "msgs/s"))  # fmt: skip
    if loads:
        out.append(Figure("two hubs: messages lost or duplicated", lost, "",
                          Goal("==", 0, "issue 24")))  # fmt: skip
    for r in results:
        if r.mode != "postgres wakeup":
            continue
        p99 = r.metrics["send_start_to_wake_ms"].get("p99_ms")
        if "hub B" in r.phase:
            out.append(Figure("send on hub A → receiver on hub B woken, p99", p99, "ms",
                              Goal("<=", WAKE_P99_MS, "cross-hub")))  # fmt: skip
        else:
            out.append(Figure("send on hub A → receiver on hub A woken, p99", p99, "ms"))
    return out


# -- shared bits -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_postgres",
        description="Two backchannel hubs on one PostgreSQL, driven over HTTP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("mode", nargs="?", default="all", choices=["load", "wakeup", "all"])
    load = p.add_argument_group("load")
    load.add_argument("--senders", type=int, default=16, help="senders (and as many receivers)")
    load.add_argument("--teams", type=int, default=1, help="spread the pairs over N teams")
    load.add_argument(
        "--rate", default="0,100", help="comma-separated msgs/s offered; 0 = as fast as possible"
    )
    load.add_argument("--duration", type=float, default=10.0, help="seconds of sending per phase")
    load.add_argument("--messages", type=int, default=200_000, help="cap on messages per phase")
    load.add_argument("--warmup", type=int, default=400, help="messages sent before measuring")
    load.add_argument("--size", type=int, default=100, help="message text bytes")
    load.add_argument("--limit", type=int, default=64, help="receive batch size")
    load.add_argument("--poll-wait", type=float, default=1.0, help="receivers' long-poll seconds")
    load.add_argument("--drain-timeout", type=float, default=30.0)
    wake = p.add_argument_group("wakeup")
    wake.add_argument("--samples", type=int, default=300)
    wake.add_argument("--wake-warmup", type=int, default=20)
    wake.add_argument("--gap-ms", type=float, default=5.0, help="pause before each send")
    wake.add_argument("--wake-wait", type=float, default=5.0, help="receiver's wait= seconds")
    wake.add_argument("--wake-via", default="cross,same", help="cross (A→B) and/or same (A→A)")
    gen = p.add_argument_group("general")
    gen.add_argument(
        "--durable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart the harness's server with fsync, synchronous_commit on (its defaults)",
    )
    gen.add_argument("--client", default="httpx", choices=["httpx", "raw"])
    gen.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True)
    gen.add_argument(
        "--server-arg", action="append", help="extra argument for `backchannel serve` (repeat)"
    )
    gen.add_argument("--quiet-wait", type=float, default=30.0, help="wait for a quiet machine")
    gen.add_argument("--json", action="store_true", help="JSON results on stdout")
    gen.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py")
    gen.add_argument("--dir", default=None, help="where the hubs' data directories go")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    pg = start_postgres()
    base = Path(tempfile.mkdtemp(prefix="bc-bench-pg-", dir=args.dir))
    results: list[Result] = []
    try:
        if args.durable and pg._process is not None:
            make_durable(pg)
        settings = pg_settings(pg)
        log(
            f"PostgreSQL {settings['server_version']}: "
            + ", ".join(f"{k}={settings[k]}" for k in DURABLE)
        )
        machine = machine_info(pg.data_dir.parent if pg.data_dir else base, loop_name(args.uvloop))
        machine["postgres"] = settings
        if args.mode in ("load", "all"):
            results += bench_load(args, pg, base)
        if args.mode in ("wakeup", "all"):
            results += bench_wakeup(args, pg, base)
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    print_results(results, machine, stderr=args.json)
    log(
        "PostgreSQL: "
        + ", ".join(f"{k}={v}" for k, v in settings.items())
        + ("" if pg.data_dir is None else " (the harness's private server, same machine)")
    )
    return finish(args, "postgres", results, figures(results), machine)


if __name__ == "__main__":
    sys.exit(main())
