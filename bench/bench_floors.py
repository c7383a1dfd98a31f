"""The floors under every message: what one hand-off costs on this machine.

A message costs the hub more at a low rate than at saturation (in-process at 16
senders, about 900 µs of CPU a message at 1,000 msgs/s offered against 250–400 µs as
fast as possible), because at a low rate nothing is shared: each store transaction is a
trip to the writer thread and back of its own, each commit an fsync of its own, each
request a wake-up of the event loop of its own. This benchmark measures those floors
one at a time, so that a change to the hub's shape (a writer process, a transaction
run on the event loop) can be costed before it is built:

- a round trip from the event loop to a thread and back (``queue.SimpleQueue``, then
  ``call_soon_threadsafe``), as the SQLite store makes one per batch;
- a commit of one row with ``synchronous=FULL`` (an fsync of the WAL) and ``NORMAL``;
- the SQLite store's own transaction doing nothing, awaited one at a time;
- the hub's own work a message, on the memory store (no store cost, no thread): a send,
  and a receive with its ack taking two messages at a time, as receivers do under the
  in-process load on SQLite (16 senders, 0.5 receives a message);
- one HTTP request, as the server's CPU per request at 16 keep-alive connections: to a
  bare ASGI app behind the hub's own uvicorn protocol, then to ``backchannel serve``:
  ``GET /healthz``, a receive that finds nothing (``POST /v1/inbox/receive``), a send;
  then the bare app and the send again at a low rate (``--slow-rate``, 200 requests/s),
  where the server sleeps between requests and each one wakes it.

CPU is the process's (every thread, user and kernel); the figures are informational
(no targets), and compare only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import queue
import sqlite3
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.common import (  # noqa: E402
    ServerProcess,
    cpu_of,
    cpu_self,
    log,
    run,
    setup_team_http,
    setup_team_hub,
)
from bench.figures import Figure, write_results  # noqa: E402

#: A bare ASGI app served by uvicorn with the hub's own protocol class and loop.
_BARE_SERVER = textwrap.dedent(
    """
    import socket, sys, uvicorn
    from backchannel.interfaces.guard import ConnectionLimits, guarded_protocol

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(2048)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, loop="uvloop", http=guarded_protocol(ConnectionLimits()),
                            log_level="warning", access_log=False, server_header=False,
                            lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    """
)


HUB_WORK = (
    "the hub's own work: a send, CPU a message",
    "the hub's own work: receive and ack, 2 at a time, CPU a message",
)


def _per_call(n: int, fn: Callable[[], None]) -> tuple[float, float]:
    """CPU and wall µs per call of ``fn``, ``n`` calls."""
    cpu, wall = cpu_self(), time.perf_counter()
    for _ in range(n):
        fn()
    return (cpu_self() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def thread_round_trip(n: int) -> tuple[float, float]:
    """Event loop → a thread blocked on a queue → ``call_soon_threadsafe`` back."""
    jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None]
    jobs = queue.SimpleQueue()

    def worker() -> None:
        while (job := jobs.get()) is not None:
            loop, fut = job
            loop.call_soon_threadsafe(fut.set_result, None)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    loop = asyncio.get_running_loop()
    try:
        cpu, wall = cpu_self(), time.perf_counter()
        for _ in range(n):
            fut = loop.create_future()
            jobs.put((loop, fut))
            await fut
        return (cpu_self() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6
    finally:
        jobs.put(None)
        thread.join()


def sqlite_commits(directory: Path, n: int) -> dict[str, tuple[float, float]]:
    conn = sqlite3.connect(directory / "floors.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x TEXT)")
    row = ("x" * 300,)

    def commit() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?)", row)
        conn.execute("COMMIT")

    out = {}
    try:
        for level in ("FULL", "NORMAL"):
            conn.execute(f"PRAGMA synchronous = {level}")
            out[level] = _per_call(n, commit)
    finally:
        conn.close()
    return out


async def store_noop(directory: Path, n: int) -> tuple[float, float]:
    from backchannel.stores.sqlite import SqliteStore

    store = SqliteStore(directory / "store.db")
    await store.open()
    try:
        cpu, wall = cpu_self(), time.perf_counter()
        for _ in range(n):
            await store.transact(lambda tx: None)
        return (cpu_self() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6
    finally:
        await store.close()


async def hub_work(n: int, batch: int = 2) -> tuple[float, float]:
    """The hub's CPU a message on the memory store, one call at a time: a send, then a
    receive and an ack of ``batch`` messages. The collector is tuned as for a busy hub
    (``tune_gc``) while it runs."""
    from backchannel import tune_gc
    from backchannel.hub import Hub
    from backchannel.stores.memory import MemoryStore

    before = tune_gc()
    text = "x" * 256
    send = receive = 0.0
    count = 0
    try:
        async with Hub(MemoryStore()) as hub:
            await setup_team_hub(hub, "floors", ["s0", "r0"])
            for k in range(n // batch + 20):
                start = cpu_self()
                for _ in range(batch):
                    await hub.send("floors", "s0", "r0", text)
                sent = cpu_self()
                got = await hub.receive("floors", "r0", limit=batch, wait=0)
                await hub.ack("floors", "r0", [m.message.message_id for m in got])
                if k >= 20:  # the first rounds warm the caches up
                    send += sent - start
                    receive += cpu_self() - sent
                    count += len(got)
    finally:
        gc.set_threshold(*before)
    return send / count * 1e6, receive / count * 1e6


# -- HTTP ---------------------------------------------------------------------------------


async def _connection(
    port: int, request: bytes, counts: list[int], i: int, gap: float, offset: float
) -> None:
    """Requests one after another on one connection; with ``gap``, one every ``gap``
    seconds from ``offset`` on (the connections' schedules interleaved)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    due = time.perf_counter() + offset
    try:
        while True:
            if gap:
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                due += gap
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            size = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    size = int(line[15:])
            body = await reader.readexactly(size)
            if not head.startswith(b"HTTP/1.1 2"):
                raise RuntimeError(f"{head.splitlines()[0]!r}: {body[:200]!r}")
            counts[i] += 1
    finally:
        writer.close()


async def server_cpu_per_request(
    pid: int, port: int, requests: list[bytes], seconds: float, rate: float = 0.0
) -> tuple[float, float]:
    """Server CPU µs a request, and requests/s, with one keep-alive connection per
    request template, counted over ``seconds`` after a warm-up second: as fast as the
    server answers, or ``rate`` requests/s in all."""
    counts = [0] * len(requests)
    gap = len(requests) / rate if rate else 0.0
    tasks = [
        asyncio.create_task(_connection(port, r, counts, i, gap, gap * i / len(requests)))
        for i, r in enumerate(requests)
    ]
    try:
        await asyncio.sleep(min(1.0, seconds))
        for t in tasks:
            if t.done():
                t.result()  # a refused request: say why
        before, cpu = sum(counts), cpu_of(pid) or 0.0
        await asyncio.sleep(seconds)
        done, used = sum(counts) - before, (cpu_of(pid) or 0.0) - cpu
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return used / max(done, 1) * 1e6, done / seconds


def _get(path: str, token: str = "") -> bytes:
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nhost: bench\r\n{auth}\r\n".encode()


def _post(path: str, token: str, body: Any) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def http_floors(
    directory: Path, seconds: float, conns: int, slow: float
) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    bare = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _BARE_SERVER, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert bare.stdout is not None
        port = int(await bare.stdout.readline())
        for _ in range(100):  # listening once a connection is accepted
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        out["bare"] = await server_cpu_per_request(bare.pid, port, [_get("/")] * conns, seconds)
        out["bare, slow"] = await server_cpu_per_request(
            bare.pid, port, [_get("/")] * conns, seconds, slow
        )
    finally:
        bare.terminate()
        await bare.wait()

    home = directory / "serve"
    server = ServerProcess(home, f"sqlite:///{home / 'floors.db'}")
    server.start()
    try:
        assert server.proc is not None
        pid, port = server.proc.pid, int(server.url.rsplit(":", 1)[1])
        names = [f"m{i}" for i in range(conns)]
        tokens = setup_team_http(server.url, server.admin_token, "floors", [*names, "sink"])
        out["healthz"] = await server_cpu_per_request(
            pid, port, [_get("/healthz")] * conns, seconds
        )
        empty = [_post("/v1/inbox/receive", tokens[n], {"ack": [], "wait": 0}) for n in names]
        out["receive"] = await server_cpu_per_request(pid, port, empty, seconds)
        sends = [_post("/v1/messages", tokens[n], {"to": "sink", "text": "x" * 256}) for n in names]
        out["send"] = await server_cpu_per_request(pid, port, sends, seconds)
        out["send, slow"] = await server_cpu_per_request(pid, port, sends, seconds, slow)
    finally:
        server.stop()
    return out


async def main(args: argparse.Namespace) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bc-floors-") as tmp:
        directory = Path(tmp)
        log("[floors] thread round trip ...")
        hop = await thread_round_trip(args.calls)
        log("[floors] SQLite commits ...")
        commits = sqlite_commits(directory, max(args.calls // 5, 50))
        log("[floors] the store's empty transaction ...")
        noop = await store_noop(directory, args.calls)
        log("[floors] the hub's own work on the memory store ...")
        work = await hub_work(args.calls)
        log("[floors] HTTP requests ...")
        http = await http_floors(directory, args.seconds, args.connections, args.slow_rate)

    def fig(name: str, value: float, note: str = "") -> Figure:
        return Figure(name, round(value, 1), "µs", note=note)

    figures = [
        fig("event loop → thread → event loop, CPU", hop[0], f"wall {hop[1]:.0f} µs"),
        fig(
            "SQLite commit of one row, synchronous=FULL, CPU",
            commits["FULL"][0],
            f"wall {commits['FULL'][1]:.0f} µs",
        ),
        fig(
            "SQLite commit of one row, synchronous=NORMAL, CPU",
            commits["NORMAL"][0],
            f"wall {commits['NORMAL'][1]:.0f} µs",
        ),
        fig(
            "SQLite store: empty transaction, one at a time, CPU", noop[0], f"wall {noop[1]:.0f} µs"
        ),
        fig(HUB_WORK[0], work[0], "memory store, one call at a time"),
        fig(HUB_WORK[1], work[1], "memory store, two messages a receive"),
    ]
    labels = {
        "bare": "HTTP request to a bare ASGI app, server CPU",
        "healthz": "HTTP GET /healthz, server CPU",
        "receive": "HTTP receive finding nothing, server CPU",
        "send": "HTTP send, server CPU",
        "bare, slow": "HTTP request to a bare ASGI app at a low rate, server CPU",
        "send, slow": "HTTP send at a low rate, server CPU",
    }
    for key, label in labels.items():
        cpu, rate = http[key]
        figures.append(fig(label, cpu, f"{rate:,.0f} requests/s, {args.connections} connections"))
    return figures


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=5000, help="round trips and transactions")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per HTTP figure")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections")
    parser.add_argument(
        "--slow-rate",
        type=float,
        default=200.0,
        help="requests/s of the low-rate HTTP figures (a server woken for each request)",
    )
    parser.add_argument("--results", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    for name in ("calls", "seconds", "connections", "slow_rate"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")

    figures = run(main, args, use_uvloop=True)
    width = max(len(f.name) for f in figures)
    for f in figures:
        print(f"{f.name:<{width}}  {f.value:>8,.1f} {f.unit}  {f.note}")
    write_results(args.results, "floors", figures)


if __name__ == "__main__":
    cli()
