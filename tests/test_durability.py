"""SQLite across processes, and crash safety: nothing answered is ever lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from backchannel import connect_sync
from tests.conftest import start_server

WRITER = """
import sys
from backchannel import connect_sync
url, token, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with connect_sync(url, token) as hub:
    for i in range(n):
        hub.send("sink", f"{tag}-{i}", message_id=f"{tag}-{i}")
print("done")
"""

READER = """
import json, sys, time
from backchannel import connect_sync
url, token, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = []
deadline = time.monotonic() + 90
with connect_sync(url, token) as hub:
    while len(seen) < expected and time.monotonic() < deadline:
        got = hub.receive(limit=200, wait=2.0)
        seen.extend(m.message_id for m in got)
        if got:
            hub.ack([m.message_id for m in got])
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_several_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'shared.db'}"
    with connect_sync(url) as admin:
        admin.create_team("mp")
        sink = admin.add_member("mp", "sink")["token"]
        writers = [admin.add_member("mp", f"w{i}")["token"] for i in range(4)]
    per = 150
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, url, sink, str(per * len(writers))],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, tok, str(per), f"w{i}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, tok in enumerate(writers)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        assert out.strip() == "done"
    out, _ = reader.communicate(timeout=120)
    seen = json.loads(out)
    expected = {f"w{i}-{n}" for i in range(len(writers)) for n in range(per)}
    assert len(seen) == len(set(seen)), "nothing delivered twice"
    assert set(seen) == expected, f"lost: {sorted(expected - set(seen))[:5]}"
    # per-sender order is kept in the recipient's inbox
    for i in range(len(writers)):
        mine = [int(s.split("-")[1]) for s in seen if s.startswith(f"w{i}-")]
        assert mine == sorted(mine)


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


STREAM = 50_000  # messages in the stream the server is killed in the middle of
SENDERS = 8  # concurrent senders, each on its own keep-alive connection


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_loses_no_answered_send(tmp_path: Path) -> None:
    """``kill -9`` of a real ``serve`` in the middle of a 50,000-message stream from
    several concurrent senders over HTTP, with a consumer receiving and acking all along.
    Every send answered 2xx reaches the idempotent consumer (which drops copies it has
    seen by message id), the stream completes after the restart (unanswered sends are
    retried with the same message id), and the restart time is printed."""
    home = tmp_path / "home"
    srv = start_server(home, None, "--lease", "2")
    port = int(srv.url.rsplit(":", 1)[1])
    tokens = srv.team("crash", "tx", "rx")
    answered: list[set[str]] = [set() for _ in range(SENDERS)]
    seen: set[str] = set()
    copies = [0]  # deliveries the consumer got, repeats included
    done_sending = threading.Event()
    deadline = time.monotonic() + 600

    def client(token: str) -> httpx.Client:
        return httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )

    def sender(worker: int) -> None:
        with client(tokens["tx"]) as c:
            for i in range(worker, STREAM, SENDERS):
                mid = f"c{worker}-{i}"
                while time.monotonic() < deadline:
                    try:
                        r = c.post(
                            "/v1/messages", json={"to": "rx", "text": mid, "message_id": mid}
                        )
                    except httpx.TransportError:
                        time.sleep(0.05)  # the hub is down: retry this send when it is back
                        continue
                    if r.status_code in (200, 201):
                        answered[worker].add(mid)
                        break
                    time.sleep(0.05)

    def consumer() -> None:
        with client(tokens["rx"]) as c:
            while time.monotonic() < deadline:
                if done_sending.is_set() and seen >= set().union(*answered):
                    return
                try:
                    got = c.get("/v1/inbox", params={"limit": 500, "wait": 1}).json()["messages"]
                except (httpx.TransportError, httpx.HTTPStatusError, KeyError, ValueError):
                    time.sleep(0.05)
                    continue
                ids = [m["message_id"] for m in got]
                # received is received: an ack cut off by the kill may still have landed, and
                # then the message never comes back
                copies[0] += len(ids)
                seen.update(ids)  # idempotent: a repeat changes nothing
                if ids:
                    try:
                        c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
                    except (httpx.TransportError, httpx.HTTPStatusError):
                        time.sleep(0.05)  # not acked: the copies come back after their lease

    threads = [threading.Thread(target=sender, args=(w,)) for w in range(SENDERS)]
    reader = threading.Thread(target=consumer)
    for t in [*threads, reader]:
        t.start()
    srv2 = None
    try:
        began = time.monotonic()
        while sum(map(len, answered)) < STREAM // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        rate = STREAM // 2 / (time.monotonic() - began)
        at_kill = sum(map(len, answered))
        srv.kill()  # SIGKILL in the middle of the stream
        started = time.monotonic()
        srv2 = start_server(home, None, "--lease", "2", port=port)
        restart_s = time.monotonic() - started
        restart_cpu = _cpu_seconds(srv2.proc.pid)  # what the wall time is on a quiet machine
        for t in threads:
            t.join(deadline - time.monotonic())
        done_sending.set()
        reader.join(max(deadline - time.monotonic(), 1))
        every = set().union(*answered)
        print(
            f"\nkill -9 after {at_kill} answered sends; serving again {restart_s:.2f} s after "
            f"the restart began ({restart_cpu:.2f} s of CPU); {len(every)} answered, {copies[0]} copies consumed "
            f"({copies[0] - len(seen)} repeats dropped by the consumer); {rate:.0f} sends/s "
            "before the kill"
        )
        assert at_kill >= STREAM // 2
        assert len(every) == STREAM, "the stream completes once the hub is back"
        missing = every - seen
        assert not missing, f"{len(missing)} answered sends lost, e.g. {sorted(missing)[:3]}"
        assert seen <= {f"c{i % SENDERS}-{i}" for i in range(STREAM)}
    finally:
        done_sending.set()
        if srv2 is not None:
            srv2.stop()
        srv.kill()
