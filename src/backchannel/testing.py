"""Fakes and the store conformance suite, shipped for users' tests as well as ours.

* :class:`FakeClock` — a clock that moves only when told to.
* :class:`MemoryStore` — the in-memory store (re-exported).
* :func:`check_store` — every guarantee of the :mod:`backchannel.stores.base` contract,
  run against a store factory. Each check is also in :data:`STORE_CHECKS`, so a test
  suite can parametrize over them and see one result per guarantee::

      @pytest.mark.parametrize("check", STORE_CHECKS, ids=lambda c: c.__name__)
      async def test_store_contract(make_store, check):
          await check(make_store)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from backchannel._dispatch_checks import check_dispatch_ownership, check_requeue_leased
from backchannel.errors import AlreadyExists
from backchannel.stores.base import SessionFilter, Store, Tx
from backchannel.stores.memory import MemoryStore
from backchannel.types import (
    Budget,
    Delegation,
    DelegationState,
    DeliveryEvent,
    DeliveryState,
    EventKind,
    Job,
    JobState,
    LedgerEntry,
    Link,
    LinkState,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Route,
    Session,
    SessionEvent,
    SessionState,
    Team,
)

__all__ = ["STORE_CHECKS", "FakeClock", "MemoryStore", "StoreFactory", "check_store"]

#: Makes a fresh, empty, unopened store.
StoreFactory = Callable[[], Store]


class FakeClock:
    """A clock for tests: starts at ``start`` and moves only by :meth:`advance`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        self._now = when


# -- the conformance suite ------------------------------------------------------

T0 = 1_700_000_000.0


@asynccontextmanager
async def _opened(make_store: StoreFactory) -> Any:
    store = make_store()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _team(tx: Tx, name: str = "alpha") -> None:
    tx.insert_team(Team(name, T0, {"k": 1}))
    for who in ("user", "a", "b", "c"):
        tx.insert_member(Member(name, who, MemberKind.LLM, T0, f"hash-{name}-{who}"))


def _msg(
    mid: str, sender: str = "a", to: str = "b", team: str = "alpha", text: str = "hi"
) -> Message:
    return Message(
        team=team,
        message_id=mid,
        sender=sender,
        to=to,
        text=text,
        kind=MessageKind.DIRECT,
        created_at=T0,
        fingerprint=f"fp-{mid}",
        summary=None,
        meta={"n": mid},
    )


