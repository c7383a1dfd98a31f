"""The store conformance suite: every guarantee of the :mod:`backchannel.stores.base`
contract, run against a store factory. Each check is also in :data:`STORE_CHECKS`, so a
test suite can parametrize over them and see one result per guarantee::

    @pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__)
    async def test_store_contract(make_store, check):
        await check(make_store)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from backchannel._dispatch_checks import check_dispatch_ownership, check_requeue_leased
from backchannel.errors import AlreadyExists
from backchannel.stores.base import Reads, SessionFilter, Tx
from backchannel.testing._fixtures import T0, StoreFactory, make_msg, opened, seed_team
from backchannel.testing.store_records import (
    check_a2a_claims,
    check_a2a_tasks,
    check_budgets_and_chains,
    check_compaction,
    check_credentials_and_removal,
    check_delegations_and_tokens,
    check_inbox_cursor,
    check_links,
)
from backchannel.types import (
    Budget,
    DeliveryEvent,
    DeliveryState,
    EventKind,
    Job,
    JobState,
    Lease,
    LedgerEntry,
    Link,
    Member,
    MemberKind,
    Recipient,
    Session,
    SessionEvent,
    SessionState,
    Team,
)

__all__ = ["STORE_CHECKS", "StoreFactory", "check_store"]


async def check_teams_and_members(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        team = await store.read(lambda tx: tx.get_team("alpha"))
        assert team is not None and team.name == "alpha" and dict(team.settings) == {"k": 1}
        assert await store.read(lambda tx: tx.get_team("nope")) is None
        try:
            await store.transact(lambda tx: tx.insert_team(Team("alpha", T0)))
        except AlreadyExists:
            pass
        else:
            raise AssertionError("a duplicate team must raise AlreadyExists")
        try:
            await store.transact(
                lambda tx: tx.insert_member(Member("alpha", "a", MemberKind.LLM, T0, "other"))
            )
        except AlreadyExists:
            pass
        else:
            raise AssertionError("a duplicate member must raise AlreadyExists")
        names = await store.read(lambda tx: [m.name for m in tx.list_members("alpha")])
        assert names == ["a", "b", "c", "user"], names

        def page(after: str | None, limit: int | None) -> Any:
            return store.read(
                lambda tx: [m.name for m in tx.list_members("alpha", after=after, limit=limit)]
            )

        # a page starts after the last name of the page before, one added between pages
        # is read in its place, and a name no member has (one removed) still marks it
        assert await page(None, 2) == ["a", "b"]
        await store.transact(
            lambda tx: tx.insert_member(Member("alpha", "bb", MemberKind.LLM, T0, "hash-bb"))
        )
        assert await page("b", 2) == ["bb", "c"]
        assert await page("ba", None) == ["bb", "c", "user"]
        assert await page("user", 2) == []
        assert await store.transact(lambda tx: tx.delete_member("alpha", "bb"))
        b = await store.read(lambda tx: tx.get_member("alpha", "b"))
        assert b is not None
        changed = Member(
            "alpha", "b", MemberKind.CODEX, T0 + 9, "other-hash", {"type": "tmux"}, {"x": 1}
        )
        await store.transact(lambda tx: tx.update_member(changed))
        after = await store.read(lambda tx: tx.get_member("alpha", "b"))
        assert after is not None
        assert (dict(after.delivery), dict(after.settings)) == ({"type": "tmux"}, {"x": 1})
        assert (after.kind, after.token_hash, after.created_at) == (
            b.kind,
            b.token_hash,
            b.created_at,
        )
        found = await store.read(lambda tx: tx.member_by_token_hash("hash-alpha-b"))
        assert found is not None and (found.team, found.name) == ("alpha", "b")
        assert await store.read(lambda tx: tx.member_by_token_hash("missing")) is None
        await store.transact(lambda tx: tx.insert_team(Team("beta", T0)))
        teams = await store.read(lambda tx: [t.name for t in tx.list_teams()])
        assert teams == ["alpha", "beta"]
        assert await store.read(lambda tx: tx.list_members("beta")) == []


async def check_sessions(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        s1 = Session("alpha", "s1", "a", SessionState.IDLE, T0, T0, meta={"x": 1})
        s2 = Session("alpha", "s2", "b", SessionState.ACTIVE, T0 + 1, T0 + 1, turn=3)
        await store.transact(lambda tx: (tx.put_session(s1), tx.put_session(s2)))
        got = await store.read(lambda tx: tx.get_session("alpha", "s2"))
        assert got == s2, got
        s1b = Session("alpha", "s1", "a", SessionState.TERMINATED, T0, T0 + 5, last_output="bye")
        await store.transact(lambda tx: tx.put_session(s1b))
        assert await store.read(lambda tx: tx.get_session("alpha", "s1")) == s1b
        every = await store.read(lambda tx: [s.session_id for s in tx.list_sessions("alpha")])
        assert every == ["s1", "s2"]
        only_b = await store.read(lambda tx: [s.session_id for s in tx.list_sessions("alpha", "b")])
        assert only_b == ["s2"]
        for i, state in enumerate([SessionState.IDLE, SessionState.ACTIVE, SessionState.IDLE]):
            extra = Session("alpha", f"a{i}", "a", state, T0 + 2 + i, T0 + 2 + i)
            await store.transact(lambda tx, extra=extra: tx.put_session(extra))

        def ids(member: str | None, which: SessionFilter, limit: int | None = None) -> Any:
            return store.read(
                lambda tx: [
                    s.session_id
                    for s in tx.list_sessions("alpha", member, which=which, limit=limit)
                ]
            )

        assert await ids("a", "all") == ["s1", "a0", "a1", "a2"]
        assert await ids("a", "live") == ["a0", "a1", "a2"], "terminated s1 is not live"
        assert await ids("a", "live", 2) == ["a0", "a1"]
        assert await ids("a", "active") == ["a1"]
        assert await ids(None, "active") == ["s2", "a1"]
        assert await ids("c", "live") == []

        def page(member: str | None, after: tuple[float, str] | None, limit: int) -> Any:
            return store.read(
                lambda tx: [
                    (s.created_at, s.session_id)
                    for s in tx.list_sessions("alpha", member, limit=limit, after=after)
                ]
            )

        # a page starts after the key of the page before: sessions sharing a created_at
        # are told apart by id, and one opened between pages is read in its place
        same = Session("alpha", "a1x", "a", SessionState.IDLE, T0 + 3, T0 + 3)
        await store.transact(lambda tx: tx.put_session(same))
        first = await page(None, None, 3)
        assert [k[1] for k in first] == ["s1", "s2", "a0"]
        between = Session("alpha", "a0z", "b", SessionState.IDLE, T0 + 2, T0 + 2)
        await store.transact(lambda tx: tx.put_session(between))
        second = await page(None, first[-1], 3)
        assert [k[1] for k in second] == ["a0z", "a1", "a1x"]
        assert [k[1] for k in await page(None, second[-1], 3)] == ["a2"]
        assert await page(None, (T0 + 4, "a2"), 3) == []
        assert [k[1] for k in await page("a", (T0 + 2, "a0"), 2)] == ["a1", "a1x"]
        # the dashboard's: each member's count, and its latest few newest first
        assert await store.read(lambda tx: tx.session_counts("alpha")) == {"a": 5, "b": 2}
        assert await store.read(lambda tx: tx.session_counts("beta")) == {}
        latest = await store.read(
            lambda tx: [s.session_id for s in tx.latest_sessions("alpha", "a", 3)]
        )
        assert latest == ["a2", "a1x", "a1"], "newest first, ties by id"
        assert await store.read(lambda tx: tx.latest_sessions("alpha", "c", 3)) == []


async def check_send_and_history(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        m = make_msg("m1", to="*")
        copies = await store.transact(
            lambda tx: tx.insert_message(m, [Recipient("b"), Recipient("c", "sess-c")])
        )
        assert [d.recipient for d in copies] == [Recipient("b"), Recipient("c", "sess-c")]
        assert copies[0].seq < copies[1].seq
        assert all(d.state is DeliveryState.QUEUED and d.attempts == 0 for d in copies)
        assert await store.read(lambda tx: tx.get_message("alpha", "m1")) == m
        try:
            await store.transact(lambda tx: tx.insert_message(make_msg("m1"), [Recipient("b")]))
        except AlreadyExists:
            pass
        else:
            raise AssertionError("a duplicate message_id must raise AlreadyExists")
        stored = await store.read(lambda tx: tx.deliveries("alpha", "m1"))
        assert [(d.recipient.member, d.state) for d in stored] == [
            ("b", DeliveryState.QUEUED),
            ("c", DeliveryState.QUEUED),
        ]
        hist = await store.read(lambda tx: tx.history("alpha", "m1"))
        assert [(e.member, e.event) for e in hist] == [("b", "queued"), ("c", "queued")]
        feed = await store.read(lambda tx: tx.feed("alpha", 0, 10))
        assert [e.event for _, e in feed] == ["queued", "queued"]
        assert feed[0][0] < feed[1][0]
        later = await store.read(lambda tx: tx.feed("alpha", feed[0][0], 10))
        assert [c for c, _ in later] == [feed[1][0]]
        assert await store.read(lambda tx: tx.pending_count("alpha", "b")) == 1
        assert await store.read(lambda tx: tx.first_message_from("alpha", "a", "b", T0)) == m
        assert await store.read(lambda tx: tx.first_message_from("alpha", "a", "b", T0 + 1)) is None
        assert await store.read(lambda tx: tx.first_message_from("alpha", "a", "user", T0)) is None
        assert await store.read(lambda tx: tx.first_message_from("alpha", "b", "c", T0)) is None
        # m1's copies for b and c are queued: unread by both; none from b
        assert await store.read(lambda tx: tx.unread_from("alpha", "b", "a", 5)) == [m]
        assert await store.read(lambda tx: tx.unread_from("alpha", "b", "a", 0)) == []
        assert await store.read(lambda tx: tx.unread_from("alpha", "c", "b", 5)) == []
        note = DeliveryEvent("m1", "c", T0 + 1, "noted", "by c")
        await store.transact(lambda tx: tx.add_history("alpha", note))
        hist = await store.read(lambda tx: tx.history("alpha", "m1"))
        assert hist[-1] == note
        # a reaction is there once: the same again is no line of its own
        react = DeliveryEvent("m1", "c", T0 + 2, "reaction", "+1")
        assert await store.transact(lambda tx: tx.add_reaction("alpha", react)) is True
        again = DeliveryEvent("m1", "c", T0 + 3, "reaction", "+1")
        assert await store.transact(lambda tx: tx.add_reaction("alpha", again)) is False
        other = DeliveryEvent("m1", "b", T0 + 3, "reaction", "+1")
        assert await store.transact(lambda tx: tx.add_reaction("alpha", other)) is True
        hist = await store.read(lambda tx: tx.history("alpha", "m1"))
        assert hist[-3:] == [note, react, other]
        feed = await store.read(lambda tx: tx.feed("alpha", 0, 10))
        assert [e for _, e in feed][-3:] == [note, react, other]
        states = await store.read(lambda tx: [d.state for d in tx.deliveries("alpha", "m1")])
        assert states == [DeliveryState.QUEUED, DeliveryState.QUEUED]


async def check_lease_order_and_filters(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(5):
            session = "s-b" if i == 2 else None
            await store.transact(
                lambda tx, i=i, session=session: tx.insert_message(
                    make_msg(f"m{i}"), [Recipient("b", session)]
                )
            )
        got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2))
        assert [g.message.message_id for g in got] == ["m0", "m1"]
        assert all(g.attempt == 1 for g in got)
        got2 = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 10))
        # m2 is pinned to session s-b and is not handed to a member-wide lease
        assert [g.message.message_id for g in got2] == ["m3", "m4"]
        got3 = await store.transact(lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 10))
        assert [(g.message.message_id, g.recipient.session) for g in got3] == [("m2", "s-b")]
        assert await store.transact(lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 10)) == []
        await store.transact(lambda tx: tx.insert_message(make_msg("m5"), [Recipient("b", "s-b")]))
        await store.transact(lambda tx: tx.insert_message(make_msg("m6"), [Recipient("b")]))
        pinned = await store.transact(
            lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 10, include_unpinned=False)
        )
        assert [g.message.message_id for g in pinned] == ["m5"]
        assert await store.transact(lambda tx: tx.lease("alpha", "c", None, T0, T0 + 60, 10)) == []
        states = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert states[0].state is DeliveryState.LEASED and states[0].lease_until == T0 + 60
        hist = await store.read(lambda tx: tx.history("alpha", "m0"))
        assert [e.event for e in hist] == ["queued", "leased"]


async def check_held_by_a_named_receive(make_store: StoreFactory) -> None:
    """A lease to a named receive (``holder``) is found again by that name while it
    runs, the same attempt, nothing changed; not by another name or member, not once
    acked, expired, or leased again without the name, nor when its transaction failed."""

    def names(got: list[Any]) -> list[tuple[str, int]]:
        return [(g.message.message_id, g.attempt) for g in got]

    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(4):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        got = await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2, holder="r1")
        )
        assert names(got) == [("m0", 1), ("m1", 1)]
        again = await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 1))
        assert names(again) == [("m0", 1), ("m1", 1)]
        assert [g.seq for g in again] == [g.seq for g in got]
        assert again[0].message == got[0].message
        copies = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert (copies[0].state, copies[0].attempts) == (DeliveryState.LEASED, 1)
        assert await store.read(lambda tx: tx.held("alpha", "b", "r2", T0 + 1)) == []
        assert await store.read(lambda tx: tx.held("alpha", "c", "r1", T0 + 1)) == []
        await store.transact(lambda tx: tx.ack("alpha", "b", ["m0"], T0 + 2))
        assert names(await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 2))) == [
            ("m1", 1)
        ]
        plain = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 2, T0 + 60, 1))
        assert names(plain) == [("m2", 1)]
        assert names(await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 3))) == [
            ("m1", 1)
        ]
        assert await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 60)) == []
        await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m1",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=T0 + 60,
                event="lease_expired",
            )
        )
        relet = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 60, T0 + 99, 1))
        assert names(relet) == [("m1", 2)]
        assert await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 61)) == []

        def failing(tx: Tx) -> None:
            tx.lease("alpha", "b", None, T0 + 61, T0 + 99, 1, holder="r3")
            raise RuntimeError("the transaction fails")

        with suppress(RuntimeError):
            await store.transact(failing)
        assert await store.read(lambda tx: tx.held("alpha", "b", "r3", T0 + 62)) == []
        taken = await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0 + 62, T0 + 99, 1, holder="r3")
        )
        assert names(taken) == [("m3", 1)]
        assert names(await store.read(lambda tx: tx.held("alpha", "b", "r3", T0 + 62))) == [
            ("m3", 1)
        ]


async def check_held_in_lease_order_by_pages(make_store: StoreFactory) -> None:
    """What a name holds comes back in the order it was leased (a copy leased later
    comes later, whatever its ``seq``), each with ``leased_at``, and a page at a time
    after a ``(leased_at, seq)`` pair."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(5):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 1))  # m0
        await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0 + 1, T0 + 60, 2, holder="r1")
        )  # m1, m2
        await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m0",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=T0 + 2,
                event="released",
            )
        )
        await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0 + 3, T0 + 60, 2, holder="r1")
        )  # m0, m3
        held = await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 4))
        order = [(g.message.message_id, g.leased_at) for g in held]
        assert order == [("m1", T0 + 1), ("m2", T0 + 1), ("m0", T0 + 3), ("m3", T0 + 3)]
        pages, after = [], None
        while True:
            page = await store.read(
                lambda tx, after=after: tx.held("alpha", "b", "r1", T0 + 4, after, 3)
            )
            pages.append([g.message.message_id for g in page])
            if len(page) < 3:
                break
            after = (page[-1].leased_at, page[-1].seq)
        assert pages == [["m1", "m2", "m0"], ["m3"]]


