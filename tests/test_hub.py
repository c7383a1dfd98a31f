"""The Hub over the in-memory store, on a fake clock: the messaging lifecycle."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backchannel.errors import (
    AlreadyExists,
    InvalidName,
    InvalidRequest,
    MessageIdConflict,
    TooLarge,
    UnknownMessage,
    UnknownRecipient,
    UnknownTeam,
)
from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock
from backchannel.types import DeliveryState, MemberKind, MessageKind


async def _team(hub: Hub, *members: str, team: str = "alpha") -> None:
    await hub.create_team(team)
    for m in members:
        await hub.add_member(team, m)


async def test_team_has_user_member_and_tokens_authenticate(hub: Hub) -> None:
    _team_obj, user_token = await hub.create_team("alpha")
    member, token = await hub.add_member("alpha", "worker-1", MemberKind.CLAUDE_CODE)
    names = {m.name: m.kind for m in await hub.list_members("alpha")}
    assert names == {"user": MemberKind.HUMAN, "worker-1": MemberKind.CLAUDE_CODE}
    me = await hub.authenticate(token)
    assert me is not None and (me.team, me.name) == ("alpha", "worker-1")
    user = await hub.authenticate(user_token)
    assert user is not None and user.name == "user"
    assert await hub.authenticate("bc_wrong") is None
    assert token not in repr(member)  # the hash is stored, never the token


async def test_duplicate_and_invalid_names_are_refused(hub: Hub) -> None:
    await _team(hub, "a")
    with pytest.raises(AlreadyExists, match="team 'alpha' already exists"):
        await hub.create_team("alpha")
    with pytest.raises(AlreadyExists, match="member 'a' already exists"):
        await hub.add_member("alpha", "a")
    with pytest.raises(InvalidName):
        await hub.create_team("bad name")
    with pytest.raises(InvalidName):
        await hub.add_member("alpha", "-x")
    with pytest.raises(UnknownTeam):
        await hub.add_member("nope", "x")
    with pytest.raises(InvalidRequest, match="unknown member kind 'robot'"):
        await hub.add_member("alpha", "r", "robot")
    with pytest.raises(InvalidRequest, match="reserved"):
        await hub.add_member("alpha", "hub")
    # framed "[From User]", such a member's text would pass for the human's
    for lookalike in ("User", "USER", "Hub", "hUB"):
        with pytest.raises(InvalidRequest, match="reads as the reserved"):
            await hub.add_member("alpha", lookalike)
    assert {m.name for m in await hub.list_members("alpha")} == {"a", "user"}


async def test_send_receive_ack_in_order(hub: Hub) -> None:
    await _team(hub, "a", "b")
    ids = [(await hub.send("alpha", "a", "b", f"m{i}")).message_id for i in range(5)]
    got = await hub.receive("alpha", "b", limit=3)
    assert [g.message.message_id for g in got] == ids[:3]
    assert [g.message.text for g in got] == ["m0", "m1", "m2"]
    assert all(g.attempt == 1 and g.message.sender == "a" for g in got)
    rest = await hub.receive("alpha", "b", limit=10)
    assert [g.message.message_id for g in rest] == ids[3:]
    result = await hub.ack("alpha", "b", ids)
    assert result.acked == tuple(ids)
    assert result.not_held == ()
    status = await hub.message_status("alpha", ids[0], viewer="a")
    assert status.state is DeliveryState.ACKED
    assert [h.event for h in status.history] == ["queued", "leased", "acked"]


async def test_idempotent_send_and_conflict(hub: Hub) -> None:
    await _team(hub, "a", "b")
    first = await hub.send("alpha", "a", "b", "hello", message_id="k-1")
    again = await hub.send("alpha", "a", "b", "hello", message_id="k-1")
    assert (again.message_id, again.replayed) == ("k-1", True)
    assert first.replayed is False
    with pytest.raises(MessageIdConflict, match="'k-1' was already used"):
        await hub.send("alpha", "a", "b", "other text", message_id="k-1")
    got = await hub.receive("alpha", "b", limit=10)
    assert [g.message.message_id for g in got] == ["k-1"], "a replay never queues a second copy"


async def test_unknown_recipient_is_refused_with_suggestions(hub: Hub) -> None:
    await _team(hub, "lead", "worker-1", "worker-2")
    with pytest.raises(UnknownRecipient) as exc:
        await hub.send("alpha", "lead", "wrker-1", "hi")
    assert exc.value.details["suggestions"][0] == "worker-1"
    assert exc.value.status == 404


async def test_too_large_text_is_refused_and_nothing_is_stored(clock: FakeClock) -> None:
    from backchannel.testing import MemoryStore

    async with Hub(MemoryStore(), clock=clock, background=False, max_text=100) as hub:
        await _team(hub, "a", "b")
        with pytest.raises(TooLarge):
            await hub.send("alpha", "a", "b", "x" * 101, message_id="big")
        with pytest.raises(UnknownMessage):
            await hub.message_status("alpha", "big")


async def test_broadcast_copies_are_tracked_and_acked_separately(hub: Hub) -> None:
    await _team(hub, "a", "b", "c")
    result = await hub.send("alpha", "a", "*", "all hands")
    assert sorted(r.member for r in result.recipients) == ["b", "c", "user"]
    assert await hub.receive("alpha", "a") == []  # never to the sender
    got_b = await hub.receive("alpha", "b")
    await hub.ack("alpha", "b", [got_b[0].message.message_id])
    status = await hub.message_status("alpha", result.message_id)
    states = {d.recipient.member: d.state for d in status.deliveries}
    assert states == {
        "b": DeliveryState.ACKED,
        "c": DeliveryState.QUEUED,
        "user": DeliveryState.QUEUED,
    }
    assert status.state is DeliveryState.QUEUED


async def test_ack_reports_ids_not_held(hub: Hub) -> None:
    await _team(hub, "a", "b", "c")
    r = await hub.send("alpha", "a", "b", "hi")
    await hub.receive("alpha", "b")
    result = await hub.ack("alpha", "c", [r.message_id, "nope"])
    assert result.acked == ()
    assert result.not_held == (r.message_id, "nope")
    with pytest.raises(InvalidRequest, match="message_ids is empty"):
        await hub.ack("alpha", "b", [])


async def test_an_ack_after_its_lease_ran_out_spares_the_model_a_second_copy(
    hub: Hub, clock: FakeClock
) -> None:
    """The receiver worked past its lease: the copy was queued again, and its ack came
    before anyone was handed it anew. The ack is taken; nobody is handed it again."""
    await _team(hub, "a", "b")
    r = await hub.send("alpha", "a", "b", "a long job")
    assert [g.message.message_id for g in await hub.receive("alpha", "b")] == [r.message_id]
    clock.advance(30)  # the hub fixture's lease
    await hub.maintain()
    result = await hub.ack("alpha", "b", [r.message_id])
    assert (result.acked, result.not_held) == ((r.message_id,), ())
    assert await hub.receive("alpha", "b") == []
    status = await hub.message_status("alpha", r.message_id)
    assert status.state is DeliveryState.ACKED
    assert [h.event for h in status.history] == ["queued", "leased", "lease_expired", "acked"]


async def test_lease_expiry_redelivers_then_dead_letters_and_tells_sender(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub, "a", "b")
    r = await hub.send("alpha", "a", "b", "please handle", summary="job")
    for attempt in (1, 2, 3):  # the hub fixture allows 3 attempts, 30 s leases
        got = await hub.receive("alpha", "b")
        assert [(g.message.message_id, g.attempt) for g in got] == [(r.message_id, attempt)]
        assert await hub.receive("alpha", "b") == []  # leased: not handed out twice
        clock.advance(29)
        await hub.maintain()
        assert await hub.receive("alpha", "b") == []  # lease not over yet
        clock.advance(1)
        await hub.maintain()
    status = await hub.message_status("alpha", r.message_id)
    assert status.state is DeliveryState.DEAD
    assert status.deliveries[0].dead_reason == "not acknowledged after 3 delivery attempts"
    events = [h.event for h in status.history]
    assert events == [
        "queued",
        "leased",
        "lease_expired",
        "leased",
        "lease_expired",
        "leased",
        "dead",
    ]
    assert await hub.receive("alpha", "b") == []
    notices = await hub.receive("alpha", "a")
    assert len(notices) == 1
    notice = notices[0].message
    assert notice.kind is MessageKind.SYSTEM
    assert notice.sender == "hub"
    assert f"Your message {r.message_id} to b was not delivered" in notice.text
    assert notice.meta["dead_message_id"] == r.message_id


async def test_every_dead_copy_of_a_long_id_tells_the_sender(hub: Hub, clock: FakeClock) -> None:
    """A notice id made from a message id of the longest kind is not cut short into the
    same id for every copy: the sender hears of each dead copy."""
    await _team(hub, "a", "b", "c")
    mid = "m" * 128
    await hub.send("alpha", "a", "*", "for all", message_id=mid)
    for _ in range(3):
        for member in ("b", "c", "user"):
            await hub.receive("alpha", member)
        clock.advance(30)
        await hub.maintain()
    told = await hub.receive("alpha", "a", limit=10)
    assert sorted(m.message.meta["recipient"] for m in told) == ["b", "c", "user"]
    assert all(len(m.message.message_id) <= 128 for m in told)


async def test_dead_system_message_never_produces_another_notice(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub, "a", "b")
    await hub.send("alpha", "a", "b", "x")
    for _ in range(3):
        await hub.receive("alpha", "b")
        clock.advance(30)
        await hub.maintain()
    for _ in range(3):  # a never acks the notice either
        assert len(await hub.receive("alpha", "a")) == 1
        clock.advance(30)
        await hub.maintain()
    assert await hub.receive("alpha", "a") == []
    assert await hub.receive("alpha", "b") == []


async def test_release_gives_a_lease_back_at_once(hub: Hub) -> None:
    await _team(hub, "a", "b")
    r = await hub.send("alpha", "a", "b", "x")
    await hub.receive("alpha", "b")
    assert await hub.release("alpha", "b", [r.message_id]) == 1
    again = await hub.receive("alpha", "b")
    assert again[0].attempt == 2


async def test_waiting_receiver_is_woken_by_the_commit(hub: Hub) -> None:
    await _team(hub, "a", "b")
    waiting = asyncio.create_task(hub.receive("alpha", "b", wait=60))
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    r = await hub.send("alpha", "a", "b", "wake up")
    got = await asyncio.wait_for(waiting, 5)  # far below the 60 s wait: pushed, not polled
    assert [g.message.message_id for g in got] == [r.message_id]


async def test_message_status_is_private_to_sender_and_recipients(hub: Hub) -> None:
    await _team(hub, "a", "b", "c")
    r = await hub.send("alpha", "a", "b", "secret")
    assert (await hub.message_status("alpha", r.message_id, viewer="a")).message.text == "secret"
    assert (await hub.message_status("alpha", r.message_id, viewer="b")).message.text == "secret"
    with pytest.raises(UnknownMessage):
        await hub.message_status("alpha", r.message_id, viewer="c")


async def test_teams_are_isolated(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _team(hub, "x", team="beta")
    with pytest.raises(UnknownRecipient):
        await hub.send("alpha", "a", "x", "cross-team")
    r = await hub.send("beta", "x", "user", "hi")
    with pytest.raises(UnknownMessage):
        await hub.message_status("alpha", r.message_id)


async def test_session_pinned_delivery_waits_while_turn_runs(hub: Hub) -> None:
    await _team(hub, "a", "b")
    s = await hub.open_session("alpha", "b", "b-main")
    assert (await hub.open_session("alpha", "b", "b-main")).created_at == s.created_at
    r = await hub.send("alpha", "a", "b", "for the session", to_session="b-main")
    assert await hub.receive("alpha", "b") == []  # not member-wide
    got = await hub.receive("alpha", "b", session="b-main")
    assert [g.message.message_id for g in got] == [r.message_id]


async def test_team_feed_records_traffic(hub: Hub) -> None:
    await _team(hub, "a", "b")
    r = await hub.send("alpha", "a", "b", "line one\nline two")
    await hub.receive("alpha", "b")
    await hub.ack("alpha", "b", [r.message_id])
    feed = await hub.feed("alpha")
    assert [(f.event.event, f.event.member) for f in feed] == [
        ("queued", "b"),
        ("leased", "b"),
        ("acked", "b"),
    ]
    assert feed[0].to_json()["summary"] == "line one"
    later = await hub.feed("alpha", after=feed[1].cursor)
    assert [f.event.event for f in later] == ["acked"]


async def test_an_adapter_gives_up_on_a_copy(hub: Hub) -> None:
    await _team(hub, "a", "b")
    r = await hub.send("alpha", "a", "b", "to a dead webhook")
    assert (
        await hub.give_up("alpha", "b", r.message_id, "webhook answered 404") is False
    )  # not leased
    await hub.receive("alpha", "b")
    assert await hub.give_up("alpha", "b", r.message_id, "webhook answered 404") is True
    status = await hub.message_status("alpha", r.message_id)
    assert (status.state, status.deliveries[0].dead_reason) == (
        DeliveryState.DEAD,
        "webhook answered 404",
    )
    [notice] = await hub.receive("alpha", "a")
    assert "webhook answered 404" in notice.message.text


@pytest.mark.parametrize(
    ("what", "value", "field"),
    [
        ("lease_seconds", float("nan"), "lease_seconds"),
        ("lease_seconds", 1e300, "lease_seconds"),
        ("lease_seconds", True, "lease_seconds"),
        ("wait", float("nan"), "wait"),
        ("wait", True, "wait"),
        ("limit", 1.5, "limit"),
        ("limit", True, "limit"),
    ],
)
async def test_a_receive_given_no_number_of_its_range_is_refused_naming_it(
    tmp_path: Path, clock: FakeClock, what: str, value: object, field: str
) -> None:
    # on SQLite a NaN lease was stored as no lease end: the message was leased to the
    # caller for ever, never handed out again and never a dead letter; a NaN wait waited
    # for ever; a limit of 1.5 failed as "duplicate key"
    async with Hub(SqliteStore(tmp_path / "hub.db"), clock=clock, background=False) as hub:
        await _team(hub, "a", "b")
        await hub.send("alpha", "a", "b", "hello")
        with pytest.raises(InvalidRequest) as exc:
            await asyncio.wait_for(hub.receive("alpha", "b", **{what: value}), 10)
        assert exc.value.details.get("field") == field
        with pytest.raises(InvalidRequest):
            await asyncio.wait_for(hub.receive("alpha", "b", ack=[], **{what: value}), 10)
        assert [m.message.text for m in await hub.receive("alpha", "b")] == ["hello"]
