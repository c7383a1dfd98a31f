"""Files push delivery writes, on a full disk (ENOSPC). A Claude Code team inbox whose
write fails is left as it was (never an empty or cut file Claude Code cannot read), with
no temporary file; the message stays queued, is tried again, and is written once when
there is room. A ``stdin`` agent's output file that cannot be written does not stop its
lines being read. The disk is a small tmpfs of the test's own (:mod:`tests.full_disk`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backchannel.callbacks import RetryPolicy
from backchannel.delivery.claude_inbox import InboxWriteError, InboxWriter, read_inbox
from backchannel.delivery.stdin import StdinAgent
from backchannel.testing import eventually
from tests.delivery.conftest_adapters import dispatching, running_hub, wait_state
from tests.full_disk import fill, fill_inodes, small_disk

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    with small_disk(request, tmp_path, "1m") as mount:
        yield mount


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_write_on_a_full_disk_leaves_every_inbox_whole_and_nothing_else(disk: Path) -> None:
    writer = InboxWriter(disk / "teams")
    writer.append("cc", "old", msg_id="m-1", from_="lead", text="first")
    old = (disk / "teams" / "cc" / "inboxes" / "old.json").read_bytes()
    filler = fill(disk)
    for member, msg_id in (("old", "m-2"), ("new", "n-1")):
        with pytest.raises(InboxWriteError, match="no space left on the disk holding"):
            writer.append("cc", member, msg_id=msg_id, from_="lead", text="x" * 50_000)
    # the new member's inbox is not there at all (an empty file is not JSON: Claude Code
    # cannot read it), the old one is byte for byte what it was, no temporary file
    assert _files(disk / "teams") == ["cc/inboxes/old.json"]
    assert (disk / "teams" / "cc" / "inboxes" / "old.json").read_bytes() == old
    filler.unlink()
    for member, msg_id in (("old", "m-2"), ("new", "n-1")):
        writer.append("cc", member, msg_id=msg_id, from_="lead", text="x" * 50_000)
    assert [e["msg_id"] for e in read_inbox(disk / "teams/cc/inboxes/old.json")] == ["m-1", "m-2"]
    assert [e["msg_id"] for e in read_inbox(disk / "teams/cc/inboxes/new.json")] == ["n-1"]


async def test_a_message_pushed_to_an_inbox_on_a_full_disk_waits_and_is_written_once(
    disk: Path,
) -> None:
    root = disk / "teams"
    setting = {"type": "inbox-file", "root": str(root), "team": "cc"}
    retry = RetryPolicy(start=0.05, factor=2.0, cap=0.3, budget=60.0, timeout=5.0)
    async with running_hub(retry=retry, max_attempts=1000) as hub:
        await hub.add_member("t", "researcher", "claude-code", delivery=setting)
        filler = fill(disk)
        async with dispatching(hub):
            sent = await hub.send("t", "user", "researcher", "look", message_id="m-1", link=False)

            async def tried_thrice() -> bool | None:
                st = await hub.message_status("t", sent.message_id)
                return st.deliveries[0].attempts >= 3 or None

            await eventually(tried_thrice, within=20, what="three tries")
            st = await hub.message_status("t", sent.message_id)
            assert st.state.value not in ("acked", "dead")
            inbox = root / "cc" / "inboxes" / "researcher.json"
            assert not inbox.exists() or json.loads(inbox.read_bytes()) == []
            filler.unlink()
            await wait_state(hub, "t", sent.message_id, "acked", within=20)
    assert [e["msg_id"] for e in read_inbox(inbox)] == ["m-1"]
    assert _files(root) == ["cc/inboxes/researcher.json"]


def test_a_lock_that_cannot_be_made_on_a_full_disk_fails_at_once_naming_it(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A full disk fails the lock's ``mkdir``: the append says so at once rather than
    trying to take the lock until its deadline (a worker thread held for 30 s a try)."""
    with small_disk(request, tmp_path, "1m", inodes=64) as disk:
        writer = InboxWriter(disk / "teams", deadline_s=30.0)
        writer.append("cc", "a", msg_id="m-1", from_="lead", text="first")
        inbox = disk / "teams" / "cc" / "inboxes" / "a.json"
        before = inbox.read_bytes()
        used = fill_inodes(disk)
        started = time.monotonic()
        with pytest.raises(InboxWriteError, match="no space left on the disk holding"):
            writer.append("cc", "a", msg_id="m-2", from_="lead", text="second")
        assert time.monotonic() - started < 10
        assert inbox.read_bytes() == before
        shutil.rmtree(used)
        writer.append("cc", "a", msg_id="m-2", from_="lead", text="second")
        assert [e["msg_id"] for e in read_inbox(inbox)] == ["m-1", "m-2"]


async def test_an_agent_whose_output_file_is_on_a_full_disk_is_still_read(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``stdin`` delivery keeps the agent's stdout in a file as it reads its lines: with
    that file's disk full, the lines are still read (and handed on) to the end, so the
    agent never blocks on a full pipe and its turns are still seen ending."""
    with small_disk(request, tmp_path, "1m") as disk:
        fill(disk)
        lines: list[bytes] = []

        async def on_line(line: bytes) -> None:
            lines.append(line)

        script = "import sys\nfor i in range(2000): print(i, 'x' * 1000)\nprint('done')"
        agent = StdinAgent(
            [sys.executable, "-c", script], stdout=disk / "agent.log", on_line=on_line
        )
        await agent.start()
        assert await asyncio.wait_for(agent.wait(), 30) == 0
        await eventually(
            lambda: (lines and lines[-1] == b"done\n") or None, within=30, what="the last line"
        )
        assert len(lines) == 2001
