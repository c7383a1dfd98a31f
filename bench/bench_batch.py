"""Batched sends and acks over HTTP: ``POST /v1/messages/batch`` and
``POST /v1/inbox/ack/batch`` against a real ``backchannel serve`` (SQLite, WAL,
synchronous=FULL), beside the single-message figures of ``bench_send http``.

K senders each post batches of B messages in a closed loop (the next batch as soon as the
previous one was answered: every message in it committed and fsynced); K receivers
long-poll and ack. By default (``--receive with-ack``) a receiver's one request a batch is
``POST /v1/inbox/receive``, acking the batch before; with ``--receive ack-batch`` it
long-polls ``GET /v1/inbox`` and acks what it got with ``POST /v1/inbox/ack/batch``. The
figure is messages received and acked per second (a message counts once its ack was
answered), and send→received latency from the batch's post.

    .venv/bin/python -m bench.bench_batch                 # 16 senders, batches of 50, 10 s
    .venv/bin/python -m bench.bench_batch --batch 200 --results out.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    ServerProcess,
    json_client,
    loadavg,
    log,
    setup_team_http,
    summarize,
)
from bench.figures import Figure, Goal, write_results

TEAM = "bench"


async def _load(args: argparse.Namespace, url: str, tokens: dict[str, str]) -> dict[str, Any]:
    k = args.senders
    senders = [json_client(args.client, url, tokens[f"s{i}"], 60.0) for i in range(k)]
    receivers = [json_client(args.client, url, tokens[f"r{i}"], 60.0) for i in range(k)]
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
    base, t0 = received, time.perf_counter()
    await asyncio.sleep(args.duration)
    got, wall = received - base, time.perf_counter() - t0
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
    p.add_argument("--results", help="write the figures as JSON to this path")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bc-batch-") as tmp:
        home = Path(tmp)
        server = ServerProcess(home, f"sqlite:///{home / 'bench.db'}", (), None)
        server.start(timeout=60)
        try:
            members = [f"s{i}" for i in range(args.senders)]
            members += [f"r{i}" for i in range(args.senders)]
            tokens = setup_team_http(server.url, server.admin_token, TEAM, members)
            log(
                f"[batch] {args.senders} senders, batches of {args.batch}, receive "
                f"{args.receive}, load {loadavg()}"
            )
            m = asyncio.run(_load(args, server.url, tokens))
        finally:
            server.stop()
    e2e = m["e2e_ms"]
    print(
        f"batch sends over HTTP, {args.senders} senders x {args.batch}: "
        f"{m['throughput_msgs_s']:,.0f} msgs/s received and acked; send→received "
        f"p50 {e2e.get('p50_ms', 0):.1f} p99 {e2e.get('p99_ms', 0):.1f} ms; load {loadavg()}"
    )
    figures = [
        Figure(
            "HTTP batch sends and acks, msgs/s",
            m["throughput_msgs_s"],
            "msgs/s",
            Goal(">=", 3000, "issue: HTTP at 16 senders"),
            f"{args.senders} senders, batches of {args.batch}, receive {args.receive}",
        ),
        Figure("HTTP batch send→received, p99", e2e.get("p99_ms"), "ms"),
    ]
    write_results(args.results, "batch", figures, {"args": vars(args), "metrics": m})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