async def check_unpin_session(make_store: StoreFactory) -> None:
    """A session that ended gives the copies pinned to it, waiting or leased, to its
    member as a whole; other sessions' copies and other members' are left alone."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for mid, to in [
            ("p0", Recipient("b", "s-b")),
            ("u1", Recipient("b")),
            ("p2", Recipient("b", "s-b")),
            ("o3", Recipient("b", "s-other")),
            ("c4", Recipient("c", "s-b")),
            ("p5", Recipient("b", "s-b")),
        ]:
            await store.transact(lambda tx, m=mid, r=to: tx.insert_message(make_msg(m), [r]))
        await store.transact(
            lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 1, include_unpinned=False)
        )
        await store.transact(lambda tx: tx.ack("alpha", "b", ["p0"], T0))
        await store.transact(
            lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 1, include_unpinned=False)
        )
        got = await store.transact(
            lambda tx: tx.unpin_session("alpha", "b", "s-b", T0 + 1, "session s-b ended")
        )
        assert got == ["p2", "p5"], got  # p0 acked; lowest seq first
        p2 = (await store.read(lambda tx: tx.deliveries("alpha", "p2")))[0]
        assert (p2.recipient, p2.state, p2.attempts) == (Recipient("b"), DeliveryState.LEASED, 1)
        hist = await store.read(lambda tx: tx.history("alpha", "p5"))
        assert [(e.event, e.detail) for e in hist][-1] == ("unpinned", "session s-b ended")
        for mid, session in [("p0", "s-b"), ("o3", "s-other")]:
            copies = await store.read(lambda tx, m=mid: tx.deliveries("alpha", m))
            assert copies[0].recipient.session == session, copies
        c4 = await store.read(lambda tx: tx.deliveries("alpha", "c4"))
        assert c4[0].recipient == Recipient("c", "s-b")
        # a member-wide lease takes them now (p2 once its lease is given back)
        got2 = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 1, T0 + 60, 10))
        assert [(g.message.message_id, g.recipient.session) for g in got2] == [
            ("u1", None),
            ("p5", None),
        ]
        assert await store.transact(lambda tx: tx.unpin_session("alpha", "b", "s-b", T0, "")) == []


async def check_concurrent_leases_never_overlap(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(60):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i:03}"), [Recipient("b")])
            )

        async def take() -> list[str]:
            got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 7))
            return [g.message.message_id for g in got]

        batches = await asyncio.gather(*(take() for _ in range(12)))
        seen = [mid for b in batches for mid in b]
        assert len(seen) == len(set(seen)) == 60, "each delivery is handed out once"
        for b in batches:
            assert b == sorted(b), "a batch is in send order"


async def check_late_ack(make_store: StoreFactory) -> None:
    """An ack that comes after its lease ran out (the copy queued again, not yet handed
    out anew) acks the copy: the model is not handed it a second time. A copy never
    handed out is not acked by an id the member guessed."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for mid in ("m0", "m1"):
            await store.transact(lambda tx, m=mid: tx.insert_message(make_msg(m), [Recipient("b")]))
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 1))
        ran_out = await store.transact(
            lambda tx: tx.transition(
                "alpha", "m0", "b", from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED, now=T0 + 60, event="lease_expired",
            )
        )  # fmt: skip
        assert ran_out
        acked = await store.transact(lambda tx: tx.ack("alpha", "b", ["m0", "m1"], T0 + 61))
        assert acked == ["m0"], acked  # m1 was never handed out
        d = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert (d[0].state, d[0].attempts, d[0].lease_until) == (DeliveryState.ACKED, 1, None)
        hist = await store.read(lambda tx: [e.event for e in tx.history("alpha", "m0")])
        assert hist == ["queued", "leased", "lease_expired", "acked"], hist
        again = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 61, T0 + 90, 9))
        assert [m.message.message_id for m in again] == ["m1"]


