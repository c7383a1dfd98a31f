"""Batched sends and acks over HTTP: ``POST /v1/messages/batch`` and
``POST /v1/inbox/ack/batch`` against a real ``backchannel serve`` (SQLite, WAL,
synchronous=FULL), beside the single-message figures of ``bench_send http``; with
``--inproc``, the same load on the same calls of an in-process hub's member API
(``MemberApi.send_batch``, ``ack_and_receive``, ``receive``, ``ack_batch``).

K senders each post batches of B messages in a closed loop (the next batch as soon as the
previous one was answered: every message in it committed and fsynced); K receivers
long-poll and ack. By default (``--receive with-ack``) a receiver's one request a batch is
``POST /v1/inbox/receive``, acking the batch before; with ``--receive ack-batch`` it
long-polls ``GET /v1/inbox`` and acks what it got with ``POST /v1/inbox/ack/batch``. The
figure is messages received and acked per second (a message counts once its ack was
answered), and send→received latency from the batch's post.

    .venv/bin/python -m bench.bench_batch                 # 16 senders, batches of 50, 10 s
    .venv/bin/python -m bench.bench_batch --batch 200 --results out.json
    .venv/bin/python -m bench.bench_batch --inproc        # no HTTP: the member API
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    JsonClient,
    ServerProcess,
    add_gc_option,
    gc_thresholds,
    host_gc,
    json_client,
    loadavg,
    log,
    run,
    setup_team_http,
    setup_team_hub,
    summarize,
)
from bench.figures import Figure, Goal, write_results

TEAM = "bench"


class MemberClient(JsonClient):
    """The requests the load makes, as calls on an in-process member API: the answer is
    what the load reads of the route's JSON, taken from the models the calls return."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        api = self.api
        if path == "/v1/messages/batch":
            sent = await api.send_batch(body["messages"])
            return 200, {"failed": sent.failed}
        if path == "/v1/inbox/receive":
            got = await api.ack_and_receive(body["ack"], limit=body["limit"], wait=body["wait"])
            ids = [{"message_id": m.message_id} for m in got.messages]
            return 200, {"acked": got.acked, "messages": ids}
        if path == "/v1/inbox":
            assert params is not None
            got = await api.receive(limit=params["limit"], wait=params["wait"])
            return 200, {"messages": [{"message_id": m.message_id} for m in got]}
        if path == "/v1/inbox/ack/batch":
            acked = await api.ack_batch(body["message_ids"])
            return 200, {"acked": acked.acked}
        raise ValueError(f"the in-process load makes no {method} {path}")

    async def aclose(self) -> None:
        return None


