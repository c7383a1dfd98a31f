"""Token rotation, member and team removal, and per-member quotas, on the hub."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from backchannel import Hub
from backchannel.errors import (
    InvalidRequest,
    QuotaExceeded,
    UnknownMember,
    UnknownRecipient,
    UnknownTeam,
)
from backchannel.stores.base import Store
from backchannel.testing import FakeClock
from backchannel.types import DeliveryState, LinkState, MessageKind


async def _team(hub: Hub, *members: str, **settings: object) -> dict[str, str]:
    _, user = await hub.create_team("t", settings={"anchor_policy": "off", **settings})
    tokens = {"user": user}
    for m in members:
        tokens[m] = (await hub.add_member("t", m))[1]
    return tokens


@pytest.fixture
async def any_hub(make_store: Callable[[], Store]) -> AsyncIterator[Hub]:
    """A hub on each store: memory, SQLite and PostgreSQL."""
    async with Hub(make_store(), clock=FakeClock(), background=False) as h:
        yield h


async def test_rotation_retires_the_old_token_at_once(any_hub: Hub) -> None:
    hub = any_hub
    tokens = await _team(hub, "a")
    assert (await hub.authenticate(tokens["a"])) is not None  # now cached
    new = await hub.rotate_token("t", "a")
    assert new != tokens["a"]
    assert await hub.authenticate(tokens["a"]) is None
    me = await hub.authenticate(new)
    assert me is not None and me.name == "a"
    stored = await hub.get_member("t", "a")
    assert new not in stored.token_hash and len(stored.token_hash) == 64  # only its hash
    with pytest.raises(UnknownMember, match="unknown member 'zed'"):
        await hub.rotate_token("t", "zed")
    with pytest.raises(UnknownTeam):
        await hub.rotate_token("nope", "a")


async def test_removal_settles_everything_the_member_had(any_hub: Hub) -> None:
    hub = any_hub
    tokens = await _team(hub, "a", "b", "c")
    await hub.open_session("t", "b", "b-1")
    await hub.set_timer("t", "b", "b-1", "anchor", 600, "keep going")
    for m in ("a", "c"):  # sends from inside a turn open links
        await hub.open_session("t", m, f"{m}-1")
        await hub.report_event("t", m, f"{m}-1", "turn_start", "work")
    await hub.send("t", "a", "b", "for b, never read", message_id="m-to-b")
    await hub.send("t", "c", "b", "also for b", message_id="m2-to-b")
    await hub.send("t", "b", "c", "from b, still queued", message_id="m-from-b")
    link = (await hub.list_links("t", member="a"))[0]
    assert link.state is LinkState.OPEN

    removal = await hub.remove_member("t", "b", reason="token leaked")
    assert (removal.sessions_terminated, removal.jobs_cancelled) == (1, 1)
    assert removal.dead_letters >= 2  # the two sends, and the hub's own notices to b
    assert removal.links_closed >= 2  # a<->b and c<->b

    assert await hub.authenticate(tokens["b"]) is None
    status = await hub.message_status("t", "m-to-b")
    assert status.state is DeliveryState.DEAD
    assert "recipient 'b' was removed from team 't' (token leaked)" in (
        status.deliveries[0].dead_reason or ""
    )
    # the senders are told; the peer hears its link closed; b's own send still arrives
    for m in ("a", "c"):
        await hub.report_event("t", m, f"{m}-1", "agent_stop", "")
    got_a = await hub.receive("t", "a", limit=50)
    got_a += await hub.receive("t", "a", session="a-1", limit=50)
    texts_a = [g.message.text for g in got_a if g.message.kind is MessageKind.SYSTEM]
    assert any("m-to-b" in t and "no longer a member" in t for t in texts_a), texts_a
    assert any("b was removed from the team" in t for t in texts_a), texts_a
    got_c = await hub.receive("t", "c", limit=50)
    assert "from b, still queued" in [g.message.text for g in got_c]
    assert any("also for b" in g.message.text or "m2-to-b" in g.message.text for g in got_c)
    assert all(lk.state is LinkState.CLOSED for lk in await hub.list_links("t", member="b"))
    assert await hub.list_timers("t", member="b") == []
    with pytest.raises(UnknownRecipient):
        await hub.send("t", "a", "b", "anyone there?")
    with pytest.raises(InvalidRequest, match="every team keeps its 'user'"):
        await hub.remove_member("t", "user")
    with pytest.raises(UnknownMember):
        await hub.remove_member("t", "b")


async def test_team_removal_deletes_it_and_says_what_went(any_hub: Hub) -> None:
    hub = any_hub
    tokens = await _team(hub, "a", "b")
    await hub.send("t", "a", "b", "pending")
    removal = await hub.remove_team("t")
    assert removal.dropped == 1
    assert await hub.authenticate(tokens["a"]) is None
    assert await hub.authenticate(tokens["user"]) is None
    with pytest.raises(UnknownTeam):
        await hub.get_team("t")
    with pytest.raises(UnknownTeam):
        await hub.remove_team("t")
    await _team(hub, "a")  # the name is free again


async def test_queued_messages_quota(any_hub: Hub) -> None:
    hub = any_hub
    await _team(hub, "a", "b", "c", max_queued=5)
    for i in range(5):
        await hub.send("t", "a", "b", f"m{i}", link=False)
    with pytest.raises(QuotaExceeded) as exc:
        await hub.send("t", "c", "b", "one too many", link=False)
    err = exc.value
    assert err.status == 429 and err.code == "quota_exceeded"
    assert (err.details["limit"], err.details["count"], err.details["setting"]) == (
        5,
        5,
        "max_queued",
    )
    assert "acked" in err.message and "'max_queued'" in err.message
    # the way out: the recipient takes its messages, or the member's limit is raised
    got = await hub.receive("t", "b", limit=2)
    await hub.send("t", "c", "b", "fits now", link=False)
    await hub.ack("t", "b", [g.message.message_id for g in got])
    await hub.send("t", "c", "b", "fits too", link=False)
    with pytest.raises(QuotaExceeded):
        await hub.send("t", "c", "b", "full again", link=False)
    await hub.update_member("t", "b", settings={"max_queued": 50})
    await hub.send("t", "c", "b", "raised", link=False)
    await hub.update_member("t", "b", settings={"max_queued": 1})
    with pytest.raises(QuotaExceeded):  # a broadcast is refused when any inbox is full
        await hub.send("t", "a", "*", "to all", link=False)


async def test_pending_timers_quota(hub: Hub) -> None:
    await _team(hub, "a", "b", max_timers=3)
    await hub.open_session("t", "a", "a-1")
    await hub.open_session("t", "b", "b-1")
    timers = [await hub.set_timer("t", "a", "a-1", "anchor", 60 + i, f"n{i}") for i in range(3)]
    with pytest.raises(QuotaExceeded, match="already has 3 pending timers") as exc:
        await hub.set_timer("t", "a", "a-1", "anchor", 90, "one more")
    assert "cancel_timer" in exc.value.message and exc.value.details["setting"] == "max_timers"
    await hub.set_timer("t", "b", "b-1", "anchor", 60, "b's own quota")
    await hub.cancel_timer("t", "a", timers[0].timer_id)
    await hub.set_timer("t", "a", "a-1", "anchor", 90, "fits after a cancel")


async def test_closing_blocks_respect_the_inbox_quota(hub: Hub) -> None:
    await _team(hub, "a", "b", max_queued=1)
    await hub.send("t", "user", "b", "fills b's inbox", link=False)
    await hub.open_session("t", "a", "a-1")
    await hub.report_event("t", "a", "a-1", "turn_start", "go")
    stop = await hub.report_event(
        "t", "a", "a-1", "agent_stop", 'done <message to="b">one more for b</message>'
    )
    assert stop["sent"] == [] and stop["state"] == "idle"
    got = await hub.receive("t", "a", session="a-1", limit=10)
    [notice] = [g.message.text for g in got if g.message.kind is MessageKind.SYSTEM]
    assert "block was not delivered" in notice and "'max_queued'" in notice
    assert [g.message.text for g in await hub.receive("t", "b", limit=10)] == ["fills b's inbox"]


async def test_delegated_tasks_respect_the_inbox_quota(hub: Hub) -> None:
    await _team(hub, "a", "b", max_queued=1)
    await hub.send("t", "user", "b", "fills b's inbox", link=False)
    await hub.open_session("t", "a", "a-1")
    await hub.report_event("t", "a", "a-1", "turn_start", "go")
    with pytest.raises(QuotaExceeded, match="'b' has 1 messages waiting"):
        await hub.delegate("t", "a", "a-1", "b", "count the files", tool_use_id="tu1")


async def test_a_client_in_this_process_loses_a_rotated_token(hub: Hub) -> None:
    from backchannel.client import attach
    from backchannel.errors import Unauthorized

    tokens = await _team(hub, "a", "b")
    client = attach(hub, tokens["a"])
    await client.start()
    await client.send("b", "before")
    await hub.rotate_token("t", "a")
    with pytest.raises(Unauthorized, match="rotated or its member removed"):
        await client.send("b", "after")
    other = attach(hub, tokens["b"])
    await other.start()
    await hub.remove_member("t", "b")
    with pytest.raises(Unauthorized):
        await other.receive()


async def test_a_client_in_this_process_loses_a_token_rotated_by_another_process(
    tmp_path: Path,
) -> None:
    """Two hubs on one SQLite file, as two processes are: a client attached in-process to
    the second authenticated once; the first rotates its token. Once the second hears of
    the change, the client's next call is refused, and stays refused however many other
    tokens are rotated after; a client whose token was not rotated goes on, looking its
    member up once a change, not once a call."""
    from backchannel.client import attach
    from backchannel.errors import Unauthorized
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import eventually

    async with (
        Hub(SqliteStore(tmp_path / "shared.db"), background=False) as one,
        Hub(SqliteStore(tmp_path / "shared.db"), background=False) as two,
    ):
        tokens = await _team(one, "a", "b", "c")
        client, kept = attach(two, tokens["a"]), attach(two, tokens["c"])
        await client.start()
        await kept.start()
        await client.send("b", "before")
        await one.rotate_token("t", "a")

        async def refused() -> bool:
            try:
                await client.send("b", "after")
            except Unauthorized as exc:
                return "rotated or its member removed" in str(exc)
            return False

        await eventually(refused, what="the second hub to hear of the rotation")
        for _ in range(3):
            await one.rotate_token("t", "b")
            two.admin.on_external_change(None, None)  # heard at once, not in time
            with pytest.raises(Unauthorized):
                await client.send("c", "still after")
            await kept.send("b", "kept")
        lookups: list[str] = []
        real = two.members.member_of_token

        async def counted(digest: str) -> object:
            lookups.append(digest)
            return await real(digest)

        two.members.member_of_token = counted  # type: ignore[method-assign]
        moved = two.members.token_generation
        for _ in range(20):
            await kept.send("b", "a lookup only after a change")
        # changes heard late, if any; one more if heard while the last lookup ran
        moved = two.members.token_generation - moved
        assert len(lookups) <= moved + 1 and moved < 10, (lookups, moved)
        texts = [g.message.text for g in await one.receive("t", "b", limit=20)]
        assert "after" not in texts and "still after" not in texts and texts.count("kept") == 3


@pytest.mark.parametrize("how", ["rotate", "remove member", "remove team"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_revocation_by_another_hub_on_the_store_wakes_the_requests_that_wait(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, how: str
) -> None:
    # two hubs on one store, as two processes are: the one whose requests wait with a
    # token hears that the other changed the store (SQLite: that something was committed;
    # PostgreSQL: the team's credentials, with the fallback timer made too slow to help),
    # and looks the token up again
    import asyncio

    from backchannel.stores.postgres import PostgresStore
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import eventually

    def store() -> Store:
        if kind == "sqlite":
            return SqliteStore(tmp_path / "shared.db")
        return PostgresStore(url, fallback_interval=3600)

    url = request.getfixturevalue("new_postgres_url")() if kind == "postgres" else ""
    async with (
        Hub(store(), background=False) as one,
        Hub(store(), background=False) as two,
    ):
        await one.create_team("crew")
        worker, _ = await one.add_member("crew", "worker")
        kept, _ = await one.add_member("crew", "kept")
        gone, other = asyncio.Event(), asyncio.Event()
        with (
            two.watch_revocation(worker.token_hash, gone, "crew"),
            two.watch_revocation(kept.token_hash, other, "crew"),
        ):
            await {
                "rotate": lambda: one.rotate_token("crew", "worker"),
                "remove member": lambda: one.remove_member("crew", "worker"),
                "remove team": lambda: one.remove_team("crew"),
            }[how]()
            await eventually(gone.is_set, what="the other hub to see the revocation")
            assert other.is_set() == (how == "remove team")
            assert await two.members.member_of_token(worker.token_hash) is None


async def test_a_token_rotated_by_another_hub_on_one_sqlite_file_is_refused_once_heard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that does not wait authenticates through the process's token cache. Two
    hubs on one SQLite file, as two processes are: once the second hears that the first
    committed (SQLite says no more than that), it forgets its cached tokens, so the old
    token is refused there too. The clock here never moves, so the cache's own expiry
    never helps. With nothing changed, a cached token is answered with no store read; a
    read under way when the change is heard caches nothing."""
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import eventually

    clock = FakeClock()
    async with (
        Hub(SqliteStore(tmp_path / "shared.db"), clock=clock, background=False) as one,
        Hub(SqliteStore(tmp_path / "shared.db"), clock=clock, background=False) as two,
    ):
        await one.create_team("crew")
        _, old = await one.add_member("crew", "worker")
        assert (await two.authenticate(old)) is not None  # now cached in two
        new = await one.rotate_token("crew", "worker")

        async def refused() -> bool:
            return await two.authenticate(old) is None

        await eventually(refused, what="the other hub to refuse the rotated token")

        reads: list[object] = []
        real = two.store.read

        def counted(fn: Callable[..., object]) -> object:
            reads.append(fn)
            return real(fn)  # type: ignore[arg-type]

        monkeypatch.setattr(two.store, "read", counted)

        async def cached() -> bool:
            n = len(reads)
            assert (await two.authenticate(new)) is not None
            return len(reads) == n

        await eventually(cached, what="the new token answered from the cache")

        # a change heard while a read is under way: its answer is not cached
        async def heard_midway(fn: Callable[..., object]) -> object:
            reads.append(fn)
            got = await real(fn)  # type: ignore[arg-type]
            two.admin.on_external_change(None, None)
            return got

        two.members.forget_tokens()
        monkeypatch.setattr(two.store, "read", heard_midway)
        assert (await two.authenticate(new)) is not None
        monkeypatch.setattr(two.store, "read", counted)
        n = len(reads)
        assert (await two.authenticate(new)) is not None
        assert len(reads) == n + 1, "an answer read before the change was heard was cached"
