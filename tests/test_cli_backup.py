"""``backchannel backup``: a copy of a SQLite store taken while a hub writes to it is
one moment of the store (every message with its delivery, nothing half there), private
like the store, and a hub started on it delivers each message in it once."""

from __future__ import annotations

import contextlib
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


def test_a_backup_over_a_users_own_open_file_leaves_it_as_it_was(tmp_path: Path) -> None:
    """The backup named after a file of the user's that others may read (0644): refused,
    its mode and content kept, nothing written beside it."""
    db = tmp_path / "hub.db"
    with connect_sync(f"sqlite://{db}") as admin:
        admin.create_team("t")
    notes = tmp_path / "out" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("my notes\n")
    notes.chmod(0o644)
    refused = run("backup", str(notes), "--store", f"sqlite://{db}")
    assert refused.returncode == 1
    assert "never overwrites" in refused.stderr and str(notes) in refused.stderr
    assert (notes.read_text(), stat.S_IMODE(notes.stat().st_mode)) == ("my notes\n", 0o644)
    assert sorted(p.name for p in notes.parent.iterdir()) == ["notes.txt"]


def _store_with_messages(path: Path, n: int = 20) -> None:
    with connect_sync(f"sqlite://{path}") as admin:
        admin.create_team("t", settings={"anchor_policy": "off"})
        a = admin.add_member("t", "a")["token"]
        admin.add_member("t", "b")
    with connect_sync(f"sqlite://{path}", a) as hub:
        for i in range(n):
            hub.send("b", f"m{i}", message_id=f"m{i}")


def test_a_link_swapped_in_at_the_backups_name_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the copy is taken, someone who may write the backup's directory puts a
    symlink at the backup's name, pointing at a database of the user's: that file is
    left as it was; the backup is refused naming the name, or is a file of its own there."""
    from backchannel.errors import StoreError
    from backchannel.stores.sqlite import backup as backup_module

    db = tmp_path / "hub.db"
    _store_with_messages(db)
    victim = tmp_path / "notes.db"  # a database of another program of the user's
    with contextlib.closing(sqlite3.connect(victim)) as conn:
        conn.execute("CREATE TABLE notes (x)")
        conn.execute("INSERT INTO notes VALUES ('precious')")
        conn.commit()
    victim.chmod(0o644)
    before = victim.read_bytes()
    dest = tmp_path / "shared" / "copy.db"
    connect = sqlite3.connect

    def swapping(path: object, *args: object, **kwargs: object) -> sqlite3.Connection:
        if os.fspath(path) != os.fspath(db):  # the copy is about to be written: swap now
            if dest.exists() or dest.is_symlink():
                dest.unlink()
            dest.symlink_to(victim)
        return connect(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(backup_module.sqlite3, "connect", swapping)
    refusal = None
    try:
        backup_module.backup(db, dest)
    except StoreError as exc:
        refusal = exc.message
    monkeypatch.undo()
    assert victim.read_bytes() == before, "the backup was written into the user's file"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    if refusal is not None:
        assert str(dest) in refusal and "never overwrites" in refusal, refusal
    else:
        assert not dest.is_symlink()
        assert stat.S_IMODE(dest.lstat().st_mode) == 0o600
    left = [p.name for p in dest.parent.iterdir() if p.name != "copy.db"]
    assert left == [], f"the backup left {left} behind"


KILLED = """
import os, signal, sqlite3, sys
from pathlib import Path
from backchannel.stores.sqlite import backup
source, dest = sys.argv[1], sys.argv[2]
connect = sqlite3.connect

def dying(path, *args, **kwargs):
    if os.fspath(path) != source:  # the copy is being written: killed now
        os.kill(os.getpid(), signal.SIGKILL)
    return connect(path, *args, **kwargs)

backup.sqlite3.connect = dying
backup.backup(Path(source), Path(dest))
"""


def test_a_backup_killed_midway_leaves_nothing_named_like_a_backup(tmp_path: Path) -> None:
    """``kill -9`` while the copy is written: no file at the backup's name (one there
    would be taken for a backup, and restored: an empty store), and the next backup to
    that name is taken."""
    db = tmp_path / "hub.db"
    _store_with_messages(db)
    dest = tmp_path / "saved" / "copy.db"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(db), str(dest)], timeout=60)
    assert killed.returncode == -9
    assert not dest.exists() and not dest.is_symlink(), "a killed backup left a file there"
    done = run("backup", str(dest), "--store", f"sqlite://{db}")
    assert done.returncode == 0, done.stderr
    with contextlib.closing(sqlite3.connect(dest)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 20