async def check_ack(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(3):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2))
        acked = await store.transact(lambda tx: tx.ack("alpha", "b", ["m0", "m2", "zz", "m0"], T0))
        assert acked == ["m0"], acked  # m2 is still queued, zz does not exist
        again = await store.transact(lambda tx: tx.ack("alpha", "b", ["m0", "m1"], T0 + 1))
        assert again == ["m0", "m1"], again
        assert await store.transact(lambda tx: tx.ack("alpha", "c", ["m1"], T0)) == []
        d = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert d[0].state is DeliveryState.ACKED and d[0].lease_until is None
        hist = await store.read(lambda tx: [e.event for e in tx.history("alpha", "m0")])
        assert hist == ["queued", "leased", "acked"], hist
        assert await store.read(lambda tx: tx.pending_count("alpha", "b")) == 1
        # more ids than one statement takes: answered in the order asked, each once
        many = [f"n{i:03}" for i in range(620)]
        await store.transact(
            lambda tx: [tx.insert_message(make_msg(mid), [Recipient("b")]) for mid in many]
        )
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 700))
        ask = [*reversed(many), "m0", "zz", many[0]]
        acked = await store.transact(lambda tx: tx.ack("alpha", "b", ask, T0 + 2))
        assert acked == [*reversed(many), "m0"], acked[:5]
        assert await store.read(lambda tx: [e.event for e in tx.history("alpha", "n500")]) == [
            "queued",
            "leased",
            "acked",
        ]


