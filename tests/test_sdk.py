"""The Python SDK: the same calls in-process and over HTTP, and the sync facade."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import backchannel
from backchannel import connect, connect_sync
from backchannel.errors import Forbidden, MessageIdConflict, Unauthorized, UnknownRecipient
from tests.conftest import Server


async def _exercise(admin_url: str, admin_token: str | None, member_url: str) -> None:
    async with connect(admin_url, admin_token) as admin:
        team = await admin.create_team("sdk")
        a = (await admin.add_member("sdk", "a"))["token"]
        b = (await admin.add_member("sdk", "b"))["token"]
        assert team["user_token"].startswith("bc_")
    async with connect(member_url, a) as ca, connect(member_url, b) as cb:
        sent = await ca.send("b", "hello", summary="greeting", message_id="sdk-1")
        assert sent["message_id"] == "sdk-1"
        replay = await ca.send("b", "hello", summary="greeting", message_id="sdk-1")
        assert replay["message_id"] == "sdk-1"
        with pytest.raises(MessageIdConflict):
            await ca.send("b", "changed", message_id="sdk-1")
        with pytest.raises(UnknownRecipient) as exc:
            await ca.send("bb", "x")
        assert exc.value.details["suggestions"] == ["b"]
        stream = cb.inbox(wait=5)
        msg = await asyncio.wait_for(anext(stream), 10)
        assert (msg.message_id, msg.sender, msg.text, msg.summary) == (
            "sdk-1",
            "a",
            "hello",
            "greeting",
        )
        await msg.ack()
        status = await ca.status("sdk-1")
        assert status["status"] == "acked"
        waiter = asyncio.create_task(cb.receive(wait=30))
        await asyncio.sleep(0.05)
        await ca.send("b", "second")
        got = await asyncio.wait_for(waiter, 10)
        assert [m.text for m in got] == ["second"]
        names = [m["name"] for m in await ca.members()]
        assert names == ["a", "b", "user"]
        with pytest.raises(Forbidden):
            await ca.create_team("nope")


async def test_in_process_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'x.db'}"
    await _exercise(url, None, url)


async def test_over_http(server: Server) -> None:
    await _exercise(server.url, server.admin_token, server.url)


async def test_bad_token_in_process(tmp_path: Path) -> None:
    with pytest.raises(Unauthorized):
        async with connect(f"sqlite://{tmp_path / 'x.db'}", "bc_nope"):
            pass


def test_sync_facade(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 's.db'}"
    with connect_sync(url) as admin:
        admin.create_team("s")
        a = admin.add_member("s", "a")["token"]
        b = admin.add_member("s", "b")["token"]
    with connect_sync(url, a) as ca, connect_sync(url, b) as cb:
        mid = ca.send("b", "sync hello")["message_id"]
        got = cb.receive(wait=5)
        assert [m.text for m in got] == ["sync hello"]
        assert cb.ack([mid]).acked == 1
        # a message a SyncClient hands out acks itself without await
        ca.send("b", "second", message_id="m-2")
        [second] = cb.receive(wait=5)
        second.ack()
        assert cb.pending() == 0
        assert [c.state for c in cb.status("m-2").deliveries] == ["acked"]


def test_public_api_is_exactly_all() -> None:
    import types

    public = {
        name
        for name in dir(backchannel)
        if not name.startswith("_") and not isinstance(getattr(backchannel, name), types.ModuleType)
    }
    assert public == set(backchannel.__all__) - {"__version__"}
    for name in backchannel.__all__:
        assert getattr(backchannel, name) is not None