async def check_teams_and_members(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
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
    async with _opened(make_store) as store:
        await store.transact(_team)
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


async def check_send_and_history(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        m = _msg("m1", to="*")
        copies = await store.transact(
            lambda tx: tx.insert_message(m, [Recipient("b"), Recipient("c", "sess-c")])
        )
        assert [d.recipient for d in copies] == [Recipient("b"), Recipient("c", "sess-c")]
        assert copies[0].seq < copies[1].seq
        assert all(d.state is DeliveryState.QUEUED and d.attempts == 0 for d in copies)
        assert await store.read(lambda tx: tx.get_message("alpha", "m1")) == m
        try:
            await store.transact(lambda tx: tx.insert_message(_msg("m1"), [Recipient("b")]))
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
        note = DeliveryEvent("m1", "c", T0 + 1, "reaction", "+1")
        await store.transact(lambda tx: tx.add_history("alpha", note))
        hist = await store.read(lambda tx: tx.history("alpha", "m1"))
        assert hist[-1] == note
        states = await store.read(lambda tx: [d.state for d in tx.deliveries("alpha", "m1")])
        assert states == [DeliveryState.QUEUED, DeliveryState.QUEUED]


async def check_lease_order_and_filters(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        for i in range(5):
            session = "s-b" if i == 2 else None
            await store.transact(
                lambda tx, i=i, session=session: tx.insert_message(
                    _msg(f"m{i}"), [Recipient("b", session)]
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
        await store.transact(lambda tx: tx.insert_message(_msg("m5"), [Recipient("b", "s-b")]))
        await store.transact(lambda tx: tx.insert_message(_msg("m6"), [Recipient("b")]))
        pinned = await store.transact(
            lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 10, include_unpinned=False)
        )
        assert [g.message.message_id for g in pinned] == ["m5"]
        assert await store.transact(lambda tx: tx.lease("alpha", "c", None, T0, T0 + 60, 10)) == []
        states = await store.read(lambda tx: tx.deliveries("alpha", "m0"))
        assert states[0].state is DeliveryState.LEASED and states[0].lease_until == T0 + 60
        hist = await store.read(lambda tx: tx.history("alpha", "m0"))
        assert [e.event for e in hist] == ["queued", "leased"]


async def check_concurrent_leases_never_overlap(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        for i in range(60):
            await store.transact(
                lambda tx, i=i: tx.insert_message(_msg(f"m{i:03}"), [Recipient("b")])
            )

        async def take() -> list[str]:
            got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 7))
            return [g.message.message_id for g in got]

        batches = await asyncio.gather(*(take() for _ in range(12)))
        seen = [mid for b in batches for mid in b]
        assert len(seen) == len(set(seen)) == 60, "each delivery is handed out once"
        for b in batches:
            assert b == sorted(b), "a batch is in send order"


async def check_ack(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        for i in range(3):
            await store.transact(lambda tx, i=i: tx.insert_message(_msg(f"m{i}"), [Recipient("b")]))
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


async def check_expiry_and_transitions(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        for i in range(3):
            await store.transact(lambda tx, i=i: tx.insert_message(_msg(f"m{i}"), [Recipient("b")]))
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


async def check_atomicity(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)

        def half_done(tx: Tx) -> None:
            tx.insert_team(Team("gamma", T0))
            tx.insert_message(_msg("lost"), [Recipient("b")])
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
            store.transact(lambda tx: tx.insert_message(_msg("ok1"), [Recipient("b")])),
            store.transact(half_done),
            store.transact(lambda tx: tx.insert_message(_msg("ok2"), [Recipient("b")])),
            return_exceptions=True,
        )
        assert isinstance(results[1], RuntimeError)
        got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 1, 5))
        # concurrent functions commit in some order; both of them, and nothing else
        assert sorted(g.message.message_id for g in got) == ["ok1", "ok2"]


async def check_many_concurrent_writers(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        n = 300
        await asyncio.gather(
            *(
                store.transact(
                    lambda tx, i=i: tx.insert_message(
                        _msg(f"c{i:04}", text=str(i)), [Recipient("c")]
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
    async with _opened(make_store) as store:
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
    async with _opened(make_store) as store:
        e1 = LedgerEntry("alpha", "s1", "b", "d1", "m1", T0)
        e2 = LedgerEntry("alpha", "s1", "*", "d2", "m2", T0 + 1)
        e3 = LedgerEntry("alpha", "s2", "b", "d1", "m3", T0)
        await store.transact(lambda tx: (tx.ledger_add(e1), tx.ledger_add(e2), tx.ledger_add(e3)))
        assert await store.read(lambda tx: tx.ledger("alpha", "s1")) == [e1, e2]
        assert await store.transact(lambda tx: tx.ledger_clear("alpha", "s1")) == 2
        assert await store.read(lambda tx: tx.ledger("alpha", "s1")) == []
        assert await store.read(lambda tx: tx.ledger("alpha", "s2")) == [e3]
        assert await store.transact(lambda tx: tx.ledger_clear("alpha", "s1")) == 0


async def check_jobs(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        assert await store.read(lambda tx: tx.next_job_due()) is None
        late = Job("alpha", "timer", T0 + 50, T0, "s1", {"note": "later"})
        soon = Job("alpha", "timer", T0 + 10, T0, "s1", {"note": "soon"})
        other = Job("beta", "checkpoint", T0 + 20, T0, "s9")
        jid_late = await store.transact(lambda tx: tx.add_job(late))
        jid_soon = await store.transact(lambda tx: tx.add_job(soon))
        jid_other = await store.transact(lambda tx: tx.add_job(other))
        assert len({jid_late, jid_soon, jid_other}) == 3
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


async def check_links(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        first = Link("alpha", "l1", "a", "a-1", "b", None, 8, T0)
        assert await store.transact(lambda tx: tx.insert_link(first)) == first
        rival = Link("alpha", "l2", "b", "b-1", "a", None, 3, T0 + 1)
        kept = await store.transact(lambda tx: tx.insert_link(rival))
        assert kept == first, "one open link per member pair, whoever sends first"
        assert await store.read(lambda tx: tx.get_link("alpha", "l2")) is None
        assert await store.read(lambda tx: tx.find_open_link("alpha", "b", "a")) == first
        assert await store.read(lambda tx: tx.find_open_link("beta", "a", "b")) is None
        used = Link(
            "alpha",
            "l1",
            "a",
            "a-1",
            "b",
            "b-1",
            8,
            T0,
            LinkState.OPEN,
            3,
            None,
            None,
            ({"at": T0, "event": "opened"}, {"at": T0 + 1, "event": "crossing", "n": 1}),
        )
        await store.transact(lambda tx: tx.update_link(used))
        assert await store.read(lambda tx: tx.get_link("alpha", "l1")) == used
        closed = Link(
            "alpha",
            "l1",
            "a",
            "a-1",
            "b",
            "b-1",
            8,
            T0,
            LinkState.CLOSED,
            8,
            T0 + 9,
            "budget_exhausted",
        )
        await store.transact(lambda tx: tx.update_link(closed))
        assert await store.read(lambda tx: tx.find_open_link("alpha", "a", "b")) is None
        again = Link("alpha", "l3", "b", "b-2", "a", None, 8, T0 + 10)
        assert await store.transact(lambda tx: tx.insert_link(again)) == again
        other = Link("alpha", "l4", "a", "a-1", "c", None, 8, T0 + 11)
        await store.transact(lambda tx: tx.insert_link(other))
        every = await store.read(lambda tx: [x.link_id for x in tx.list_links("alpha")])
        assert every == ["l1", "l3", "l4"]
        of_c = await store.read(lambda tx: [x.link_id for x in tx.list_links("alpha", member="c")])
        assert of_c == ["l4"]
        of_a = await store.read(lambda tx: [x.link_id for x in tx.list_links("alpha", member="a")])
        assert of_a == ["l1", "l3", "l4"], "as initiator and as responder, oldest first"
        open_a = await store.read(
            lambda tx: [x.link_id for x in tx.list_links("alpha", member="a", open_only=True)]
        )
        assert open_a == ["l3", "l4"]
        live = await store.read(
            lambda tx: [x.link_id for x in tx.list_links("alpha", open_only=True)]
        )
        assert live == ["l3", "l4"]

        async def race(i: int) -> Link:
            link = Link("alpha", f"r{i}", "x", f"x-{i}", "y", None, 8, T0)
            won: Link = await store.transact(lambda tx: tx.insert_link(link))
            return won

        winners = await asyncio.gather(*(race(i) for i in range(20)))
        assert len({w.link_id for w in winners}) == 1


async def check_delegations_and_tokens(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        d1 = Delegation(
            "alpha",
            "d1",
            Route.LOCAL,
            "lead",
            "lead-s",
            "tu_1",
            "w",
            "count",
            T0,
            T0 + 300,
            "lead-s#1",
            callee_session="lead-s--tu_1",
        )
        d2 = Delegation(
            "alpha",
            "d2",
            Route.INBOUND,
            "hubA",
            "remote-s",
            "tu_9",
            "w",
            "list",
            T0 + 1,
            T0 + 60,
            "remote-s#4",
            reply_service="hubA",
            reply_token="tok",
        )
        await store.transact(lambda tx: (tx.insert_delegation(d1), tx.insert_delegation(d2)))
        assert await store.read(lambda tx: tx.get_delegation("alpha", "d2")) == d2
        clash = Delegation(
            "alpha", "d3", Route.LOCAL, "lead", "lead-s", "tu_1", "w", "x", T0, T0, "lead-s#1"
        )
        try:
            await store.transact(lambda tx: tx.insert_delegation(clash))
        except AlreadyExists:
            pass
        else:
            raise AssertionError("one delegation per (caller_session, tool_use_id)")
        by_call = await store.read(
            lambda tx: tx.find_delegation("alpha", caller_session="lead-s", tool_use_id="tu_1")
        )
        assert by_call == d1
        by_callee = await store.read(
            lambda tx: tx.find_delegation("alpha", callee_session="lead-s--tu_1")
        )
        assert by_callee == d1
        assert (
            await store.read(lambda tx: tx.find_delegation("beta", callee_session="lead-s--tu_1"))
            is None
        )
        done = Delegation(
            **{
                **_fields(d1),
                "state": DelegationState.ANSWERED,
                "result": "42",
                "answered_at": T0 + 5,
            }
        )
        await store.transact(lambda tx: tx.update_delegation(done))
        assert await store.read(lambda tx: tx.get_delegation("alpha", "d1")) == done
        batch = await store.read(
            lambda tx: [d.delegation_id for d in tx.list_delegations("alpha", batch="lead-s#1")]
        )
        assert batch == ["d1"]
        mine = await store.read(
            lambda tx: [d.delegation_id for d in tx.list_delegations("alpha", member="w")]
        )
        assert mine == ["d1", "d2"]
        assert await store.transact(lambda tx: tx.spend_token("jti-1", T0 + 60)) is True
        assert await store.transact(lambda tx: tx.spend_token("jti-1", T0 + 60)) is False
        job = Job("alpha", "outbox", T0 + 1, T0, None, {"attempt": 0})
        jid = await store.transact(lambda tx: tx.add_job(job))
        assert await store.transact(lambda tx: tx.reschedule_job(jid, T0 + 9, {"attempt": 1}))
        moved = await store.read(lambda tx: tx.get_job("alpha", jid))
        assert moved is not None
        assert (moved.due_at, dict(moved.payload)) == (T0 + 9, {"attempt": 1})
        await store.transact(lambda tx: tx.finish_job(jid, JobState.DONE, T0 + 10))
        assert not await store.transact(lambda tx: tx.reschedule_job(jid, T0 + 20, {}))
        # a session answering several: the one still waiting comes first
        d4 = Delegation(
            **{**_fields(d1), "delegation_id": "d4", "tool_use_id": "tu_4", "created_at": T0 + 2}
        )
        await store.transact(lambda tx: tx.insert_delegation(d4))
        by_callee = await store.read(
            lambda tx: tx.find_delegation("alpha", callee_session="lead-s--tu_1")
        )
        assert by_callee == d4
        # pruning: d1 ended at T0+5, d2 (inbound) at T0+30; d4 is pending
        d2_done = Delegation(
            **{**_fields(d2), "state": DelegationState.ANSWERED, "answered_at": T0 + 30}
        )
        await store.transact(lambda tx: tx.update_delegation(d2_done))
        prune = await store.transact(
            lambda tx: tx.prune_delegations("alpha", ended_before=T0 + 100, expired_before=T0 + 400)
        )
        assert prune == 1, "d1 shares its batch with the pending d4: only d2 goes"
        left = await store.read(lambda tx: [d.delegation_id for d in tx.list_delegations("alpha")])
        assert left == ["d1", "d4"]
        d4_done = Delegation(
            **{**_fields(d4), "state": DelegationState.FAILED, "answered_at": T0 + 6}
        )
        await store.transact(lambda tx: tx.update_delegation(d4_done))
        kept = await store.transact(
            lambda tx: tx.prune_delegations("alpha", ended_before=T0 + 4, expired_before=T0 + 400)
        )
        assert kept == 0, "d1 and d4 ended after ended_before"
        kept = await store.transact(
            lambda tx: tx.prune_delegations("alpha", ended_before=T0 + 100, expired_before=T0 + 300)
        )
        assert kept == 0, "a reply token for d1 and d4 may still come (deadline T0+300)"
        gone = await store.transact(
            lambda tx: tx.prune_delegations("alpha", ended_before=T0 + 100, expired_before=T0 + 301)
        )
        assert gone == 2
        assert await store.read(lambda tx: tx.list_delegations("alpha")) == []
        await store.transact(lambda tx: tx.spend_token("jti-2", T0 + 90))
        assert await store.transact(lambda tx: tx.prune_spent_tokens(T0 + 60)) == 1
        assert await store.transact(lambda tx: tx.spend_token("jti-1", T0 + 60)) is True
        assert await store.transact(lambda tx: tx.spend_token("jti-2", T0 + 90)) is False


async def check_compaction(make_store: StoreFactory) -> None:
    """Retention removes old acked and dead messages with their history, in bounded
    steps, and never a message a recipient is still waiting for."""
    import dataclasses

    async with _opened(make_store) as store:
        await store.transact(_team)
        for i in range(6):
            msg = dataclasses.replace(_msg(f"m{i}"), created_at=T0 + i)
            await store.transact(lambda tx, msg=msg: tx.insert_message(msg, [Recipient("b")]))
        # m0-m3 are received; m0, m1 and m3 acked; m2 goes dead; m4 stays queued
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 4))
        await store.transact(lambda tx: tx.ack("alpha", "b", ["m0", "m1", "m3"], T0 + 1))
        await store.transact(
            lambda tx: tx.transition(
                "alpha",
                "m2",
                "b",
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DEAD,
                now=T0 + 2,
                event="dead",
                dead_reason="gave up",
            )
        )
        done = Job("alpha", "timer", T0, T0, None, {})
        jid = await store.transact(lambda tx: tx.add_job(done))
        await store.transact(lambda tx: tx.finish_job(jid, JobState.DONE, T0 + 1))
        pending = Job("alpha", "timer", T0 + 99, T0, None, {})
        pid = await store.transact(lambda tx: tx.add_job(pending))

        # m0..m4 are older than the cut-off (m5 is not); two at a time
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, 0.0, 2))
        assert (gone, last) == (2, T0 + 1), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, T0 + 1.5, 2))
        assert (gone, last) == (2, T0 + 3), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, T0 + 3.5, 2))
        assert (gone, last) == (0, None), "m4 is still queued: kept"
        for mid in ("m0", "m1", "m2", "m3"):
            assert await store.read(lambda tx, mid=mid: tx.get_message("alpha", mid)) is None
            assert await store.read(lambda tx, mid=mid: tx.deliveries("alpha", mid)) == []
            assert await store.read(lambda tx, mid=mid: tx.history("alpha", mid)) == []
        for mid in ("m4", "m5"):
            assert await store.read(lambda tx, mid=mid: tx.get_message("alpha", mid)) is not None
        assert await store.read(lambda tx: tx.pending_count("alpha", "b")) == 2
        assert await store.read(lambda tx: tx.get_job("alpha", jid)) is None
        assert await store.read(lambda tx: tx.get_job("alpha", pid)) is not None


async def check_budgets_and_chains(make_store: StoreFactory) -> None:
    import dataclasses

    async with _opened(make_store) as store:
        await store.transact(_team)
        m = dataclasses.replace(_msg("c1"), chain_id="chain-x", hop=3)
        await store.transact(lambda tx: tx.insert_message(m, [Recipient("b")]))
        assert await store.read(lambda tx: tx.get_message("alpha", "c1")) == m
        got = await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 10))
        assert [(x.message.chain_id, x.message.hop) for x in got] == [("chain-x", 3)]
        assert await store.read(lambda tx: tx.get_budget("alpha", "pair:a|b")) is None
        pair = Budget("alpha", "pair:a|b", T0, used=2, last_from="a", updated_at=T0)
        await store.transact(lambda tx: tx.put_budget(pair))
        assert await store.read(lambda tx: tx.get_budget("alpha", "pair:a|b")) == pair
        spent = dataclasses.replace(pair, used=3, granted=1, stopped_at=T0 + 1, last_from="b")
        chain = Budget("alpha", "chain:chain-x", T0, used=9, updated_at=T0)
        await store.transact(lambda tx: (tx.put_budget(spent), tx.put_budget(chain)))
        assert await store.read(lambda tx: tx.list_budgets("alpha")) == [chain, spent]
        assert await store.read(lambda tx: tx.list_budgets("beta")) == []


