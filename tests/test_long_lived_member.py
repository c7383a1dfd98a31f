"""A member that ran for months opened a session at every ``/clear``, ``/new`` and
restart: what its runtime does every few seconds (the MCP server's beat), at each start
(``SessionStart``) and a timer set without a session reads its live sessions, not
every one it ever had. Counted in records the store hands out, not timed."""

from __future__ import annotations

import pytest

from backchannel.hub import Hub
from backchannel.runtimes.common import RUNTIME_FIELD
from backchannel.runtimes.receiver import handle_hook
from backchannel.stores.base import Store, Tx
from backchannel.stores.memory import MemoryStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, counting_rows
from backchannel.types import Session, SessionState

ENDED = 400
KEY = "proc:4242:1700000000"


async def _long_lived(hub: Hub) -> None:
    await hub.create_team("t")
    await hub.add_member("t", "a")

    def history(tx: Tx) -> None:
        for i in range(ENDED):
            at = float(i)
            tx.put_session(Session("t", f"old-{i}", "a", SessionState.TERMINATED, at, at))

    await hub.store.transact(history)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Store:
    if request.param == "memory":
        return MemoryStore()
    return SqliteStore(f"{tmp_path}/hub.db")


async def test_a_start_a_beat_and_a_timer_read_the_live_sessions(store: Store) -> None:
    async with Hub(store, clock=FakeClock(), background=False) as hub:
        await _long_lived(hub)
        member = await hub.get_member("t", "a")
        start = {
            "hook_event_name": "SessionStart",
            "session_id": "now",
            "source": "startup",
            "cwd": "/w",
            "transcript_path": "/w/t.jsonl",
            RUNTIME_FIELD: KEY,
        }
        with counting_rows(hub.store) as read:
            await handle_hook(hub, member, "claude-code", start)
        assert read["Session"] < ENDED // 4, read
        with counting_rows(hub.store) as read:
            vouched, _ = await hub.runtime_alive("t", "a", KEY)
        assert read["Session"] < ENDED // 4, read
        assert vouched == ["now"]
        with counting_rows(hub.store) as read:
            timer = await hub.set_timer("t", "a", None, "anchor", 60, "back to task 3")
        assert read["Session"] < ENDED // 4, read
        assert timer.session == "now"
