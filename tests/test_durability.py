"""SQLite across processes, and crash safety: nothing answered is ever lost."""

from __future__ import annotations

import json
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


@pytest.mark.slow
def test_kill_9_loses_no_answered_send(tmp_path: Path) -> None:
    home = tmp_path / "home"
    srv = start_server(home)
    tokens = srv.team("crash", "tx", "rx")
    answered: list[str] = []
    stop = threading.Event()

    def stream(worker: int) -> None:
        with httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {tokens['tx']}"}, timeout=5
        ) as c:
            i = 0
            while not stop.is_set():
                mid = f"c{worker}-{i}"
                try:
                    r = c.post("/v1/messages", json={"to": "rx", "text": mid, "message_id": mid})
                except httpx.HTTPError:
                    return  # the server died under us; this send was never answered
                if r.status_code in (200, 201):
                    answered.append(mid)
                i += 1

    threads = [threading.Thread(target=stream, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(answered) < 1500 and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.kill()  # SIGKILL in the middle of the stream
    stop.set()
    for t in threads:
        t.join(10)
    assert len(answered) >= 1500

    started = time.monotonic()
    srv2 = start_server(home)
    restart_s = time.monotonic() - started
    try:
        seen: list[str] = []
        with srv2.client(tokens["rx"]) as rx:
            while True:
                got = rx.get("/v1/inbox", params={"limit": 1000}).json()["messages"]
                if not got:
                    break
                seen.extend(m["message_id"] for m in got)
                rx.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        assert len(seen) == len(set(seen)), "nothing delivered twice"
        missing = set(answered) - set(seen)
        assert not missing, f"{len(missing)} answered sends lost, e.g. {sorted(missing)[:3]}"
        assert restart_s < 10, f"serving again took {restart_s:.1f} s"
    finally:
        srv2.stop()