async def check_credentials_and_removal(make_store: StoreFactory) -> None:
    async with _opened(make_store) as store:
        await store.transact(_team)
        await store.transact(lambda tx: _team(tx, "beta"))
        assert await store.transact(lambda tx: tx.set_token_hash("alpha", "b", "new-hash"))
        assert not await store.transact(lambda tx: tx.set_token_hash("alpha", "zed", "x"))
        assert await store.read(lambda tx: tx.member_by_token_hash("hash-alpha-b")) is None
        found = await store.read(lambda tx: tx.member_by_token_hash("new-hash"))
        assert found is not None and (found.name, found.token_hash) == ("b", "new-hash")

        def rotate_and_fail(tx: Tx) -> None:
            tx.set_token_hash("alpha", "c", "lost-hash")
            raise RuntimeError("boom")

        with suppress(RuntimeError):
            await store.transact(rotate_and_fail)
        assert await store.read(lambda tx: tx.member_by_token_hash("lost-hash")) is None
        assert await store.read(lambda tx: tx.member_by_token_hash("hash-alpha-c")) is not None

        def fill(tx: Tx) -> None:
            for i in range(5):
                tx.insert_message(_msg(f"q{i}"), [Recipient("b")])
                tx.insert_message(_msg(f"q{i}", team="beta"), [Recipient("b")])

        await store.transact(fill)
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 30, 2))
        await store.transact(lambda tx: tx.ack("alpha", "b", ["q0"], T0))
        assert await store.read(lambda tx: tx.queued_count("alpha", "b", 100)) == 3
        assert await store.read(lambda tx: tx.queued_count("alpha", "b", 2)) == 2
        assert await store.read(lambda tx: tx.queued_count("alpha", "c", 100)) == 0
        left = await store.read(lambda tx: tx.undelivered("alpha", "b", 100))
        assert [(d.message_id, d.state) for d in left] == [
            ("q1", DeliveryState.LEASED),
            ("q2", DeliveryState.QUEUED),
            ("q3", DeliveryState.QUEUED),
            ("q4", DeliveryState.QUEUED),
        ]
        assert [
            d.message_id for d in await store.read(lambda tx: tx.undelivered("alpha", "b", 2))
        ] == [
            "q1",
            "q2",
        ]
        assert await store.transact(lambda tx: tx.delete_member("alpha", "b"))
        assert not await store.transact(lambda tx: tx.delete_member("alpha", "b"))
        assert await store.read(lambda tx: tx.get_member("alpha", "b")) is None
        assert await store.read(lambda tx: tx.member_by_token_hash("new-hash")) is None
        assert await store.read(lambda tx: tx.get_message("alpha", "q3")) is not None
        timers = [Job("alpha", "timer", T0 + i, T0, "s1") for i in range(4)]
        await store.transact(lambda tx: [tx.add_job(j) for j in timers])
        await store.transact(lambda tx: tx.add_job(Job("alpha", "other", T0, T0, "s1")))
        first = await store.read(lambda tx: tx.list_jobs("alpha", session_id="s1", kind="timer"))
        await store.transact(lambda tx: tx.finish_job(first[0].job_id, JobState.CANCELLED, T0))
        assert await store.read(lambda tx: tx.count_jobs("alpha", "s1", "timer", 100)) == 3
        assert await store.read(lambda tx: tx.count_jobs("alpha", "s1", "timer", 2)) == 2
        assert await store.read(lambda tx: tx.count_jobs("alpha", "s2", "timer", 100)) == 0
        ev = SessionEvent("alpha", "s1", 1, T0, EventKind.THOUGHT, "x")
        await store.transact(
            lambda tx: (tx.append_event(ev), tx.add_job(Job("alpha", "t", T0, T0)))
        )
        await store.transact(
            lambda tx: tx.put_budget(Budget("alpha", "pair:a|c", T0, used=1, updated_at=T0))
        )
        assert await store.transact(lambda tx: tx.delete_team("alpha")) == 4
        assert await store.read(lambda tx: tx.list_budgets("alpha")) == []
        assert await store.read(lambda tx: tx.get_team("alpha")) is None
        assert await store.read(lambda tx: tx.list_members("alpha")) == []
        assert await store.read(lambda tx: tx.member_by_token_hash("hash-alpha-a")) is None
        assert await store.read(lambda tx: tx.get_message("alpha", "q3")) is None
        assert await store.read(lambda tx: tx.feed("alpha", 0, 10)) == []
        assert await store.read(lambda tx: tx.list_events("alpha", "s1", 0, None, 10)) == []
        assert await store.read(lambda tx: tx.next_job_due()) is None
        assert await store.read(lambda tx: tx.queued_count("beta", "b", 100)) == 5
        assert await store.read(lambda tx: tx.member_by_token_hash("hash-beta-b")) is not None


