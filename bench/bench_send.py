"""Durable send → delivered: throughput and latency of backchannel, against DESIGN.md §7.

Modes (see ``--help`` and bench/README.md):

* ``inproc`` — a Hub on a fresh SqliteStore in this process. K senders call
  ``hub.send``; receivers loop ``hub.receive(limit=64, wait=1)`` + ``hub.ack``.
  ``--store memory`` runs the same hub and load on the in-memory store instead: nothing
  is durable, so its figure is not the hub's but a bound on it (the hub's own work a
  message, with the store's cost taken away).
* ``http``   — ``backchannel serve`` as a subprocess; senders POST /v1/messages over
  httpx (one keep-alive connection each); receivers long-poll GET /v1/inbox and
  POST /v1/inbox/ack. The load generator shares the machine with the server.

With ``--ack-with-receive`` receivers ack each batch with their next receive
(``hub.receive(..., ack=...)``; ``POST /v1/inbox/receive``) instead of a separate ack.
* ``wakeup`` — one receiver blocked in ``receive(wait=...)`` (in-process, then over
  HTTP long-poll); one message at a time; commit → wake latency.
* ``all``    — the three, one after the other.

Run from the repository root: ``.venv/bin/python -m bench.bench_send inproc``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    JsonClient,
    Result,
    ServerProcess,
    Target,
    add_cpu_option,
    add_gc_option,
    cpu_self,
    cpus,
    finish,
    host_cpu,
    host_gc,
    json_client,
    latency_row,
    loadavg,
    log,
    loop_name,
    machine_busy,
    machine_info,
    make_text,
    parse_text,
    print_results,
    quiet_before,
    run,
    setup_team_http,
    setup_team_hub,
    summarize,
    thread_cpu,
)
from bench.figures import Figure, Goal

perf = time.perf_counter
TEAM = "bench"

# targets from DESIGN.md section 7
INPROC_MSGS_PER_S = 20_000
INPROC_P99_MS = 10.0
HTTP_MSGS_PER_S = 3_000
HTTP_P50_SEND_MS = 2.0
HTTP_P99_E2E_MS = 10.0  # issue 24: p99 send→delivered at 1,000 msgs/s offered
WAKE_P99_MS = 20.0

#: ``--store``: what each holds the hub's state in
STORES = {
    "sqlite": "sqlite (WAL, synchronous=FULL)",
    "memory": "memory (nothing durable: a bound on the hub, not its figure)",
}
MEMORY_FIGURE = "in-process on the memory store msgs/s, as fast as possible"
#: the in-process run's CPU a message on each of the hub's busy threads
THREAD_FIGURES = {
    "event loop": "in-process CPU a message: the event loop's thread",
    "store writer": "in-process CPU a message: the SQLite writer's thread",
}


# -- transports: the same load over the Hub or over HTTP ------------------------------------------


class Transport(Protocol):
    async def send(self, sender: int, to: str, text: str) -> None: ...
    async def receive(
        self, receiver: int, ack: list[str] | None = None
    ) -> list[tuple[str, str]]: ...
    async def ack(self, receiver: int, message_ids: list[str]) -> None: ...


class HubTransport:
    """Direct calls on an in-process :class:`backchannel.hub.Hub`."""

    def __init__(
        self, hub: Any, senders: Sequence[str], receivers: Sequence[str], limit: int, wait: float
    ) -> None:
        self.hub, self.senders, self.receivers = hub, senders, receivers
        self.limit, self.wait = limit, wait

    async def send(self, sender: int, to: str, text: str) -> None:
        await self.hub.send(TEAM, self.senders[sender], to, text)

    async def receive(self, receiver: int, ack: list[str] | None = None) -> list[tuple[str, str]]:
        got = await self.hub.receive(
            TEAM, self.receivers[receiver], limit=self.limit, wait=self.wait, ack=ack or ()
        )
        return [(m.message.message_id, m.message.text) for m in got]

    async def ack(self, receiver: int, message_ids: list[str]) -> None:
        await self.hub.ack(TEAM, self.receivers[receiver], message_ids)


class HttpInbox:
    """Receiving and acking over the HTTP API, one client per receiver (its long-poll and
    its acks take turns on that client's keep-alive connection), and closing every
    client. Where the clients connect is the subclass's: one hub, or several."""

    def __init__(
        self, senders: list[JsonClient], receivers: list[JsonClient], limit: int, wait: float
    ) -> None:
        self._senders, self._receivers = senders, receivers
        self._inbox_params = {"wait": wait, "limit": limit}

    async def receive(self, receiver: int, ack: list[str] | None = None) -> list[tuple[str, str]]:
        if ack is None:
            what = "GET /v1/inbox"
            status, data = await self._receivers[receiver].call(
                "GET", "/v1/inbox", params=self._inbox_params
            )
        else:  # acking the batch before (the load's --ack-with-receive)
            what = "POST /v1/inbox/receive"
            status, data = await self._receivers[receiver].call(
                "POST", "/v1/inbox/receive", {"ack": ack, **self._inbox_params}
            )
        if status != 200:
            raise RuntimeError(f"{what} answered {status}: {str(data)[:200]}")
        return [(m["message_id"], m["text"]) for m in data["messages"]]

    async def ack(self, receiver: int, message_ids: list[str]) -> None:
        status, data = await self._receivers[receiver].call(
            "POST", "/v1/inbox/ack", {"message_ids": message_ids}
        )
        if status != 200:
            raise RuntimeError(f"POST /v1/inbox/ack answered {status}: {str(data)[:200]}")

    async def aclose(self) -> None:
        for c in (*self._senders, *self._receivers):
            with contextlib.suppress(Exception):
                await c.aclose()


class HttpTransport(HttpInbox):
    """The HTTP API of one hub: one client (one keep-alive connection) per sender and one
    per receiver."""

    def __init__(
        self,
        url: str,
        tokens: dict[str, str],
        senders: Sequence[str],
        receivers: Sequence[str],
        limit: int,
        wait: float,
        client: str,
    ) -> None:
        super().__init__(
            [json_client(client, url, tokens[s], 30.0) for s in senders],
            [json_client(client, url, tokens[r], 30.0 + wait) for r in receivers],
            limit,
            wait,
        )

    async def send(self, sender: int, to: str, text: str) -> None:
        status, data = await self._senders[sender].call(
            "POST", "/v1/messages", {"to": to, "text": text}
        )
        if status != 201:
            raise RuntimeError(f"POST /v1/messages answered {status}: {str(data)[:200]}")


# -- the load: K senders, R receivers, optional open-loop schedule -----------------------------------


async def _loop_lag(samples: list[float], stop: asyncio.Event, every: float = 0.01) -> None:
    """How late a 10 ms timer fires: a busy event loop shows up here."""
    while not stop.is_set():
        t = perf()
        await asyncio.sleep(every)
        samples.append(max(0.0, perf() - t - every))


def _roles(read: Callable[[], dict[str, float]] | None) -> dict[str, float]:
    return read() if read is not None else {}


def _used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each role's threads used between two readings. A thread that ended in
    between takes its CPU with it, so a role never counts below zero."""
    return {role: max(0.0, cpu - before.get(role, 0.0)) for role, cpu in after.items()}


def own_threads() -> dict[str, float]:
    """This process's CPU seconds by thread role: the event loop's (the caller's thread),
    the SQLite store's writer and reader, and every other thread."""
    from backchannel.stores.sqlite.store import READER_THREAD, WRITER_THREAD

    loop_tid = threading.get_native_id()
    named = {t.native_id: t.name for t in threading.enumerate()}
    roles = {WRITER_THREAD: "store writer", READER_THREAD: "store reader"}
    used: dict[str, float] = {}
    for tid, cpu in thread_cpu().items():
        role = "event loop" if tid == loop_tid else roles.get(named.get(tid, ""), "other")
        used[role] = used.get(role, 0.0) + cpu
    order = ("event loop", "store writer", "store reader", "other")
    return {role: used[role] for role in order if role in used}


def threads_of(pid: int) -> Callable[[], dict[str, float]]:
    """Process ``pid``'s CPU seconds, its main thread (a server's event loop) apart."""

    def read() -> dict[str, float]:
        out = {"event loop": 0.0, "other threads": 0.0}
        for tid, cpu in thread_cpu(pid).items():
            out["event loop" if tid == pid else "other threads"] += cpu
        return out

    return read


async def run_load(
    tp: Transport,
    *,
    senders: int,
    receivers: Sequence[str],
    total: int,
    rate: float,
    duration: float,
    size: int,
    drain_timeout: float,
    server_cpu: Callable[[], float | None] | None = None,
    threads: Callable[[], dict[str, float]] | None = None,
    server_threads: Callable[[], dict[str, float]] | None = None,
    recv_wait: float = 1.0,
    overrun: float = 5.0,
    ack_with_receive: bool = False,
) -> dict[str, Any]:
    """Send ``total`` messages (fewer if ``duration`` runs out) and wait until every one is
    received and acked. With ``rate`` > 0 message n is due at t0 + n/rate (open loop)
    and latency counts from that due time, so a stalled sender cannot hide queueing.

    With ``ack_with_receive`` a receiver acks each batch with its next receive; the
    batch that completes the run is acked at once with a plain ack, so the run ends
    when every message is acked, as without it."""
    n_recv = len(receivers)
    if rate > 0:
        total = max(1, min(total, int(rate * duration)))
    send_lat: list[float] = []
    lateness: list[float] = []
    e2e: list[float] = []  # received - due (open loop) or - start (closed loop)
    e2e_actual: list[float] = []  # received - send call start
    lag: list[float] = []
    errors: list[str] = []
    seen: set[str] = set()
    dup = 0
    sent = 0
    calls = {"receive": 0, "ack": 0, "carried": 0}
    unacked: list[list[str]] = [[] for _ in receivers]  # received, ack not known done
    last_send_end = 0.0
    last_ack = 0.0
    senders_done = False
    all_acked = asyncio.Event()
    stop_lag = asyncio.Event()
    stop_recv = asyncio.Event()

    t0 = perf() + 0.05
    deadline = t0 + duration

    async def sender(i: int) -> None:
        nonlocal sent, last_send_end
        to = receivers[i % n_recv]
        await asyncio.sleep(max(0.0, t0 - perf()))
        for n in range(i, total, senders):
            if rate > 0:
                due = t0 + n / rate
                delay = due - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                started = perf()
                if started > deadline + overrun:
                    break  # hopelessly behind the schedule: the rest counts as unsent
            else:
                started = due = perf()
                if started > deadline:
                    break
            try:
                await tp.send(i, to, make_text(size, due, started))
            except Exception as exc:
                errors.append(f"send: {exc!r}")
                continue
            end = perf()
            send_lat.append(end - started)
            lateness.append(started - due)
            sent += 1
            last_send_end = max(last_send_end, end)

    def acked(at: float) -> None:
        nonlocal last_ack
        last_ack = max(last_ack, at)
        if senders_done and len(seen) >= sent and not any(unacked):
            all_acked.set()

    async def plain_ack(j: int) -> None:
        calls["ack"] += 1
        try:
            await tp.ack(j, unacked[j])
        except Exception as exc:
            errors.append(f"ack: {exc!r}")
            return  # tried again before the next receive (acks are idempotent)
        unacked[j] = []
        acked(perf())

    async def receiver(j: int) -> None:
        nonlocal dup
        # never cancelled mid-poll: an abandoned receive (or HTTP long-poll, which the
        # server keeps serving after the client goes) would lease messages nobody reads
        while not stop_recv.is_set():
            if unacked[j] and not ack_with_receive:
                await plain_ack(j)  # an ack that failed
                continue
            calls["receive"] += 1
            carried = unacked[j]
            called = perf()
            try:
                got = await tp.receive(j, carried if ack_with_receive else None)
            except Exception as exc:
                errors.append(f"receive: {exc!r}")
                await asyncio.sleep(0.05)
                continue  # what it carried goes again with the next
            t = perf()
            if carried:
                calls["carried"] += 1
                unacked[j] = []
                # the ack committed in the receive's first transaction: at its end when it
                # leased at once, at its start when it then waited for messages
                acked(t if got else called)
            if not got:
                continue
            for mid, text in got:
                if mid in seen:
                    dup += 1
                    continue
                seen.add(mid)
                due, started = parse_text(text)
                e2e.append(t - due)
                e2e_actual.append(t - started)
            unacked[j] = [mid for mid, _ in got]
            if ack_with_receive and not (senders_done and len(seen) >= sent):
                continue  # acked by the next receive
            await plain_ack(j)  # the batch that completes the run is acked at once
        if unacked[j]:  # the phase ended before this batch's ack (a drain timeout)
            await plain_ack(j)

    srv0 = server_cpu() if server_cpu else None
    thr0, srv_thr0 = _roles(threads), _roles(server_threads)
    cpu0, wall0, busy0 = cpu_self(), perf(), machine_busy()
    lag_task = asyncio.create_task(_loop_lag(lag, stop_lag))
    recv_tasks = [asyncio.create_task(receiver(j)) for j in range(n_recv)]
    await asyncio.gather(*(sender(i) for i in range(senders)))
    senders_done = True
    if len(seen) >= sent and not any(unacked):
        all_acked.set()
    drained = True
    try:
        await asyncio.wait_for(all_acked.wait(), drain_timeout)
    except TimeoutError:
        drained = False
    cpu1, wall1, busy1 = cpu_self(), perf(), machine_busy()
    srv1 = server_cpu() if server_cpu else None
    thr1, srv_thr1 = _roles(threads), _roles(server_threads)
    stop_lag.set()
    stop_recv.set()  # each receiver ends after its current poll (at most --poll-wait)
    _, stuck = await asyncio.wait(recv_tasks, timeout=recv_wait + 10.0)
    for task in stuck:
        task.cancel()
    await asyncio.gather(*recv_tasks, lag_task, return_exceptions=True)

    elapsed = max(last_ack - t0, 1e-9)
    return {
        "offered_rate": rate,
        "planned": total,
        "sent": sent,
        "unsent": total - sent - sum(1 for e in errors if e.startswith("send:")) if rate > 0 else 0,
        "received_unique": len(seen),
        "duplicates": dup,
        "lost_or_late": max(0, sent - len(seen)),
        "drained": drained,
        "errors": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": elapsed,
        "send_phase_s": max(last_send_end - t0, 1e-9),
        "throughput_msgs_s": len(seen) / elapsed,
        "send_rate_msgs_s": sent / max(last_send_end - t0, 1e-9),
        "send_ms": summarize(send_lat),
        "e2e_ms": summarize(e2e),
        "e2e_from_call_ms": summarize(e2e_actual),
        "sender_lateness_ms": summarize(lateness),
        "loop_lag_ms": summarize(lag),
        "receive_calls": calls["receive"],
        "ack_calls": calls["ack"],
        "carried_acks": calls["carried"],
        "cpu_s": cpu1 - cpu0,
        "server_cpu_s": (srv1 - srv0) if srv0 is not None and srv1 is not None else None,
        "threads_cpu_s": _used(thr0, thr1),
        "server_threads_cpu_s": _used(srv_thr0, srv_thr1),
        "machine_busy_s": busy1 - busy0,
        "other_cpu_s": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - ((srv1 or 0.0) - (srv0 or 0.0))),
        "wall_s": wall1 - wall0,
    }


def _load_rows(m: dict[str, Any], *, open_loop: bool) -> list[tuple[str, str]]:
    rows = [
        (
            "messages sent / received",
            f"{m['sent']} / {m['received_unique']}"
            + (
                f"  ({m['unsent']} of {m['planned']} never sent: the schedule ran "
                f"over by more than the --overrun allowance)"
                if m["unsent"]
                else ""
            )
            + (
                f"  (dup {m['duplicates']}, errors {m['errors']})"
                if m["duplicates"] or m["errors"]
                else ""
            ),
        ),
        (
            "throughput (received+acked)",
            f"{m['throughput_msgs_s']:,.0f} msgs/s over {m['elapsed_s']:.2f} s",
        ),
        ("send rate achieved", f"{m['send_rate_msgs_s']:,.0f} msgs/s"),
        ("send call latency", latency_row(m["send_ms"])),
        (
            "send→received" + (" (from due time)" if open_loop else ""),
            latency_row(m["e2e_ms"]),
        ),
    ]
    if open_loop:
        rows.append(("send→received (from call start)", latency_row(m["e2e_from_call_ms"])))
        rows.append(("sender lateness vs schedule", latency_row(m["sender_lateness_ms"])))
    rows.append(("event-loop lag (10 ms timer)", latency_row(m["loop_lag_ms"])))
    wall = max(m["wall_s"], 1e-9)
    n = max(m["received_unique"], 1)
    rows.append(
        (
            "calls per message",
            f"1 send + {m['receive_calls'] / n:.2f} receive + {m['ack_calls'] / n:.2f} ack "
            f"({m['receive_calls']} receives, {m['carried_acks']} of them acking the batch "
            f"before; {m['ack_calls']} acks)",
        )
    )
    rows.append(
        (
            "this process CPU",
            f"{m['cpu_s']:.2f} s over {m['wall_s']:.2f} s "
            f"({100 * m['cpu_s'] / wall:.0f}% of one core; {1e6 * m['cpu_s'] / n:.0f} µs/message)",
        )
    )
    if m.get("threads_cpu_s"):
        rows.append(("this process CPU by thread", _by_thread(m["threads_cpu_s"], n)))
    if m.get("server_cpu_s") is not None:
        rows.append(
            (
                "server process CPU",
                f"{m['server_cpu_s']:.2f} s ({100 * m['server_cpu_s'] / wall:.0f}% of one core; "
                f"{1e6 * m['server_cpu_s'] / n:.0f} µs/message)",
            )
        )
    if m.get("server_threads_cpu_s"):
        rows.append(("server process CPU by thread", _by_thread(m["server_threads_cpu_s"], n)))
    rows.append(
        (
            "other processes' CPU",
            f"{m['other_cpu_s']:.2f} s "
            f"({100 * m['other_cpu_s'] / wall:.0f}% of one core; machine busy "
            f"{100 * m['machine_busy_s'] / wall / cpus():.0f}% of {cpus()} CPUs)",
        )
    )
    return rows


def _by_thread(used: dict[str, float], n: int) -> str:
    each = ", ".join(f"{role} {1e6 * cpu / n:.0f}" for role, cpu in used.items())
    return f"{each} µs/message"


def _acks(args: argparse.Namespace) -> str:
    return "with the next receive" if args.ack_with_receive else "a separate ack per batch"


def _load_params(args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """The parameters of a load phase that every transport's result names, in the order
    its table shows them; each phase adds its own after them."""
    return {
        "senders": args.senders,
        "receivers": args.receivers or args.senders,
        "size": args.size,
        "rate": rate,
        "messages": args.messages,
        "duration": args.duration,
        "limit": args.limit,
        "acks": _acks(args),
    }


def rate_label(rate: float) -> str:
    """A load phase's name in the results: closed loop at 0, else the rate offered."""
    return "as fast as possible" if rate == 0 else f"{rate:,.0f} msgs/s offered (open loop)"


def _rates(args: argparse.Namespace, default: str) -> list[float]:
    text = args.rate if args.rate is not None else default
    return [float(x) for x in text.split(",") if x.strip()]


# -- inproc ------------------------------------------------------------------------------------


async def _inproc_phase(args: argparse.Namespace, db: Path, rate: float) -> dict[str, Any]:
    from backchannel.hub import Hub
    from backchannel.stores.base import Store

    store: Store
    if args.store == "memory":
        from backchannel.stores.memory import MemoryStore

        store = MemoryStore()
    else:
        from backchannel.stores.sqlite import SqliteStore

        store = SqliteStore(db)
    senders = [f"s{i}" for i in range(args.senders)]
    receivers = [f"r{j}" for j in range(args.receivers or args.senders)]
    async with Hub(store) as hub:
        await setup_team_hub(hub, TEAM, [*senders, *receivers])
        tp = HubTransport(hub, senders, receivers, args.limit, args.poll_wait)
        counts = _count_store_calls(hub.store, args.count_callers)
        common = {
            "senders": args.senders,
            "receivers": receivers,
            "size": args.size,
            "drain_timeout": args.drain_timeout,
            "overrun": args.overrun,
            "recv_wait": args.poll_wait,
            "ack_with_receive": args.ack_with_receive,
        }
        if args.warmup:
            await run_load(tp, total=args.warmup, rate=0, duration=30, **common)
        profiler = _start_profile(args)
        counts.clear()
        try:
            m = await run_load(
                tp,
                total=args.messages,
                rate=rate,
                duration=args.duration,
                threads=own_threads,
                **common,
            )
        finally:
            _stop_profile(args, profiler, f"inproc-rate{rate:g}")
    m["store_calls"] = dict(counts)
    return m


def _count_store_calls(store: Any, by_caller: bool) -> Counter[str]:
    """Count the store transactions the hub asks for (a thin wrapper on this store
    instance only; every write goes through the writer thread). The wrappers hand the
    store's own awaitable back, adding no coroutine; naming the hub method behind each
    (``by_caller``) walks its closure, which costs the load a few µs a transaction."""
    counts: Counter[str] = Counter()
    transact, read = store.transact, store.read

    def counted_transact(fn: Any) -> Any:
        counts[_caller(fn) if by_caller else "write"] += 1
        return transact(fn)

    def counted_read(fn: Any) -> Any:
        counts["read: " + _caller(fn) if by_caller else "read"] += 1
        return read(fn)

    store.transact, store.read = counted_transact, counted_read
    return counts


def _caller(fn: Any) -> str:
    name = getattr(fn, "__qualname__", "?")
    if name.startswith("Env.transact"):  # the hub's transaction runner: name its function
        inner = [c.cell_contents for c in fn.__closure__ or () if callable(c.cell_contents)]
        if inner:
            return _caller(inner[0])
    if isinstance(fn, functools.partial):
        return _caller(fn.func)
    return name.split(".<locals>")[0].rsplit(".", 1)[-1]


def bench_inproc(args: argparse.Namespace, base: Path) -> list[Result]:
    results = []
    for rate in _rates(args, "0,1000"):
        label = rate_label(rate)
        log(f"[inproc] {label} ...")
        quiet_before(args.quiet_wait)
        db = base / f"inproc-{rate:g}" / "bench.db"
        m = run(_inproc_phase, args, db, rate, use_uvloop=args.uvloop)
        res = Result(
            "inproc",
            label,
            {
                **_load_params(args, rate),
                "store": STORES[args.store],
            },
            rows=_load_rows(m, open_loop=rate > 0),
            metrics=m,
        )
        n = max(m["received_unique"], 1)
        calls = m["store_calls"]
        res.rows.insert(
            -3,
            (
                "store transactions per message",
                f"{sum(v for k, v in calls.items() if not k.startswith('read')) / n:.2f} writes ("
                + ", ".join(
                    f"{k} {v / n:.2f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1])
                )
                + ")",
            ),
        )
        target = _inproc_target(args, rate, m)
        if target is not None:
            res.targets.append(target)
        if args.store != "sqlite":  # say so at the top: this table is a bound, not a figure
            res.rows.insert(0, ("store", STORES[args.store]))
        _common_notes(res, m)
        results.append(res)
    return results


def _inproc_target(args: argparse.Namespace, rate: float, m: dict[str, Any]) -> Target | None:
    """DESIGN.md's target for an in-process phase; none on the memory store, where
    nothing is durable (a bound on the hub, not its figure)."""
    if args.store != "sqlite":
        return None
    if rate == 0:
        got = m["throughput_msgs_s"]
        return Target(
            f"in-process throughput, {args.senders} senders",
            f"≥ {INPROC_MSGS_PER_S:,} msgs/s (got {got:,.0f})",
            got,
            got >= INPROC_MSGS_PER_S,
        )
    p99 = m["e2e_ms"].get("p99_ms", float("inf"))
    return Target(
        f"p99 send→delivered at {rate:,.0f} msgs/s offered",
        f"≤ {INPROC_P99_MS:g} ms (got {p99:.2f} ms)",
        p99,
        p99 <= INPROC_P99_MS and m["unsent"] == 0 and m["drained"],
    )


# -- http --------------------------------------------------------------------------------------


async def _http_phase(
    args: argparse.Namespace,
    url: str,
    tokens: dict[str, str],
    rate: float,
    server_cpu: Callable[[], float | None],
    server_threads: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    senders = [f"s{i}" for i in range(args.senders)]
    receivers = [f"r{j}" for j in range(args.receivers or args.senders)]
    tp = HttpTransport(url, tokens, senders, receivers, args.limit, args.poll_wait, args.client)
    common = {
        "senders": args.senders,
        "receivers": receivers,
        "size": args.size,
        "drain_timeout": args.drain_timeout,
        "overrun": args.overrun,
        "recv_wait": args.poll_wait,
        "ack_with_receive": args.ack_with_receive,
    }
    try:
        if args.warmup:
            await run_load(tp, total=args.warmup, rate=0, duration=30, **common)
        return await run_load(
            tp,
            total=args.messages,
            rate=rate,
            duration=args.duration,
            server_cpu=server_cpu,
            server_threads=server_threads,
            **common,
        )
    finally:
        await tp.aclose()


def bench_http(args: argparse.Namespace, base: Path) -> list[Result]:
    results = []
    for rate in _rates(args, "0,100,1000,3000"):
        label = rate_label(rate)
        log(f"[http] {label} ...")
        quiet_before(args.quiet_wait)
        home = base / f"http-{rate:g}"
        prof = (
            Path(args.server_profile) / f"server-rate{rate:g}.pstats"
            if args.server_profile
            else None
        )
        server = ServerProcess(home, f"sqlite:///{home / 'bench.db'}", args.server_arg or (), prof)
        server.start(timeout=args.server_timeout)
        try:
            senders = [f"s{i}" for i in range(args.senders)]
            receivers = [f"r{j}" for j in range(args.receivers or args.senders)]
            tokens = setup_team_http(server.url, server.admin_token, TEAM, [*senders, *receivers])
            m = run(
                _http_phase,
                args,
                server.url,
                tokens,
                rate,
                server.cpu_seconds,
                threads_of(server.pid),
                use_uvloop=args.uvloop,
            )
        finally:
            server.stop()
        if prof is not None:
            log(f"server profile written to {prof}")
        res = Result(
            "http",
            label,
            {
                **_load_params(args, rate),
                "client": f"{args.client}, HTTP/1.1 keep-alive",
                "load_loop": loop_name(args.uvloop),
            },
            rows=_load_rows(m, open_loop=rate > 0),
            metrics=m,
        )
        p50 = m["send_ms"].get("p50_ms", float("inf"))
        if rate == 0:
            res.targets.append(
                Target(
                    "HTTP throughput",
                    f"≥ {HTTP_MSGS_PER_S:,} msgs/s (got {m['throughput_msgs_s']:,.0f})",
                    m["throughput_msgs_s"],
                    m["throughput_msgs_s"] >= HTTP_MSGS_PER_S,
                )
            )
            res.notes.append(
                f"at saturation a closed loop of {args.senders} senders has send latency ≈ "
                f"senders / throughput (Little's law) = {1000 * args.senders / max(m['throughput_msgs_s'], 1):.1f} ms; "
                "the p50-send target is judged in the open-loop phases"
            )
        else:
            res.targets.append(
                Target(
                    f"HTTP p50 send at {rate:,.0f} msgs/s offered",
                    f"≤ {HTTP_P50_SEND_MS:g} ms (got {p50:.2f} ms)",
                    p50,
                    p50 <= HTTP_P50_SEND_MS and m["unsent"] == 0,
                )
            )
            if rate >= HTTP_MSGS_PER_S:
                kept = m["throughput_msgs_s"] >= 0.97 * rate and m["drained"]
                res.targets.append(
                    Target(
                        f"HTTP keeps up with {rate:,.0f} msgs/s offered",
                        f"≥ 97% of offered (got {m['throughput_msgs_s']:,.0f})",
                        m["throughput_msgs_s"],
                        kept,
                    )
                )
        res.notes.append(
            f"the load generator (this process, {m['cpu_s']:.1f} CPU s) and the server "
            f"({m['server_cpu_s']:.1f} CPU s) share the same {cpus()} CPUs; figures are "
            "for both on one box, not for the server alone"
        )
        _common_notes(res, m)
        results.append(res)
    return results


# -- wakeup ------------------------------------------------------------------------------------


async def _wake_inproc(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from backchannel.hub import Hub
    from backchannel.stores.sqlite import SqliteStore

    async with Hub(SqliteStore(db)) as hub:
        await setup_team_hub(hub, TEAM, ["tx", "rx"])

        async def send(text: str) -> None:
            await hub.send(TEAM, "tx", "rx", text)

        async def receive() -> list[tuple[str, str]]:
            got = await hub.receive(TEAM, "rx", limit=1, wait=args.wake_wait)
            return [(m.message.message_id, m.message.text) for m in got]

        async def ack(ids: list[str]) -> None:
            await hub.ack(TEAM, "rx", ids)

        return await _wake_loop(args, send, receive, ack)


async def _wake_http(args: argparse.Namespace, url: str, tokens: dict[str, str]) -> dict[str, Any]:
    tx = json_client(args.client, url, tokens["tx"], 30.0)
    rx = json_client(args.client, url, tokens["rx"], args.wake_wait + 30.0)
    params = {"wait": args.wake_wait, "limit": 1}

    async def send(text: str) -> None:
        status, data = await tx.call("POST", "/v1/messages", {"to": "rx", "text": text})
        if status != 201:
            raise RuntimeError(f"POST /v1/messages answered {status}: {str(data)[:200]}")

    async def receive() -> list[tuple[str, str]]:
        status, data = await rx.call("GET", "/v1/inbox", params=params)
        if status != 200:
            raise RuntimeError(f"GET /v1/inbox answered {status}: {str(data)[:200]}")
        return [(m["message_id"], m["text"]) for m in data["messages"]]

    async def ack(ids: list[str]) -> None:
        status, data = await rx.call("POST", "/v1/inbox/ack", {"message_ids": ids})
        if status != 200:
            raise RuntimeError(f"POST /v1/inbox/ack answered {status}: {str(data)[:200]}")

    try:
        return await _wake_loop(args, send, receive, ack)
    finally:
        await tx.aclose()
        await rx.aclose()


async def _wake_loop(
    args: argparse.Namespace,
    send: Callable[[str], Any],
    receive: Callable[[], Any],
    ack: Callable[[list[str]], Any],
) -> dict[str, Any]:
    """One message at a time to a receiver already blocked in receive(wait=...)."""
    ready = asyncio.Event()
    arrivals: asyncio.Queue[float] = asyncio.Queue()
    errors: list[str] = []

    async def receiver() -> None:
        while True:
            ready.set()  # about to block in receive
            try:
                got = await receive()
            except Exception as exc:
                errors.append(repr(exc))
                await asyncio.sleep(0.05)
                continue
            t = perf()
            if got:
                arrivals.put_nowait(t)
                ready.clear()
                await ack([mid for mid, _ in got])

    commit_wake: list[float] = []
    busy0, cpu0, wall0 = machine_busy(), cpu_self(), perf()
    start_wake: list[float] = []
    send_lat: list[float] = []
    timeouts = 0
    task = asyncio.create_task(receiver())
    try:
        deadline = perf() + args.wake_max_seconds
        for k in range(args.samples + args.wake_warmup):
            await asyncio.wait_for(ready.wait(), 30)
            ready.clear()
            await asyncio.sleep(args.gap_ms / 1000)  # let it settle into its wait
            t_start = perf()
            await send(make_text(args.size, t_start, t_start))
            t_commit = perf()
            try:
                t_recv = await asyncio.wait_for(arrivals.get(), args.wake_wait + 5)
            except TimeoutError:
                timeouts += 1
                continue
            if k < args.wake_warmup:
                continue
            commit_wake.append(t_recv - t_commit)
            start_wake.append(t_recv - t_start)
            send_lat.append(t_commit - t_start)
            if perf() > deadline:
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return {
        "samples": len(commit_wake),
        "timeouts": timeouts,
        "errors": len(errors),
        "commit_to_wake_ms": summarize(commit_wake),
        "send_start_to_wake_ms": summarize(start_wake),
        "send_ms": summarize(send_lat),
        "machine_busy_s": machine_busy() - busy0,
        "cpu_s": cpu_self() - cpu0,
        "wall_s": perf() - wall0,
    }


def bench_wakeup(args: argparse.Namespace, base: Path) -> list[Result]:
    results = []
    vias = [v.strip() for v in args.wake_via.split(",") if v.strip()]
    for via in vias:
        log(f"[wakeup] {via}: {args.samples} samples ...")
        quiet_before(args.quiet_wait)
        if via == "inproc":
            m = run(_wake_inproc, args, base / "wake-inproc" / "bench.db", use_uvloop=args.uvloop)
            phase = "in-process receive(wait=...)"
            commit_label = "commit→wake (send returned → receive returned)"
            notes: list[str] = []
        elif via == "http":
            home = base / "wake-http"
            server = ServerProcess(home, f"sqlite:///{home / 'bench.db'}", args.server_arg or ())
            server.start(timeout=args.server_timeout)
            try:
                tokens = setup_team_http(server.url, server.admin_token, TEAM, ["tx", "rx"])
                m = run(_wake_http, args, server.url, tokens, use_uvloop=args.uvloop)
            finally:
                server.stop()
            phase = "HTTP long-poll GET /v1/inbox?wait=..."
            commit_label = "commit→wake (POST answered → GET answered)"
            notes = [
                "the POST is answered just after its commit, so commit→wake here slightly "
                "understates the true figure; send-start→wake is an upper bound",
                f"client and server share the same {cpus()} CPUs",
            ]
        else:
            raise SystemExit(f"unknown --wake-via {via!r}; use inproc and/or http")
        stats = m["commit_to_wake_ms"]
        res = Result(
            "wakeup",
            phase,
            {
                "samples": args.samples,
                "gap_ms": args.gap_ms,
                "wait": args.wake_wait,
                "client": args.client if via == "http" else None,
                "size": args.size,
            },
            rows=[
                ("samples", f"{m['samples']} (timeouts {m['timeouts']}, errors {m['errors']})"),
                (commit_label, latency_row(stats)),
                ("send start→wake", latency_row(m["send_start_to_wake_ms"])),
                ("send call", latency_row(m["send_ms"])),
            ],
            metrics=m,
            notes=notes,
        )
        wall = max(m["wall_s"], 1e-9)
        res.rows.append(
            (
                "machine busy (all processes)",
                f"{100 * m['machine_busy_s'] / wall / cpus():.0f}% of {cpus()} CPUs "
                f"(this process {100 * m['cpu_s'] / wall:.0f}% of one core)",
            )
        )
        res.config["loadavg_after"] = loadavg()
        p99 = stats.get("p99_ms", float("inf"))
        res.targets.append(
            Target(
                f"waiting receiver woken ({via})",
                f"p99 ≤ {WAKE_P99_MS:g} ms (got {p99:.2f} ms)",
                p99,
                p99 <= WAKE_P99_MS and m["timeouts"] == 0,
            )
        )
        results.append(res)
    return results


# -- shared bits -------------------------------------------------------------------------------


def _common_notes(res: Result, m: dict[str, Any]) -> None:
    res.config["loadavg_after"] = loadavg()
    other = m["other_cpu_s"] / max(m["wall_s"], 1e-9)
    if other > 0.15:
        res.notes.append(
            f"other processes used {100 * other:.0f}% of a core during this phase: the machine "
            "was not quiet, so these figures understate what the hub can do"
        )
    if not m["drained"]:
        res.notes.append(
            f"not every message was received within the drain timeout "
            f"({m['lost_or_late']} outstanding) — throughput is a lower bound"
        )
    if m["errors"]:
        res.notes.append(f"{m['errors']} errors, first: {'; '.join(m['first_errors'])}")
    lag = m["loop_lag_ms"].get("p99_ms")
    if lag is not None and lag > 5:
        res.notes.append(
            f"the load process's event loop is saturated (timer lag p99 {lag:.1f} ms): "
            "latencies include time waiting for the loop"
        )


def _start_profile(args: argparse.Namespace) -> Any:
    if not args.profile:
        return None
    import cProfile

    prof = cProfile.Profile(time.thread_time)  # CPU of the event-loop thread, not wall
    prof.enable()
    return prof


def _stop_profile(args: argparse.Namespace, prof: Any, name: str) -> None:
    if prof is None:
        return
    import pstats

    prof.disable()
    out = Path(args.profile) / f"{name}.pstats"
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(out)
    log(f"profile written to {out}; top functions by own time:")
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)


# -- figures for the one table (bench/all.py) ---------------------------------------------------


def rate_name(rate: float) -> str:
    return f"{rate:,.0f} msgs/s"


def figures(results: Sequence[Result]) -> list[Figure]:
    """The figures of DESIGN.md section 7 (and issue 24) these phases measured."""
    design, issue = "DESIGN §7", "issue 24"
    out: list[Figure] = []
    for r in results:
        m, rate = r.metrics, float(r.config.get("rate") or 0)
        short = []
        if m.get("drained") is False:
            short.append(f"{m['lost_or_late']} not delivered in time")
        if m.get("unsent"):
            short.append(f"{m['unsent']} never sent")
        if m.get("errors"):
            short.append(f"{m['errors']} errors")
        note = ", ".join(short)
        if r.mode == "inproc" and r.config.get("store") == STORES["memory"]:
            if rate == 0:
                out.append(Figure(MEMORY_FIGURE, m["throughput_msgs_s"], "msgs/s", None,
                                  note or "nothing durable: a bound on the hub"))  # fmt: skip
        elif r.mode == "inproc" and rate == 0:
            out.append(Figure("in-process msgs/s, as fast as possible", m["throughput_msgs_s"],
                              "msgs/s", Goal(">=", INPROC_MSGS_PER_S, design), note))  # fmt: skip
            used, n = m.get("threads_cpu_s") or {}, max(m.get("received_unique") or 0, 1)
            for role, name in THREAD_FIGURES.items():
                if role in used:
                    out.append(Figure(name, round(1e6 * used[role] / n, 1), "µs", None,
                                      "the same run; clock ticks of 10 ms"))  # fmt: skip
        elif r.mode == "inproc":
            out.append(Figure(f"in-process p99 send→delivered at {rate_name(rate)}",
                              m["e2e_ms"].get("p99_ms"), "ms", Goal("<=", INPROC_P99_MS, design),
                              note))  # fmt: skip
        elif r.mode == "http" and rate == 0:
            out.append(Figure("HTTP msgs/s, as fast as possible", m["throughput_msgs_s"],
                              "msgs/s", Goal(">=", HTTP_MSGS_PER_S, design), note))  # fmt: skip
        elif r.mode == "http":
            out.append(Figure(f"HTTP p50 send at {rate_name(rate)}", m["send_ms"].get("p50_ms"),
                              "ms", Goal("<=", HTTP_P50_SEND_MS, design), note))  # fmt: skip
            if rate == 1000:
                out.append(Figure(f"HTTP p99 send→delivered at {rate_name(rate)}",
                                  m["e2e_ms"].get("p99_ms"), "ms",
                                  Goal("<=", HTTP_P99_E2E_MS, issue), note))  # fmt: skip
            if rate >= HTTP_MSGS_PER_S:
                out.append(Figure(f"HTTP msgs/s delivered at {rate_name(rate)} offered",
                                  m["throughput_msgs_s"], "msgs/s",
                                  Goal(">=", round(0.97 * rate), "97% of offered"),
                                  note))  # fmt: skip
        elif r.mode == "wakeup":
            via = "in-process receive" if r.config.get("client") is None else "HTTP long-poll"
            wnote = f"{m['timeouts']} timed out" if m.get("timeouts") else ""
            out.append(Figure(f"{via}: waiting receiver woken, p99",
                              m["commit_to_wake_ms"].get("p99_ms"), "ms",
                              Goal("<=", WAKE_P99_MS, design), wnote))  # fmt: skip
    return out


# -- command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_send",
        description=(
            "Durable send → delivered benchmarks for backchannel (DESIGN.md §7). Every "
            "run uses a fresh SQLite file (WAL, synchronous=FULL) in a temporary directory "
            "(inproc --store memory: the memory store, a bound with nothing durable)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Example: .venv/bin/python -m bench.bench_send all --json > results.json",
    )
    p.add_argument(
        "mode",
        choices=["inproc", "http", "wakeup", "all"],
        help="inproc: Hub + SqliteStore in this process; http: `backchannel serve` subprocess "
        "driven over httpx; wakeup: commit→wake latency of a blocked receiver; all: the three",
    )
    p.add_argument(
        "--store",
        choices=sorted(STORES),
        default="sqlite",
        help="inproc only: the store the hub runs on; memory keeps nothing durable, so "
        "its figure bounds the hub's rather than measuring it",
    )
    load = p.add_argument_group("load (inproc and http)")
    load.add_argument(
        "--senders",
        type=int,
        default=16,
        help="concurrent senders K; sender i sends to receiver i mod R",
    )
    load.add_argument(
        "--receivers",
        type=int,
        default=0,
        help="receiver members R, each looping receive+ack (0 = one per sender)",
    )
    load.add_argument(
        "--messages",
        type=int,
        default=50_000,
        help="messages per measured phase (upper bound; --duration may stop it sooner)",
    )
    load.add_argument(
        "--size",
        type=int,
        default=256,
        help="message text size in bytes (the first ~36 carry timestamps)",
    )
    load.add_argument(
        "--rate",
        default=None,
        help="offered load in msgs/s over all senders, comma-separated for several phases; "
        "0 = as fast as possible (closed loop). With a rate, message n is due at t0 + n/rate "
        "(open loop) and latency counts from its due time, so coordinated omission cannot "
        "hide queueing. Default: '0,1000' for inproc, '0,100,1000,3000' for http",
    )
    load.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds of sending per phase at most (a rated phase sends "
        "min(messages, rate*duration))",
    )
    load.add_argument(
        "--warmup",
        type=int,
        default=500,
        help="messages sent and drained before each measured phase (not counted)",
    )
    load.add_argument("--limit", type=int, default=64, help="receive batch size (limit=)")
    load.add_argument(
        "--poll-wait", type=float, default=1.0, help="receivers' receive/long-poll wait in seconds"
    )
    load.add_argument(
        "--ack-with-receive",
        action="store_true",
        help="receivers ack each batch with their next receive (hub.receive(ack=...); "
        "POST /v1/inbox/receive) instead of a separate ack; the batch that completes a "
        "phase is acked at once",
    )
    load.add_argument(
        "--overrun",
        type=float,
        default=5.0,
        help="open loop only: stop sending once the senders are this many seconds past the "
        "end of the schedule (the rest are reported as never sent; keeps an overloaded run "
        "bounded)",
    )
    load.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to wait after the last send for every message to be acked",
    )
    wake = p.add_argument_group("wakeup")
    wake.add_argument("--samples", type=int, default=2000, help="messages, one at a time")
    wake.add_argument("--wake-warmup", type=int, default=20, help="samples discarded first")
    wake.add_argument(
        "--gap-ms",
        type=float,
        default=5.0,
        help="pause after the receiver re-enters receive() before the next send, "
        "so it is really blocked in its wait",
    )
    wake.add_argument(
        "--wake-wait", type=float, default=5.0, help="the blocked receiver's wait= in seconds"
    )
    wake.add_argument(
        "--wake-max-seconds",
        type=float,
        default=60.0,
        help="stop taking samples after this long (per receiver kind)",
    )
    wake.add_argument(
        "--wake-via",
        default="inproc,http",
        help="which receivers to measure: inproc, http or both (comma-separated)",
    )
    gen = p.add_argument_group("general")
    gen.add_argument(
        "--no-uvloop",
        dest="uvloop",
        action="store_false",
        help="run this process (hub or load generator) on asyncio's default loop "
        "instead of uvloop (the server subprocess picks its own: uvloop if installed)",
    )
    add_gc_option(gen)
    add_cpu_option(gen)
    gen.add_argument(
        "--client",
        choices=["httpx", "raw"],
        default="httpx",
        help="HTTP client of the load generator: httpx (an AsyncClient per sender/receiver, "
        "HTTP/1.1 keep-alive) or raw (a bare asyncio HTTP/1.1 client that leaves more of the "
        "shared CPUs to the server)",
    )
    gen.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each phase wait up to this many seconds for other processes to use "
        "under 0.2 CPUs (0 = do not wait); each table reports what others used during the "
        "phase either way",
    )
    gen.add_argument(
        "--dir",
        default=None,
        help="parent directory for the temporary data directory (its filesystem "
        "decides what an fsync costs) [system temp dir]",
    )
    gen.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    gen.add_argument(
        "--server-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="extra argument for `backchannel serve` (repeatable)",
    )
    gen.add_argument(
        "--server-timeout",
        type=float,
        default=20.0,
        help="seconds to wait for the server to write server.json and be healthy",
    )
    gen.add_argument(
        "--count-callers",
        action="store_true",
        help="inproc only: name the hub method behind each store transaction in the "
        "'store transactions per message' row (costs the load a few µs a transaction)",
    )
    gen.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="inproc only: cProfile each measured phase, write DIR/<phase>.pstats "
        "and print the top functions (slows the run down)",
    )
    gen.add_argument(
        "--server-profile",
        metavar="DIR",
        default=None,
        help="http only: run the server under cProfile (its event-loop thread) and "
        "write DIR/server-rate<R>.pstats (slows the server down)",
    )
    gen.add_argument(
        "--json",
        action="store_true",
        help="print results as JSON on stdout (tables then go to stderr)",
    )
    gen.add_argument(
        "--results",
        metavar="PATH",
        default=None,
        help="write the figures for bench/all.py's table (and the raw results) to PATH",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.senders < 1:
        raise SystemExit("--senders must be at least 1")
    if args.store != "sqlite" and args.mode != "inproc":
        raise SystemExit(f"--store {args.store} is for inproc only; the server keeps its own")
    host_gc(args.python_gc)
    host_cpu(args.cpu)
    base = Path(tempfile.mkdtemp(prefix="bc-bench-", dir=args.dir))
    machine = machine_info(base, loop_name(args.uvloop))
    results: list[Result] = []
    try:
        if args.mode in ("inproc", "all"):
            results += bench_inproc(args, base)
        if args.mode in ("http", "all"):
            results += bench_http(args, base)
        if args.mode in ("wakeup", "all"):
            results += bench_wakeup(args, base)
    finally:
        if args.keep:
            log(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print_results(results, machine, stderr=args.json)
    return finish(args, "send", results, figures(results), machine)


if __name__ == "__main__":
    sys.exit(main())