async def check_pending_counts(make_store: StoreFactory) -> None:
    """Each member's copies not acked yet (queued or leased), counted by member for one
    team: acked and dead copies are not counted, members with none are left out, and
    another team's copies never show."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        await store.transact(lambda tx: seed_team(tx, "beta"))
        assert await store.read(lambda tx: tx.pending_counts("alpha")) == {}
        for i in range(5):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        await store.transact(
            lambda tx: tx.insert_message(make_msg("to-c", to="c"), [Recipient("c")])
        )
        await store.transact(
            lambda tx: tx.insert_message(make_msg("x", team="beta"), [Recipient("b")])
        )
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 3))
        assert await store.transact(lambda tx: tx.ack("alpha", "b", ["m0"], T0)) == ["m0"]
        assert await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m1",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DEAD,
                now=T0 + 1,
                event="dead",
                dead_reason="gone",
            )
        )
        # b: m2 leased, m3 and m4 queued; c: one queued; a, user: none
        assert await store.read(lambda tx: tx.pending_counts("alpha")) == {"b": 3, "c": 1}
        assert await store.read(lambda tx: tx.pending_counts("beta")) == {"b": 1}
        assert await store.read(lambda tx: tx.pending_counts("gamma")) == {}
        await store.transact(lambda tx: tx.ack("alpha", "b", ["m2"], T0 + 2))
        assert await store.read(lambda tx: tx.pending_counts("alpha")) == {"b": 2, "c": 1}


async def check_expiry_and_transitions(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(3):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        assert await store.read(lambda tx: tx.next_lease_expiry()) is None
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 30, 1))
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 10, 1))
        assert await store.read(lambda tx: tx.next_lease_expiry()) == T0 + 10
        assert await store.read(lambda tx: tx.expired_leases(T0 + 9, 10)) == []
        expired = await store.read(lambda tx: tx.expired_leases(T0 + 30, 10))
        assert [d.message_id for d in expired] == ["m1", "m0"], "earliest expiry first"
        first = await store.read(lambda tx: tx.expired_leases(T0 + 30, 1))
        assert [d.message_id for d in first] == ["m1"]
        moved = await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m1",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=T0 + 10,
                event="lease_expired",
            )
        )
        assert moved is True
        not_moved = await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m2",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DEAD,
                now=T0 + 10,
                event="dead",
                dead_reason="x",
            )
        )
        assert not_moved is False
        again = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 10, T0 + 70, 5))
        # the requeued m1 comes before m2, which was never handed out
        assert [(g.message.message_id, g.attempt) for g in again] == [("m1", 2), ("m2", 1)]
        await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m0",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DEAD,
                now=T0 + 31,
                event="dead",
                detail="gave up",
                dead_reason="gave up",
            )
        )
        d = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert d[0].state is DeliveryState.DEAD and d[0].dead_reason == "gave up"
        assert await store.transact(lambda tx: tx.ack("alpha", "b", ["m0"], T0 + 32)) == []


async def check_transact_each(make_store: StoreFactory) -> None:
    """``transact_each``: each function's answer in order; a failing one is undone
    alone and answered with its exception; the others commit."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        assert await store.transact_each([]) == []

        def send(mid: str) -> Callable[[Tx], str]:
            def fn(tx: Tx) -> str:
                tx.insert_message(make_msg(mid), [Recipient("b")])
                return mid

            return fn

        def half_done(tx: Tx) -> str:
            tx.insert_message(make_msg("lost"), [Recipient("b")])
            raise RuntimeError("boom")

        got = await store.transact_each([send("e1"), half_done, send("e2"), send("e3")])
        assert got[0] == "e1" and got[2:] == ["e2", "e3"]
        assert isinstance(got[1], RuntimeError) and str(got[1]) == "boom"
        assert await store.read(lambda tx: tx.get_message("alpha", "lost")) is None
        leased = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 1, 10))
        assert sorted(g.message.message_id for g in leased) == ["e1", "e2", "e3"]
        # a later function sees what an earlier one of the same call wrote
        seen = await store.transact_each(
            [send("e4"), lambda tx: tx.get_message("alpha", "e4") is not None]
        )
        assert seen == ["e4", True]


async def check_atomicity(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)

        def half_done(tx: Tx) -> None:
            tx.insert_team(Team("gamma", T0))
            tx.insert_message(make_msg("lost"), [Recipient("b")])
            raise RuntimeError("boom")

        try:
            await store.transact(half_done)
        except RuntimeError as exc:
            assert str(exc) == "boom"
        else:
            raise AssertionError("the function's exception must propagate")
        assert await store.read(lambda tx: tx.get_team("gamma")) is None
        assert await store.read(lambda tx: tx.get_message("alpha", "lost")) is None
        assert await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 1, 5)) == []
        assert await store.read(lambda tx: tx.history("alpha", "lost")) == []
        # a failing function does not disturb others committed alongside it
        results = await asyncio.gather(
            store.transact(lambda tx: tx.insert_message(make_msg("ok1"), [Recipient("b")])),
            store.transact(half_done),
            store.transact(lambda tx: tx.insert_message(make_msg("ok2"), [Recipient("b")])),
            return_exceptions=True,
        )
        assert isinstance(results[1], RuntimeError)
        got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 1, 5))
        # concurrent functions commit in some order; both of them, and nothing else
        assert sorted(g.message.message_id for g in got) == ["ok1", "ok2"]


async def check_prefetch_changes_no_answer(make_store: StoreFactory) -> None:
    """``Tx.prefetch`` is a hint: every read it names answers as without it, the rows
    and the misses alike, and a write in the same transaction shows in the reads after
    it (a store answering from what it fetched drops that on a write)."""
    reads = Reads(
        "alpha",
        members=("b", "a", "ghost"),
        budgets=("ctx:a", "pair:a|b", "pair:a|c"),
        link=("a", "b"),
        session="s1",
        active_of="a",
        live_of="a",
        message="p1",
    )
    s1 = Session("alpha", "s1", "a", SessionState.ACTIVE, T0, T0, turn=1)
    pair = Budget("alpha", "pair:a|b", T0, used=2, last_from="a", updated_at=T0)

    def everything(tx: Tx) -> list[Any]:
        return [
            tx.get_team("alpha"),
            tx.get_member("alpha", "a"),
            tx.get_member("alpha", "b"),
            tx.get_member("alpha", "ghost"),
            tx.get_budget("alpha", "ctx:a"),
            tx.get_budget("alpha", "pair:a|b"),
            tx.get_budget("alpha", "pair:a|c"),
            tx.find_open_link("alpha", "b", "a"),
            tx.get_session("alpha", "s1"),
            tx.list_sessions("alpha", "a", which="active", limit=2),
            tx.list_sessions("alpha", "a", which="live"),
            tx.get_message("alpha", "p1"),
        ]

    async with opened(make_store) as store:
        await store.transact(seed_team)
        await store.transact(lambda tx: (tx.put_session(s1), tx.put_budget(pair)))
        plain = await store.read(everything)

        def prefetched(tx: Tx) -> list[Any]:
            tx.prefetch(reads)
            return everything(tx)

        assert await store.transact(prefetched) == plain
        assert await store.read(prefetched) == plain
        ended = dataclasses.replace(s1, state=SessionState.TERMINATED, updated_at=T0 + 1)
        link = Link("alpha", "lp", "a", "s1", "b", None, 8, T0)
        member = dataclasses.replace(plain[1], settings={"max_queued": 7})
        spent = dataclasses.replace(pair, used=3, updated_at=T0 + 1)

        def written(tx: Tx) -> list[Any]:
            tx.prefetch(reads)
            everything(tx)
            tx.update_member(member)
            tx.put_budget(spent)
            tx.put_session(ended)
            tx.insert_link(link)
            tx.insert_message(make_msg("p1"), [Recipient("b")])
            return everything(tx)

        after = await store.transact(written)
        again = await store.read(everything)
        assert after == again, [(x, y) for x, y in zip(after, again, strict=True) if x != y]
        assert after[1] == member and after[5] == spent and after[8] == ended, after
        assert after[7] == link and after[9] == [] and after[10] == [], after
        assert after[11] is not None and after[11].message_id == "p1", after