async def check_a2a_tasks(make_store: StoreFactory) -> None:
    from backchannel.types import A2ATask

    async with _opened(make_store) as store:
        a = A2ATask("alpha", "t1", "w", "lead", "c1", "working", '{"id":"t1"}', T0, T0)
        b = A2ATask("alpha", "t2", "w", "lead", "c1", "completed", '{"id":"t2"}', T0, T0 + 1)
        other = A2ATask("alpha", "t3", "w", "rev", "c2", "working", "{}", T0, T0 + 2)
        beta = A2ATask("beta", "t4", "w", "lead", "c3", "working", "{}", T0, T0 + 3)
        await store.transact(lambda tx: [tx.put_a2a_task(t) for t in (a, b, other, beta)])
        assert await store.read(lambda tx: tx.get_a2a_task("alpha", "t1")) == a
        assert await store.read(lambda tx: tx.get_a2a_task("beta", "t1")) is None
        mine = await store.read(lambda tx: tx.list_a2a_tasks("alpha", "w", "lead"))
        assert [t.task_id for t in mine] == ["t2", "t1"], "newest update first, owner only"
        done = A2ATask("alpha", "t1", "w", "lead", "c1", "completed", '{"x":1}', T0, T0 + 5)
        await store.transact(lambda tx: tx.put_a2a_task(done))
        assert await store.read(lambda tx: tx.get_a2a_task("alpha", "t1")) == done
        mine = await store.read(lambda tx: tx.list_a2a_tasks("alpha", "w", "lead"))
        assert [t.task_id for t in mine] == ["t1", "t2"]

        def fail(tx: Tx) -> None:
            tx.put_a2a_task(A2ATask("alpha", "t9", "w", "lead", "c", "working", "{}", T0, T0))
            raise RuntimeError("boom")

        try:
            await store.transact(fail)
        except RuntimeError as exc:
            assert str(exc) == "boom"
        else:
            raise AssertionError("the function's exception must propagate")
        assert await store.read(lambda tx: tx.get_a2a_task("alpha", "t9")) is None


