"""Many agents waiting at once: ``--receivers`` (1,000) members each hold a receive open
on a real ``backchannel serve`` (long-poll ``GET /v1/inbox?wait=`` or the SSE stream
``GET /v1/inbox/stream``), one connection each; then a message goes to one of them,
chosen at random, ``--samples`` times, and the time from the send's start to that
receiver having it is recorded. The server's memory is read (RSS) with no receiver
held and with all of them held: the difference, divided by their number, is the memory
per held receiver.

Target (issue figures): p99 <= 20 ms with 1,000 receivers held. The load generator and
the server share this machine's CPUs. Run: ``.venv/bin/python -m bench.bench_receivers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ServerProcess, log, percentile
from bench.figures import Figure, Goal, write_results

TARGET_P99_MS = 20.0
perf = time.perf_counter


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _members(url: str, admin: str, n: int, extra: list[str]) -> dict[str, str]:
    import httpx

    h = {"Authorization": f"Bearer {admin}"}
    tokens = {}
    with httpx.Client(base_url=url, headers=h, timeout=30) as c:
        c.post("/v1/teams", json={"name": "many"}).raise_for_status()
        for name in [*(f"r{i}" for i in range(n)), *extra]:
            r = c.post("/v1/teams/many/members", json={"name": name})
            r.raise_for_status()
            tokens[name] = r.json()["token"]
    return tokens


class Receiver:
    """One member holding a receive open on its own connection."""

    def __init__(self, host: str, port: int, token: str, mode: str) -> None:
        self.host, self.port, self.token, self.mode = host, port, token, mode
        self.got: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
        self.holding = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            if self.mode == "sse":
                await self._sse(reader, writer, stop)
            else:
                await self._poll(reader, writer, stop)
        finally:
            writer.close()

    def _request(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: Bearer {self.token}\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n"
        )
        return head.encode() + body

    async def _response(self, reader: asyncio.StreamReader) -> Any:
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        if b" 200 " not in status:
            raise RuntimeError(f"{status!r} {body[:200]!r}")
        return json.loads(body)

    async def _poll(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            writer.write(self._request("GET", "/v1/inbox?wait=20&limit=10"))
            self.holding.set()
            data = await self._response(reader)
            now = perf()
            ids = [m["message_id"] for m in data["messages"]]
            for m in data["messages"]:
                await self.got.put((now, m["text"]))
            if ids:
                writer.write(self._request("POST", "/v1/inbox/ack", json.dumps(
                    {"message_ids": ids}).encode()))  # fmt: skip
                await self._response(reader)

    async def _sse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stop: asyncio.Event
    ) -> None:
        writer.write(self._request("GET", "/v1/inbox/stream"))
        while (line := await reader.readline()) not in (b"\r\n", b""):
            pass
        self.holding.set()
        while not stop.is_set():
            line = await reader.readline()
            if not line:
                return
            text = line.decode().strip()
            if not text.startswith("data: "):
                continue
            now = perf()
            msg = json.loads(text[6:])
            await self.got.put((now, msg["text"]))
            # acks on a connection of their own, opened when needed: an idle one would be
            # closed by the server's keep-alive timeout long before the first message
            ack_r, ack_w = await asyncio.open_connection(self.host, self.port)
            try:
                body = json.dumps({"message_ids": [msg["message_id"]]}).encode()
                ack_w.write(self._request("POST", "/v1/inbox/ack", body))
                await self._response(ack_r)
            finally:
                ack_w.close()


async def measure(url: str, tokens: dict[str, str], args: argparse.Namespace, pid: int) -> Any:
    import httpx

    host, port = url.split("//")[1].split(":")
    receivers = [
        Receiver(host, int(port), tokens[f"r{i}"], args.mode) for i in range(args.receivers)
    ]
    rss0 = _rss_mb(pid)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in receivers]
    await asyncio.wait_for(asyncio.gather(*(r.holding.wait() for r in receivers)), 60)
    await asyncio.sleep(1.0)  # let the server settle with every receive held
    rss1 = _rss_mb(pid)
    lat: list[float] = []
    rng = random.Random(7)
    headers = {"Authorization": f"Bearer {tokens['sender']}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as sender:
        for n in range(args.samples):
            target = rng.randrange(args.receivers)
            text = f"sample {n}"
            started = perf()
            r = await sender.post("/v1/messages", json={"to": f"r{target}", "text": text})
            r.raise_for_status()
            at, got = await asyncio.wait_for(receivers[target].got.get(), 30)
            assert got == text, (got, text)
            lat.append(at - started)
            await asyncio.sleep(args.gap)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rss0, rss1, sorted(lat)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--receivers", type=int, default=1000)
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--gap", type=float, default=0.01, help="seconds between samples")
    p.add_argument("--mode", choices=["poll", "sse", "both"], default="both")
    p.add_argument("--results", metavar="PATH", help="write the figures for bench/all.py to PATH")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.receivers * 2 + 256  # this process and the server it starts
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    ok = True
    figures: list[Figure] = []
    raw: dict[str, Any] = {"receivers": args.receivers, "samples": args.samples}
    for mode in ["poll", "sse"] if args.mode == "both" else [args.mode]:
        args.mode = mode
        with tempfile.TemporaryDirectory(prefix="bc-recv-") as tmp:
            extra = ["--max-connections", str(args.receivers * 2 + 100)]
            srv = ServerProcess(Path(tmp) / "home", f"sqlite:///{tmp}/hub.db", extra=extra)
            try:
                srv.start(timeout=60)
            except Exception:  # a serve without --max-connections
                srv = ServerProcess(Path(tmp) / "home2", f"sqlite:///{tmp}/hub2.db")
                srv.start(timeout=60)
            try:
                log(f"{mode}: creating {args.receivers} members ...")
                tokens = _members(srv.url, srv.admin_token, args.receivers, ["sender"])
                assert srv.proc is not None
                rss0, rss1, lat = asyncio.run(measure(srv.url, tokens, args, srv.proc.pid))
            finally:
                srv.stop()
        p50, p99 = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
        ok &= p99 <= TARGET_P99_MS
        per = (rss1 - rss0) * 1024 / args.receivers
        label = "long-poll" if mode == "poll" else "SSE"
        figures += [
            Figure(f"{label}, every receiver held: p99 send→received", p99, "ms",
                   Goal("<=", TARGET_P99_MS, "issue 24")),
            Figure(f"{label}: server memory per held receiver", per, "KiB"),
        ]  # fmt: skip
        raw[mode] = {"p50_ms": p50, "p99_ms": p99, "max_ms": lat[-1] * 1000, "rss_mb": [rss0, rss1]}
        print(
            f"{mode:<5} {args.receivers} receivers held: send->received p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms, max {lat[-1] * 1000:.1f} ms ({len(lat)} samples); server RSS "
            f"{rss0:.0f} -> {rss1:.0f} MB ({per:.1f} KiB per held receiver)"
        )
    print(f"target p99 <= {TARGET_P99_MS:g} ms: " + ("met" if ok else "MISSED"))
    write_results(args.results, "receivers", figures, raw)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