async def _load_inproc(args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from backchannel.hub import Hub
    from backchannel.member import MemberApi
    from backchannel.stores.sqlite import SqliteStore

    names = [f"s{i}" for i in range(args.senders)] + [f"r{i}" for i in range(args.senders)]
    async with Hub(SqliteStore(db)) as hub:
        await setup_team_hub(hub, TEAM, names)
        clients: dict[str, JsonClient] = {}
        for name in names:
            member = await hub.get_member(TEAM, name)
            clients[name] = MemberClient(MemberApi(hub, member))
        return await _run(args, clients, time.process_time)


async def _load(
    args: argparse.Namespace, server: ServerProcess, tokens: dict[str, str]
) -> dict[str, Any]:
    clients = {
        name: json_client(args.client, server.url, token, 60.0) for name, token in tokens.items()
    }
    return await _run(args, clients, server.cpu_seconds)


async def _run(
    args: argparse.Namespace,
    clients: dict[str, JsonClient],
    hub_cpu: Callable[[], float | None],
) -> dict[str, Any]:
    k = args.senders
    senders = [clients[f"s{i}"] for i in range(k)]
    receivers = [clients[f"r{i}"] for i in range(k)]
    stop = asyncio.Event()
    posted: dict[str, float] = {}
    latencies: list[float] = []
    sent = received = 0
    errors: list[str] = []

    async def sender(i: int) -> None:
        nonlocal sent
        n = 0
        while not stop.is_set():
            items = []
            for _ in range(args.batch):
                mid = f"b-{i}-{n}"
                n += 1
                items.append({"to": f"r{i}", "text": "x" * args.size, "message_id": mid})
            at = time.perf_counter()
            for item in items:
                posted[item["message_id"]] = at
            status, data = await senders[i].call("POST", "/v1/messages/batch", {"messages": items})
            if status != 200 or data.get("failed"):
                errors.append(f"batch send answered {status}: {str(data)[:200]}")
                stop.set()
                return
            sent += len(items)

    def took(ids: list[str]) -> None:
        now = time.perf_counter()
        latencies.extend(now - posted.get(mid, now) for mid in ids)

    async def receiver_with_ack(i: int) -> None:
        nonlocal received
        held: list[str] = []
        while not stop.is_set() or held:
            body = {"ack": held, "wait": 0 if stop.is_set() else 1, "limit": 500}
            status, data = await receivers[i].call("POST", "/v1/inbox/receive", body)
            if status != 200 or data.get("acked") != len(held):
                errors.append(f"receive answered {status}: {str(data)[:200]}")
                stop.set()
                return
            received += len(held)
            held = [m["message_id"] for m in data["messages"]]
            took(held)
            if stop.is_set() and held:  # the last batch: ack it, take nothing more
                status, data = await receivers[i].call(
                    "POST", "/v1/inbox/ack/batch", {"message_ids": held}
                )
                received += len(held) if status == 200 else 0
                return

    async def receiver(i: int) -> None:
        nonlocal received
        params = {"wait": 1, "limit": 500}
        while not stop.is_set():
            status, data = await receivers[i].call("GET", "/v1/inbox", params=params)
            if status != 200:
                errors.append(f"inbox answered {status}: {str(data)[:200]}")
                stop.set()
                return
            ids = [m["message_id"] for m in data["messages"]]
            if not ids:
                continue
            took(ids)
            status, data = await receivers[i].call(
                "POST", "/v1/inbox/ack/batch", {"message_ids": ids}
            )
            if status != 200 or data.get("acked") != len(ids):
                errors.append(f"batch ack answered {status}: {str(data)[:200]}")
                stop.set()
                return
            received += len(ids)

    tasks = [asyncio.create_task(sender(i)) for i in range(k)]
    receive = receiver_with_ack if args.receive == "with-ack" else receiver
    tasks += [asyncio.create_task(receive(i)) for i in range(k)]
    await asyncio.sleep(args.warmup)
    base, t0, cpu0 = received, time.perf_counter(), hub_cpu()
    await asyncio.sleep(args.duration)
    got, wall, cpu1 = received - base, time.perf_counter() - t0, hub_cpu()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in (*senders, *receivers):
        await c.aclose()
    if errors:
        raise RuntimeError(errors[0])
    return {
        "throughput_msgs_s": got / wall,
        "sent": sent,
        "received": received,
        "wall_s": wall,
        # the hub's CPU a message: the server process, or in-process the whole process
        "hub_cpu_us_per_msg": (
            1e6 * (cpu1 - cpu0) / max(got, 1) if cpu0 is not None and cpu1 is not None else None
        ),
        "e2e_ms": summarize(latencies),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--senders", type=int, default=16)
    p.add_argument("--batch", type=int, default=50, help="messages per batch send")
    p.add_argument("--size", type=int, default=100, help="bytes of text per message")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--client", choices=["httpx", "raw"], default="raw")
    p.add_argument(
        "--receive",
        choices=["with-ack", "ack-batch"],
        default="with-ack",
        help="with-ack: POST /v1/inbox/receive acking the batch before (one request a "
        "batch); ack-batch: GET /v1/inbox, then POST /v1/inbox/ack/batch",
    )
    p.add_argument(
        "--inproc",
        action="store_true",
        help="no server: the same load on an in-process hub's member API",
    )
    add_gc_option(p)
    p.add_argument("--results", help="write the figures as JSON to this path")
    args = p.parse_args(argv)
    host_gc(args.python_gc)
    where = "in-process" if args.inproc else "over HTTP"
    with tempfile.TemporaryDirectory(prefix="bc-batch-") as tmp:
        home = Path(tmp)
        if args.inproc:
            log(
                f"[batch] in-process, {args.senders} senders, batches of {args.batch}, "
                f"receive {args.receive}, gc thresholds {gc_thresholds()}, load {loadavg()}"
            )
            m = run(_load_inproc, args, home / "bench.db", use_uvloop=True)
        else:
            m = _serve_and_load(args, home)
    e2e = m["e2e_ms"]
    print(
        f"batch sends {where}, {args.senders} senders x {args.batch}: "
        f"{m['throughput_msgs_s']:,.0f} msgs/s received and acked; send→received "
        f"p50 {e2e.get('p50_ms', 0):.1f} p99 {e2e.get('p99_ms', 0):.1f} ms; "
        f"hub CPU {m['hub_cpu_us_per_msg'] or 0:.0f} µs/msg; load {loadavg()}"
    )
    label = "in-process" if args.inproc else "HTTP"
    goal = (
        Goal(">=", 10000, "issue: in-process at 16 senders")
        if args.inproc
        else Goal(">=", 3000, "issue: HTTP at 16 senders")
    )
    figures = [
        Figure(
            f"{label} batch sends and acks, msgs/s",
            m["throughput_msgs_s"],
            "msgs/s",
            goal,
            f"{args.senders} senders, batches of {args.batch}, receive {args.receive}",
        ),
        Figure(f"{label} batch send→received, p99", e2e.get("p99_ms"), "ms"),
    ]
    write_results(args.results, "batch", figures, {"args": vars(args), "metrics": m})
    return 0


def _serve_and_load(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    server = ServerProcess(home, f"sqlite:///{home / 'bench.db'}", (), None)
    server.start(timeout=60)
    try:
        members = [f"s{i}" for i in range(args.senders)]
        members += [f"r{i}" for i in range(args.senders)]
        tokens = setup_team_http(server.url, server.admin_token, TEAM, members)
        log(
            f"[batch] over HTTP, {args.senders} senders, batches of {args.batch}, receive "
            f"{args.receive}, load {loadavg()}"
        )
        return asyncio.run(_load(args, server, tokens))
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