def _fields(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


async def check_inbox_cursor(make_store: StoreFactory) -> None:
    """The read cursor of inbox files: idempotent records, activity per sender, forgetting."""
    from backchannel.types import InboxEntry, MemberActivity

    def entry(eid: str, sender: str, kind: str, at: float, **kw: Any) -> InboxEntry:
        return InboxEntry("alpha", kw.pop("inbox", "t/lead"), eid, sender, kind, at, T0, **kw)

    async with _opened(make_store) as store:
        first = [
            entry("e1", "a", "message", T0 + 1),
            entry("e2", "a", "idle_notification", T0 + 5),
            entry("e3", "b", "message", T0 + 2),
            entry("e4", "b", "shutdown_approved", T0 + 3, terminates=True),
            entry("e5", "c", "hub", T0 + 9),
            entry("e6", "c", "skipped", T0 + 9, inbox="t/user"),
        ]
        await store.transact(lambda tx: tx.inbox_record(first))
        again = [entry("e1", "z", "message", T0 + 99)]  # the same id again: kept as it was
        await store.transact(lambda tx: tx.inbox_record(again))
        ids = ["e1", "e5", "e6", "nope"]
        assert await store.read(lambda tx: tx.inbox_known("alpha", "t/lead", ids)) == {"e1", "e5"}
        assert await store.read(lambda tx: tx.inbox_known("beta", "t/lead", ids)) == set()
        assert await store.read(lambda tx: tx.inbox_known("alpha", "t/user", ids)) == {"e6"}
        many = [f"x{i}" for i in range(1200)]  # past any one-statement parameter limit
        assert await store.read(lambda tx: tx.inbox_known("alpha", "t/lead", many)) == set()
        assert await store.read(lambda tx: tx.inbox_activity("alpha")) == [
            MemberActivity("alpha", "a", T0 + 5, "idle_notification", None),
            MemberActivity("alpha", "b", T0 + 3, "shutdown_approved", T0 + 3),
        ]
        assert await store.read(lambda tx: tx.inbox_activity("beta")) == []
        forgot = await store.transact(lambda tx: tx.inbox_forget("alpha", "t/lead", T0 + 1, {"e2"}))
        assert forgot == 4  # e1, e3, e4, e5; e2 is still in the file
        left = await store.read(lambda tx: tx.inbox_known("alpha", "t/lead", ["e1", "e2"]))
        assert left == {"e2"}
        assert await store.transact(lambda tx: tx.inbox_forget("alpha", "t/lead", T0, set())) == 0


STORE_CHECKS: list[Callable[[StoreFactory], Awaitable[None]]] = [
    check_compaction,
    check_teams_and_members,
    check_sessions,
    check_send_and_history,
    check_lease_order_and_filters,
    check_concurrent_leases_never_overlap,
    check_ack,
    check_expiry_and_transitions,
    check_atomicity,
    check_many_concurrent_writers,
    check_transcripts,
    check_ledger,
    check_jobs,
    check_links,
    check_delegations_and_tokens,
    check_inbox_cursor,
    check_budgets_and_chains,
    check_credentials_and_removal,
    check_a2a_tasks,
    check_dispatch_ownership,
    check_requeue_leased,
]


async def check_store(make_store: StoreFactory) -> None:
    """Run every conformance check against stores made by ``make_store``; raise
    ``AssertionError`` at the first guarantee that does not hold."""
    for check in STORE_CHECKS:
        await check(make_store)