async def check_many_concurrent_writers(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        n = 300
        await asyncio.gather(
            *(
                store.transact(
                    lambda tx, i=i: tx.insert_message(
                        make_msg(f"c{i:04}", text=str(i)), [Recipient("c")]
                    )
                )
                for i in range(n)
            )
        )
        got = await store.transact(lambda tx: tx.lease("alpha", "c", None, T0, T0 + 1, 1000))
        ids = [g.message.message_id for g in got]
        assert len(ids) == n and len(set(ids)) == n
        seqs = [g.seq for g in got]
        assert seqs == sorted(seqs)


async def check_transcripts(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        ids = []
        for i, kind in enumerate([EventKind.TURN_START, EventKind.THOUGHT, EventKind.AGENT_STOP]):
            ev = SessionEvent("alpha", "s1", 1, T0 + i, kind, f"t{i}", {"i": i})
            ids.append(await store.transact(lambda tx, ev=ev: tx.append_event(ev)))
        other = SessionEvent("alpha", "s2", 1, T0, EventKind.THOUGHT, "elsewhere")
        await store.transact(lambda tx: tx.append_event(other))
        assert ids == sorted(ids)
        assert len(set(ids)) == 3
        got = await store.read(lambda tx: tx.list_events("alpha", "s1", 0, None, 10))
        assert [(e.kind, e.text, dict(e.data), e.event_id) for e in got] == [
            (EventKind.TURN_START, "t0", {"i": 0}, ids[0]),
            (EventKind.THOUGHT, "t1", {"i": 1}, ids[1]),
            (EventKind.AGENT_STOP, "t2", {"i": 2}, ids[2]),
        ]
        page = await store.read(lambda tx: tx.list_events("alpha", "s1", ids[0], ids[1], 10))
        assert [e.event_id for e in page] == [ids[1]]
        limited = await store.read(lambda tx: tx.list_events("alpha", "s1", 0, None, 2))
        assert [e.event_id for e in limited] == ids[:2]


async def check_ledger(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        e1 = LedgerEntry("alpha", "s1", "b", "d1", "m1", T0)
        e2 = LedgerEntry("alpha", "s1", "*", "d2", "m2", T0 + 1)
        e3 = LedgerEntry("alpha", "s2", "b", "d1", "m3", T0)
        await store.transact(lambda tx: (tx.ledger_add(e1), tx.ledger_add(e2), tx.ledger_add(e3)))
        assert await store.read(lambda tx: tx.ledger("alpha", "s1")) == [e1, e2]
        assert await store.transact(lambda tx: tx.ledger_clear("alpha", "s1")) == 2
        assert await store.read(lambda tx: tx.ledger("alpha", "s1")) == []
        assert await store.read(lambda tx: tx.ledger("alpha", "s2")) == [e3]
        assert await store.transact(lambda tx: tx.ledger_clear("alpha", "s1")) == 0

        # the calls that answer nothing (a store may send them with its next statement):
        # what comes after them in the transaction sees them
        def forget(tx: Tx) -> tuple[list[LedgerEntry], list[LedgerEntry], list[str]]:
            before = tx.ledger("alpha", "s2")
            tx.ledger_forget("alpha", "s2")
            tx.note_event(SessionEvent("alpha", "s2", 1, T0, EventKind.THOUGHT, "noted"))
            events = tx.list_events("alpha", "s2", 0, None, 10)
            return before, tx.ledger("alpha", "s2"), [e.text for e in events]

        assert await store.transact(forget) == ([e3], [], ["noted"])
        assert await store.read(lambda tx: tx.ledger("alpha", "s2")) == []


async def check_timer_pages(make_store: StoreFactory) -> None:
    """Timers a page at a time: ``list_timers`` in id order after ``after``, filtered by
    member (the one its payload names), session and state, only kind ``timer`` and only
    the team's; ``list_jobs`` in due order from an ``offset``; ``count_pending_jobs``."""
    async with opened(make_store) as store:

        def timer(member: str, session: str, due: float, team: str = "alpha") -> Job:
            return Job(team, "timer", T0 + due, T0, session, {"member": member})

        plan = [
            timer("a", "a-1", 50),
            timer("b", "b-1", 10),
            timer("a", "a-2", 30),
            Job("alpha", "checkpoint", T0 + 5, T0, "a-1", {"member": "a"}),
            timer("a", "a-1", 20, team="beta"),
            timer("b", "b-1", 40),
            timer("a", "a-1", 60),
        ]
        ids = [await store.transact(lambda tx, j=j: tx.add_job(j)) for j in plan]
        t_a1, t_b1, t_a2, _, _, t_b2, t_a3 = ids
        await store.transact(lambda tx: tx.finish_job(t_b2, JobState.CANCELLED, T0 + 1))
        await store.transact(lambda tx: tx.finish_job(t_a2, JobState.DONE, T0 + 1))

        async def page(**kw: Any) -> list[int]:
            found: list[Job] = await store.read(lambda tx: tx.list_timers("alpha", **kw))
            return [j.job_id for j in found]

        assert await page() == [t_a1, t_b1, t_a3]
        assert await page(pending_only=False) == [t_a1, t_b1, t_a2, t_b2, t_a3]
        assert await page(after=t_a1, limit=1) == [t_b1]
        assert await page(after=t_a3) == []
        assert await page(member="a") == [t_a1, t_a3]
        assert await page(member="a", pending_only=False, after=t_a1) == [t_a2, t_a3]
        assert await page(session_id="b-1", pending_only=False) == [t_b1, t_b2]
        assert await page(session_id="a-1", limit=1) == [t_a1]
        assert await page(member="b", session_id="a-1") == []
        assert await page(member="zz") == []

        # the dashboard's: pending timers by due time from an offset, and their count
        async def due(offset: int, limit: int) -> list[int]:
            found: list[Job] = await store.read(
                lambda tx: tx.list_jobs("alpha", kind="timer", limit=limit, offset=offset)
            )
            return [j.job_id for j in found]

        assert await due(0, 5) == [t_b1, t_a1, t_a3]
        assert await due(1, 1) == [t_a1]
        assert await due(3, 5) == []
        assert await store.read(lambda tx: tx.count_pending_jobs("alpha", "timer")) == 3
        assert await store.read(lambda tx: tx.count_pending_jobs("alpha", "checkpoint")) == 1
        assert await store.read(lambda tx: tx.count_pending_jobs("beta", "timer")) == 1
        assert await store.read(lambda tx: tx.count_pending_jobs("gamma", "timer")) == 0
        try:
            await store.read(lambda tx: tx.list_jobs("alpha", offset=1))
        except ValueError:
            pass
        else:
            raise AssertionError("an offset without a limit must raise ValueError")


async def check_timer_counts(make_store: StoreFactory) -> None:
    """``count_timers``: a member's pending timers over all its sessions (live or
    exited) in one count, bounded by ``limit``; not its fired or cancelled ones, nor one
    left pending on a terminated session, nor another member's, kind's or team's."""
    async with opened(make_store) as store:
        sessions = [
            Session("alpha", "a-1", "a", SessionState.IDLE, T0, T0),
            Session("alpha", "a-2", "a", SessionState.EXITED, T0, T0),
            Session("alpha", "a-3", "a", SessionState.TERMINATED, T0, T0),
            Session("alpha", "b-1", "b", SessionState.ACTIVE, T0, T0),
            Session("beta", "a-1", "a", SessionState.IDLE, T0, T0),
        ]
        await store.transact(lambda tx: [tx.put_session(s) for s in sessions])

        def timer(member: str, session: str, team: str = "alpha", kind: str = "timer") -> Job:
            return Job(team, kind, T0 + 60, T0, session, {"member": member})

        plan = [
            timer("a", "a-1"),
            timer("a", "a-1"),
            timer("a", "a-2"),
            timer("a", "a-3"),  # its session ended: fires nothing
            timer("a", "a-1"),  # fired below
            timer("a", "a-2"),  # cancelled below
            timer("a", "a-1", kind="checkpoint"),
            timer("b", "b-1"),
            timer("a", "a-1", team="beta"),
        ]
        ids = [await store.transact(lambda tx, j=j: tx.add_job(j)) for j in plan]
        await store.transact(lambda tx: tx.finish_job(ids[4], JobState.DONE, T0 + 1))
        await store.transact(lambda tx: tx.finish_job(ids[5], JobState.CANCELLED, T0 + 1))

        async def count(member: str, limit: int, team: str = "alpha") -> int:
            n: int = await store.read(lambda tx: tx.count_timers(team, member, limit))
            return n

        assert await count("a", 100) == 3
        assert await count("a", 2) == 2
        assert await count("b", 100) == 1
        assert await count("a", 100, team="beta") == 1
        assert await count("zz", 100) == 0


async def check_pending_job_attempts(make_store: StoreFactory) -> None:
    """The attempts a team's pending jobs of one kind hold in their payloads, summed:
    finished jobs, other kinds and other teams are not counted, and a job whose payload
    has no ``attempt`` counts 0."""
    async with opened(make_store) as store:
        plan = [
            Job("alpha", "outbox", T0 + 1, T0, None, {"attempt": 2, "body": {"x": "y"}}),
            Job("alpha", "outbox", T0 + 2, T0, None, {"attempt": 3}),
            Job("alpha", "outbox", T0 + 3, T0, None, {}),
            Job("alpha", "outbox", T0 + 4, T0, None, {"attempt": 7}),
            Job("alpha", "timer", T0 + 5, T0, "s", {"attempt": 11}),
            Job("beta", "outbox", T0 + 6, T0, None, {"attempt": 13}),
        ]
        ids = [await store.transact(lambda tx, j=j: tx.add_job(j)) for j in plan]
        assert await store.read(lambda tx: tx.pending_job_attempts("alpha", "outbox")) == 12
        await store.transact(lambda tx: tx.finish_job(ids[3], JobState.DONE, T0 + 9))
        assert await store.read(lambda tx: tx.pending_job_attempts("alpha", "outbox")) == 5
        assert await store.read(lambda tx: tx.pending_job_attempts("beta", "outbox")) == 13
        assert await store.read(lambda tx: tx.pending_job_attempts("gamma", "outbox")) == 0


async def check_jobs(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        assert await store.read(lambda tx: tx.next_job_due()) is None
        assert await store.read(lambda tx: tx.last_job_id()) == 0
        late = Job("alpha", "timer", T0 + 50, T0, "s1", {"note": "later"})
        soon = Job("alpha", "timer", T0 + 10, T0, "s1", {"note": "soon"})
        other = Job("beta", "checkpoint", T0 + 20, T0, "s9")
        jid_late = await store.transact(lambda tx: tx.add_job(late))
        jid_soon = await store.transact(lambda tx: tx.add_job(soon))
        jid_other = await store.transact(lambda tx: tx.add_job(other))
        assert len({jid_late, jid_soon, jid_other}) == 3
        assert await store.read(lambda tx: tx.last_job_id()) == max(jid_late, jid_soon, jid_other)
        assert await store.read(lambda tx: tx.next_job_due()) == T0 + 10
        got = await store.read(lambda tx: tx.get_job("alpha", jid_soon))
        assert got is not None
        assert (got.job_id, dict(got.payload), got.state) == (
            jid_soon,
            {"note": "soon"},
            JobState.PENDING,
        )
        assert await store.read(lambda tx: tx.get_job("beta", jid_soon)) is None
        assert await store.read(lambda tx: tx.due_jobs(T0 + 9, 10)) == []
        due = await store.read(lambda tx: tx.due_jobs(T0 + 20, 10))
        assert [j.job_id for j in due] == [jid_soon, jid_other]
        assert await store.transact(lambda tx: tx.finish_job(jid_soon, JobState.DONE, T0 + 20))
        assert not await store.transact(
            lambda tx: tx.finish_job(jid_soon, JobState.CANCELLED, T0 + 21)
        )
        assert await store.read(lambda tx: tx.next_job_due()) == T0 + 20
        pending = await store.read(lambda tx: [j.job_id for j in tx.list_jobs("alpha")])
        assert pending == [jid_late]
        every = await store.read(
            lambda tx: tx.list_jobs("alpha", session_id="s1", pending_only=False)
        )
        assert [(j.job_id, j.state) for j in every] == [
            (jid_soon, JobState.DONE),
            (jid_late, JobState.PENDING),
        ]
        assert await store.read(lambda tx: tx.list_jobs("alpha", kind="checkpoint")) == []

        def claim_and_fail(tx: Tx) -> None:
            for j in tx.due_jobs(T0 + 100, 10):
                tx.finish_job(j.job_id, JobState.DONE, T0 + 100)
            raise RuntimeError("crashed while firing")

        with suppress(RuntimeError):
            await store.transact(claim_and_fail)
        again = await store.read(lambda tx: [j.job_id for j in tx.due_jobs(T0 + 100, 10)])
        assert again == [jid_other, jid_late], "a failed firing leaves the jobs due"

        # a job by its request id, whatever its state; only on its session and kind
        keyed = Job("alpha", "timer", T0 + 5, T0, "s1", {"request_id": "r-1", "note": "k"})
        jid_keyed = await store.transact(lambda tx: tx.add_job(keyed))
        await store.transact(lambda tx: tx.finish_job(jid_keyed, JobState.DONE, T0 + 5))
        found = await store.read(lambda tx: tx.job_by_request("alpha", "s1", "timer", "r-1"))
        assert found is not None and (found.job_id, found.state) == (jid_keyed, JobState.DONE)
        for where in (("alpha", "s2", "timer"), ("alpha", "s1", "exit"), ("beta", "s1", "timer")):
            assert await store.read(lambda tx, w=where: tx.job_by_request(*w, "r-1")) is None
        assert await store.read(lambda tx: tx.job_by_request("alpha", "s1", "timer", "r-2")) is None


async def check_watches(make_store: StoreFactory) -> None:
    """A job that watches a sender is found by ``watching`` until ``end_watch`` (or its
    end) stops it, in its own team only; the answer follows writes made since."""
    async with opened(make_store) as store:
        wait_b = Job("alpha", "timer", T0 + 60, T0, "s1", {"member": "a"}, watch="b")
        wait_c = Job("alpha", "timer", T0 + 60, T0, "s1", {"member": "a"}, watch="c")
        plain = Job("alpha", "timer", T0 + 60, T0, "s1", {"member": "a"})
        beta = Job("beta", "timer", T0 + 60, T0, "s9", {"member": "a"}, watch="b")

        def watched(team: str, sender: str) -> Callable[[Tx], list[int]]:
            return lambda tx: [j.job_id for j in tx.watching(team, sender)]

        assert await store.transact(watched("alpha", "b")) == []  # and remembered empty
        ids = []
        for job in (wait_b, wait_c, plain, beta):
            ids.append(await store.transact(lambda tx, job=job: tx.add_job(job)))
        jb, jc, _, jbeta = ids
        assert await store.transact(watched("alpha", "b")) == [jb]
        assert await store.read(watched("alpha", "c")) == [jc]
        assert await store.transact(watched("beta", "b")) == [jbeta]
        assert await store.transact(watched("alpha", "a")) == []
        got = await store.read(lambda tx: tx.get_job("alpha", jb))
        assert got is not None and got.watch == "b"

        def send_then_ask(sender: str) -> Callable[[Tx], list[int]]:
            def fn(tx: Tx) -> list[int]:  # as a send asks: right after storing its message
                tx.insert_message(make_msg(f"m-{sender}", sender=sender, to="a"), [Recipient("a")])
                return [j.job_id for j in tx.watching("alpha", sender)]

            return fn

        await store.transact(seed_team)
        assert await store.transact(send_then_ask("b")) == [jb]
        assert await store.transact(send_then_ask("user")) == []

        def reply(tx: Tx) -> tuple[bool, list[int]]:
            ended = tx.end_watch(jb, {"member": "a", "reply": "m9"})
            return ended, [j.job_id for j in tx.watching("alpha", "b")]

        assert await store.transact(reply) == (True, [])
        got = await store.read(lambda tx: tx.get_job("alpha", jb))
        assert got is not None and (got.watch, dict(got.payload)) == (
            None,
            {"member": "a", "reply": "m9"},
        )
        assert not await store.transact(lambda tx: tx.end_watch(jb, {})), "once only"
        assert await store.transact(lambda tx: tx.finish_job(jc, JobState.CANCELLED, T0 + 1))
        assert await store.transact(watched("alpha", "c")) == []
        assert not await store.transact(lambda tx: tx.end_watch(jc, {}))

        def add_and_fail(tx: Tx) -> None:
            tx.add_job(dataclasses.replace(wait_c, watch="d"))
            raise RuntimeError("crashed after adding")

        with suppress(RuntimeError):
            await store.transact(add_and_fail)
        assert await store.transact(watched("alpha", "d")) == [], "rolled back with its job"


async def check_feed_start(make_store: StoreFactory) -> None:
    """``feed_start``: the cursor the team's latest events follow, other teams' events
    between them or not; cursors keep growing after another team is deleted."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        await store.transact(lambda tx: seed_team(tx, "beta"))
        assert await store.read(lambda tx: tx.feed_start("alpha", 3)) == 0, "no events yet"
        for i in range(4):  # alpha's copies interleave with beta's
            await store.transact(
                lambda tx, i=i: tx.insert_message(
                    make_msg(f"m{i}"), [Recipient("b"), Recipient("c")]
                )
            )
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"x{i}", team="beta"), [Recipient("b")])
            )
        every = await store.read(lambda tx: tx.feed("alpha", 0, 100))
        assert len(every) == 8

        def start(last: int) -> Any:
            return store.read(lambda tx: tx.feed_start("alpha", last))

        for last in (1, 3, 7):
            cursor = await start(last)
            assert cursor == every[-last - 1][0], (last, cursor)
            got = await store.read(lambda tx, c=cursor, n=last: tx.feed("alpha", c, n))
            assert got == every[-last:], last
        assert await start(8) == 0 and await start(100) == 0, "no more than that: from 0"
        assert await start(0) == every[-1][0], "none of them: after the newest"
        assert await store.read(lambda tx: tx.feed_start("gamma", 5)) == 0, "no such team"
        # deleting a team leaves the others' cursors growing, never reused
        await store.transact(lambda tx: tx.delete_team("beta"))
        await store.transact(lambda tx: tx.insert_message(make_msg("m9"), [Recipient("b")]))
        newer = await store.read(lambda tx: tx.feed("alpha", every[-1][0], 10))
        assert [(e.message_id, e.event) for _, e in newer] == [("m9", "queued")], newer
        assert newer[0][0] > every[-1][0]
        assert await store.read(lambda tx: tx.feed("alpha", 0, 100)) == [*every, *newer]
        assert await start(1) == every[-1][0]


async def check_dead_letters(make_store: StoreFactory) -> None:
    """``dead_letters``: the team's dead copies, the latest given up on first, and
    how many there are; other states and other teams left out."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        await store.transact(lambda tx: seed_team(tx, "beta"))
        assert await store.read(lambda tx: tx.dead_letters("alpha", 10)) == ([], 0)
        for i in range(4):
            await store.transact(
                lambda tx, i=i: tx.insert_message(
                    make_msg(f"m{i}"), [Recipient("b"), Recipient("c")]
                )
            )
        await store.transact(
            lambda tx: tx.insert_message(make_msg("x", team="beta"), [Recipient("b")])
        )

        def kill(team: str, mid: str, member: str, at: float) -> Any:
            return store.transact(
                lambda tx: tx.transition(
                    team,
                    mid,
                    member,
                    from_states=[DeliveryState.QUEUED],
                    to_state=DeliveryState.DEAD,
                    now=at,
                    event="dead",
                    dead_reason=f"why {mid}",
                )
            )

        await kill("alpha", "m2", "b", T0 + 5)
        await kill("alpha", "m0", "c", T0 + 9)
        await kill("alpha", "m1", "b", T0 + 5)  # as late as m2's: m2's later seq first
        await kill("alpha", "m3", "c", T0 + 1)
        await kill("beta", "x", "b", T0 + 50)

        def dead(limit: int) -> Any:
            return store.read(lambda tx: tx.dead_letters("alpha", limit))

        found, total = await dead(10)
        assert total == 4
        assert [(d.message_id, d.recipient.member) for d in found] == [
            ("m0", "c"),
            ("m2", "b"),
            ("m1", "b"),
            ("m3", "c"),
        ], found
        assert all(d.state is DeliveryState.DEAD for d in found)
        assert found[0].dead_reason == "why m0" and found[0].updated_at == T0 + 9
        found, total = await dead(2)
        assert [d.message_id for d in found] == ["m0", "m2"] and total == 4


async def check_release_untried(make_store: StoreFactory) -> None:
    """A lease given back with ``refund`` (the hub never handed the copy to anyone) is
    no attempt: the copy's ``attempts`` goes down by one, never below 0, and the next
    lease is the same attempt again; without ``refund`` it stays spent."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(2):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )

        def back(mid: str, now: float, refund: bool) -> Callable[[Tx], bool]:
            return lambda tx: tx.transition(
                "alpha",
                mid,
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=now,
                event="released",
                refund=refund,
            )

        def attempts(got: list[Any]) -> list[tuple[str, int]]:
            return [(g.message.message_id, g.attempt) for g in got]

        got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2))
        assert attempts(got) == [("m0", 1), ("m1", 1)]
        assert await store.transact(back("m0", T0 + 1, True)) is True
        assert await store.transact(back("m1", T0 + 1, False)) is True
        copies = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert (copies[0].state, copies[0].attempts) == (DeliveryState.QUEUED, 0)
        again = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 2, T0 + 60, 2))
        assert attempts(again) == [("m0", 1), ("m1", 2)]
        assert await store.transact(back("m0", T0 + 3, True)) is True
        assert await store.transact(back("m0", T0 + 3, True)) is False  # not leased now
        copies = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert copies[0].attempts == 0


async def check_give_back_names_its_lease(make_store: StoreFactory) -> None:
    """A give-back that names its lease (``transition(lease=...)``) moves the copy only
    while it is under that lease: not once it was answered again to its name
    (``held_again``: the same attempt, a ``lease_until`` one step later, reported), nor
    leased again after it ran out; a give-back naming the lease it is under now does."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(2):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )

        def back(mid: str, lease: Lease, now: float = T0 + 2) -> Callable[[Tx], bool]:
            return lambda tx: tx.transition(
                "alpha",
                mid,
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=now,
                event="released",
                refund=True,
                lease=lease,
            )

        got = await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2, holder="r1")
        )
        assert [(g.message.message_id, g.lease_until) for g in got] == [
            ("m0", T0 + 60),
            ("m1", T0 + 60),
        ]
        first = Lease("r1", 1, T0 + 60)
        assert await store.transact(back("m0", Lease("r2", 1, T0 + 60))) is False
        assert await store.transact(back("m0", Lease("r1", 2, T0 + 60))) is False
        assert await store.transact(back("m0", Lease("r1", 1, T0 + 59))) is False
        again = await store.transact(lambda tx: tx.held_again("alpha", "b", "r1", T0 + 1, 1))
        later = math.nextafter(T0 + 60, math.inf)
        assert [(g.message.message_id, g.attempt, g.lease_until) for g in again] == [
            ("m0", 1, later)
        ]
        assert [g.leased_at for g in again] == [T0]
        assert await store.transact(back("m0", first)) is False  # answered again: kept
        copies = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert (copies[0].state, copies[0].attempts) == (DeliveryState.LEASED, 1)
        assert copies[0].lease_until == later
        held = await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 1))
        assert [(g.message.message_id, g.lease_until) for g in held] == [
            ("m0", later),
            ("m1", T0 + 60),
        ]
        assert await store.transact(back("m0", Lease("r1", 1, later))) is True
        assert await store.transact(back("m1", first)) is True
        copies = await store.read(lambda tx: tx.deliveries("alpha", "m1"))
        assert (copies[0].state, copies[0].attempts) == (DeliveryState.QUEUED, 0)
        # unnamed, run out and leased again: the old lease's give-back finds it no more
        plain = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 3, T0 + 9, 1))
        assert [(g.message.message_id, g.attempt) for g in plain] == [("m0", 1)]
        await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m0",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=T0 + 9,
                event="lease_expired",
            )
        )
        relet = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0 + 9, T0 + 20, 1))
        assert [(g.message.message_id, g.attempt) for g in relet] == [("m0", 2)]
        assert await store.transact(back("m0", Lease(None, 1, T0 + 9), T0 + 10)) is False
        assert await store.transact(back("m0", Lease(None, 2, T0 + 20), T0 + 10)) is True


