"""``backchannel backup``: a copy of a SQLite store taken while a hub writes to it is
one moment of the store (every message with its delivery, nothing half there), private
like the store, and a hub started on it delivers each message in it once."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backchannel import connect_sync
from tests.test_cli import run

pytestmark = pytest.mark.timeout(120)

WRITER = """
import sys
from backchannel import connect_sync
url, token = sys.argv[1], sys.argv[2]
with connect_sync(url, token) as hub:
    i = 0
    while True:
        hub.send("b", f"m{i}", message_id=f"m{i}")
        print(i, flush=True)
        i += 1
"""


def _sent_at_least(writer: subprocess.Popen[str], n: int) -> int:
    """Read the writer's count until it has sent ``n`` (the last index it printed)."""
    assert writer.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = writer.stdout.readline()
        assert line, "the writer stopped"
        if int(line) + 1 >= n:
            return int(line) + 1
    raise AssertionError(f"the writer did not send {n} messages in time")


def test_a_backup_taken_while_a_hub_writes_is_one_moment_of_the_store(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    url = f"sqlite://{db}"
    with connect_sync(url) as admin:
        admin.create_team("t", settings={"anchor_policy": "off"})
        a = admin.add_member("t", "a")["token"]
        b = admin.add_member("t", "b")["token"]
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, a], stdout=subprocess.PIPE, text=True
    )
    copy = tmp_path / "saved" / "copy.db"
    try:
        before = _sent_at_least(writer, 50)
        done = run("backup", str(copy), "--store", url)
        assert done.returncode == 0, done.stderr
        assert "schema version" in done.stderr and "Never run a hub on the copy" in done.stderr
        _sent_at_least(writer, before + 100)  # the hub went on writing meanwhile
    finally:
        writer.kill()
        writer.communicate()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        messages = {r[0] for r in conn.execute("SELECT message_id FROM messages")}
        copies = [r[0] for r in conn.execute("SELECT message_id FROM deliveries")]
    finally:
        conn.close()
    # one moment: the messages sent up to it, each with its one delivery, no later one
    n = len(messages)
    assert n >= before, f"the copy lacks messages sent before the backup ({n} < {before})"
    assert messages == {f"m{i}" for i in range(n)}, "the copy is not one moment"
    assert sorted(copies) == sorted(messages), "a message without its delivery, or two"
    with connect_sync(f"sqlite://{copy}", b) as hub:
        seen: list[str] = []
        while got := hub.receive(limit=200, wait=0):
            seen.extend(m.message_id for m in got)
            hub.ack([m.message_id for m in got])
    assert sorted(seen) == sorted(messages), "every message in the copy, delivered once"


def test_a_backup_refuses_what_it_cannot_copy_and_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    with connect_sync(f"sqlite://{db}") as admin:
        admin.create_team("t")
    there = tmp_path / "there.db"
    there.write_bytes(b"mine")
    refused = run("backup", str(there), "--store", f"sqlite://{db}")
    assert refused.returncode == 1
    assert "never overwrites" in refused.stderr, refused.stderr
    assert there.read_bytes() == b"mine"

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE notes (x)").connection.close()
    dest = tmp_path / "copy.db"
    refused = run("backup", str(dest), "--store", f"sqlite://{other}")
    assert refused.returncode == 1
    assert "not a backchannel store" in refused.stderr, refused.stderr
    assert not os.path.exists(dest), "a failed backup leaves no file"

    refused = run("backup", str(dest), "--store", "postgresql://h/db")
    assert refused.returncode == 1
    assert "pg_dump" in refused.stderr, refused.stderr
    refused = run("backup", str(dest), "--home", str(tmp_path / "nothing"))
    assert refused.returncode == 1
    assert "no SQLite store" in refused.stderr, refused.stderr
    assert not os.path.exists(dest)
