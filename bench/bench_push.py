"""Push delivery under heavy sending: webhook members served by the dispatcher, on
PostgreSQL and on SQLite.

One in-process hub (the store under test, its dispatcher running) and ``--members``
webhook members whose service is a local HTTP sink in a process of its own (it answers
every POST 200 at once and counts them). ``--senders`` concurrent senders send
``--messages`` messages in all, round-robin over the members, as fast as the hub takes
them; the figure is pushes per second from the first send until the sink has had every
message (each push is the webhook's POST, then the copy recorded delivered and acked),
and the store's transactions per push (with its send). With ``--backlog`` every message
is sent first and the dispatcher started after: pushes alone, and transactions per push
without the send.

PostgreSQL comes from the test harness (``tests/pg_harness.py``), restarted with its
durable defaults unless ``--no-durable`` (as ``bench_postgres``); SQLite is a file in a
temporary directory.

Run from the repository root: ``.venv/bin/python -m bench.bench_push``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from tests.pg_harness import start_postgres

from backchannel.callbacks import CallbackConfig, Service
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.hub import Hub
from backchannel.stores.base import Store
from bench.figures import Figure, write_results

SINK = r"""
import asyncio, sys
count = 0
async def handle(reader, writer):
    global count
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            if head.startswith(b"GET"):
                body = str(count).encode()
            else:
                count += 1
                body = b"{}"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Counting:
    """Counts the store's transactions (``transact`` and ``transact_each``'s each)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.n = 0
        real, each = store.transact, store.transact_each

        def transact(fn: Any) -> Any:
            self.n += 1
            return real(fn)

        def transact_each(fns: Any) -> Any:
            self.n += len(fns)
            return each(fns)

        store.transact = transact  # type: ignore[method-assign]
        store.transact_each = transact_each  # type: ignore[method-assign]


async def push_phase(
    store: Store, sink: str, args: argparse.Namespace, backlog: bool
) -> dict[str, float]:
    callbacks = CallbackConfig(secret="bench", services={"sink": Service("sink", sink)})
    hub = Hub(store, callbacks=callbacks, lease_seconds=60, check_delivery=False)
    members = [f"w{i}" for i in range(args.members)]
    async with hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "src")
        for m in members:
            await hub.add_member("t", m, delivery={"type": "webhook", "service": "sink"})
        counting = Counting(store)
        d = Dispatcher(hub, rescan_s=0.2)
        if not backlog:
            await d.start()
        try:
            async with httpx.AsyncClient() as http:

                async def seen() -> int:
                    return int((await http.get(f"{sink}/count")).text)

                base = await seen()
                todo = iter(range(args.messages))

                async def sender() -> None:
                    for i in todo:
                        await hub.send("t", "src", members[i % len(members)], f"m{i}", link=False)

                counting.n = 0
                started = time.perf_counter()
                await asyncio.gather(*(sender() for _ in range(args.senders)))
                sent = time.perf_counter() - started
                if backlog:  # pushes alone: the backlog is there, then the dispatcher
                    counting.n = 0
                    started = time.perf_counter()
                    await d.start()
                deadline = started + args.timeout
                while await seen() - base < args.messages:
                    if time.perf_counter() > deadline:
                        raise SystemExit(f"only {await seen() - base} pushed in {args.timeout} s")
                    await asyncio.sleep(0.01)
                took = time.perf_counter() - started
                # the last records land just after the sink counted its POST
                await asyncio.sleep(0.5)
                transactions = counting.n
        finally:
            await d.stop()
    return {
        "pushed_per_s": args.messages / took,
        "sent_per_s": args.messages / sent,
        "seconds": took,
        "transactions_per_message": transactions / args.messages,
    }


STORE_NAMES = {"postgres": "PostgreSQL", "sqlite": "SQLite"}


def figures_of(kind: str, backlog: bool, got: dict[str, float]) -> list[Figure]:
    """The figures of one phase, as ``bench/all.py``'s table shows them."""
    name = STORE_NAMES[kind]
    how = "pushes alone (a backlog)" if backlog else "sending and pushing"
    return [
        Figure(f"push {name}, {how}: pushed/s", got["pushed_per_s"], "msgs/s"),
        Figure(
            f"push {name}, {how}: transactions a message",
            got["transactions_per_message"],
            "",
        ),
    ]


async def run(args: argparse.Namespace, sink: str) -> tuple[list[Figure], dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="bc-bench-push-"))
    pg = None
    figures: list[Figure] = []
    raw: dict[str, Any] = {}
    try:
        for kind in args.stores.split(","):
            for backlog in MODES[args.mode]:
                if kind == "sqlite":
                    from backchannel.stores.sqlite import SqliteStore

                    db = tmp / f"push-{len(raw)}.db"
                    store: Store = SqliteStore(f"sqlite:///{db}")
                else:
                    from backchannel.stores.postgres import PostgresStore

                    if pg is None:
                        pg = start_postgres()
                        if args.durable and pg._process is not None:
                            from bench.bench_postgres import make_durable

                            make_durable(pg)
                    store = PostgresStore(pg.new_database())
                got = await push_phase(store, sink, args, backlog)
                raw[f"{kind}{' backlog' if backlog else ''}"] = got
                figures += figures_of(kind, backlog, got)
                log(
                    f"{kind:9} {'backlog of ' if backlog else ''}{args.messages} msgs, "
                    f"{args.senders} senders, {args.members} "
                    f"webhook members: {got['pushed_per_s']:8.0f} pushed/s "
                    f"(sent {got['sent_per_s']:.0f}/s, {got['seconds']:.2f} s), "
                    f"{got['transactions_per_message']:.2f} transactions per message"
                )
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return figures, raw


MODES = {"both": (False, True), "sending": (False,), "backlog": (True,)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_push", description=__doc__)
    p.add_argument("--stores", default="postgres,sqlite")
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--senders", type=int, default=16)
    p.add_argument("--messages", type=int, default=4000)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument(
        "--mode",
        choices=tuple(MODES),
        default="both",
        help="sending: sends and pushes at once; backlog: everything sent first, then the "
        "dispatcher started (pushes alone, no sends); both (the default): one, then the other",
    )
    p.add_argument("--results", help="write the figures as JSON to this path")
    p.add_argument("--durable", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    proc = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{proc.stdout.readline().strip()}"
        figures, raw = asyncio.run(run(args, url))
    finally:
        proc.kill()
        proc.wait()
    write_results(args.results, "push", figures, raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