async def check_held_again_by_pages(make_store: StoreFactory) -> None:
    """``held_again`` with ``after`` (an event stream opened again, a page at a time)
    hands to the name anew only the page after that pair, in lease order, each copy
    under a ``lease_until`` one step later; the copies before it keep their lease."""
    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(3):
            await store.transact(
                lambda tx, i=i: tx.insert_message(make_msg(f"m{i}"), [Recipient("b")])
            )
        got = await store.transact(
            lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 3, holder="r1")
        )
        after = (T0, got[0].seq)  # leased at T0
        again = await store.transact(lambda tx: tx.held_again("alpha", "b", "r1", T0 + 1, 1, after))
        later = math.nextafter(T0 + 60, math.inf)
        assert [(g.message.message_id, g.attempt, g.lease_until) for g in again] == [
            ("m1", 1, later)
        ]
        held = await store.read(lambda tx: tx.held("alpha", "b", "r1", T0 + 1))
        assert [(g.message.message_id, g.lease_until) for g in held] == [
            ("m0", T0 + 60),
            ("m1", later),
            ("m2", T0 + 60),
        ]


async def check_identity(make_store: StoreFactory) -> None:
    """An open store has an identity (:attr:`~backchannel.stores.base.Store.identity`),
    and another store another one."""
    async with opened(make_store) as one, opened(make_store) as other:
        assert isinstance(one.identity, str) and one.identity, "an open store has an identity"
        assert other.identity and other.identity != one.identity, "each store its own"


