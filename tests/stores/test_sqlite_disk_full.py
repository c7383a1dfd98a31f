"""A full disk under the SQLite store: a send that cannot be stored is refused with an
error that says so and what to do, nothing accepted is lost, and the hub goes on by
itself once there is room again. The store is on a small tmpfs of its own, filled by a
file beside it (mounting needs root, as CI runs here)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from backchannel.errors import StoreError
from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * free)
        f.write(b"\0" * 65536)  # whatever the count missed
    return filler


async def test_a_full_disk_refuses_sends_clearly_loses_nothing_and_recovers(
    small_disk: Path,
) -> None:
    async with Hub(SqliteStore(small_disk / "hub.db")) as hub:
        await hub.create_team("t")
        for name in ("a", "b"):
            await hub.add_member("t", name)
        for i in range(10):
            await hub.send("t", "a", "b", f"before {i}")
        filler = _fill(small_disk)
        errors: list[str] = []
        for i in range(20):  # the log may still hold a few pages: until it is full
            try:
                await hub.send("t", "a", "b", f"full {i} " + "x" * 4000)
            except StoreError as exc:
                errors.append(exc.message)
        refused = len(errors)
        assert refused > 0
        for message in errors:
            assert "the disk holding it is full: free space there" in message
            assert "nothing was stored" in message and "retry shortly" not in message
        filler.unlink()
        await hub.send("t", "a", "b", "after")
        got = [g.message.text for g in await hub.receive("t", "b", limit=100)]
    accepted = 20 - refused
    assert got[:10] == [f"before {i}" for i in range(10)]
    assert len(got) == 10 + accepted + 1 and got[-1] == "after"