STORE_CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_identity,
    check_compaction,
    check_teams_and_members,
    check_sessions,
    check_send_and_history,
    check_feed_start,
    check_dead_letters,
    check_lease_order_and_filters,
    check_held_by_a_named_receive,
    check_give_back_names_its_lease,
    check_held_in_lease_order_by_pages,
    check_held_again_by_pages,
    check_concurrent_leases_never_overlap,
    check_ack,
    check_late_ack,
    check_pending_counts,
    check_expiry_and_transitions,
    check_release_untried,
    check_atomicity,
    check_prefetch_changes_no_answer,
    check_transact_each,
    check_many_concurrent_writers,
    check_transcripts,
    check_ledger,
    check_jobs,
    check_timer_pages,
    check_timer_counts,
    check_pending_job_attempts,
    check_watches,
    check_links,
    check_delegations_and_tokens,
    check_inbox_cursor,
    check_budgets_and_chains,
    check_credentials_and_removal,
    check_a2a_tasks,
    check_a2a_claims,
    check_dispatch_ownership,
    check_requeue_leased,
    check_unpin_session,
]


async def check_store(make_store: StoreFactory) -> None:
    """Run every conformance check against stores made by ``make_store``; raise
    ``AssertionError`` at the first guarantee that does not hold."""
    for check in STORE_CHECKS:
        await check(make_store)
