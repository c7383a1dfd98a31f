"""Store conformance, part two: links, delegations, retention, budgets, credentials,
A2A tasks and the inbox read cursor. Part one and the full list are in
:mod:`backchannel.testing.store_checks`."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

from backchannel.errors import AlreadyExists
from backchannel.stores.base import BudgetNeed, Tx
from backchannel.testing._fixtures import T0, StoreFactory, fields_of, make_msg, opened, seed_team
from backchannel.types import (
    Budget,
    Delegation,
    DelegationState,
    DeliveryState,
    EventKind,
    Job,
    JobState,
    Link,
    LinkState,
    Recipient,
    Route,
    SessionEvent,
)


async def check_links(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
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
        # the dashboard's: the latest closed links, newest first, and a count of them
        for i in (5, 6):
            done = Link("alpha", f"l{i}", "a", "a-1", f"p{i}", None, 8, T0 + i, LinkState.CLOSED)
            await store.transact(lambda tx, done=done: tx.insert_link(done))
        latest = await store.read(
            lambda tx: [x.link_id for x in tx.latest_closed_links("alpha", 2)]
        )
        assert latest == ["l6", "l5"], "newest first, the open l3 and l4 left out"
        assert await store.read(lambda tx: tx.latest_closed_links("beta", 2)) == []
        assert await store.read(lambda tx: tx.count_closed_links("alpha")) == 3
        assert await store.read(lambda tx: tx.count_closed_links("beta")) == 0

        async def race(i: int) -> Link:
            link = Link("alpha", f"r{i}", "x", f"x-{i}", "y", None, 8, T0)
            won: Link = await store.transact(lambda tx: tx.insert_link(link))
            return won

        winners = await asyncio.gather(*(race(i) for i in range(20)))
        assert len({w.link_id for w in winners}) == 1


async def check_delegations_and_tokens(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
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
                **fields_of(d1),
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

        def page(**kw: Any) -> Any:
            return store.read(
                lambda tx: [d.delegation_id for d in tx.list_delegations("alpha", **kw)]
            )

        # a page starts after the key of the page before, read in the order made, a
        # member's from both sides and, with a peer, only those between the two
        assert await page(limit=1) == ["d1"]
        assert await page(after=(T0, "d1"), limit=1) == ["d2"]
        assert await page(after=(T0 + 1, "d2"), limit=1) == []
        assert await page(member="w", after=(T0, "d1"), limit=5) == ["d2"]
        assert await page(member="lead", limit=5) == ["d1"]
        assert await page(member="w", peer="lead") == ["d1"]
        assert await page(member="w", peer="hubA", limit=5) == ["d2"]
        assert await page(member="lead", peer="hubA", limit=5) == []
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
            **{**fields_of(d1), "delegation_id": "d4", "tool_use_id": "tu_4", "created_at": T0 + 2}
        )
        await store.transact(lambda tx: tx.insert_delegation(d4))
        # one made after a page was read is on the next page, none before it moved
        assert await page(after=(T0 + 1, "d2"), limit=5) == ["d4"]
        assert await page(member="lead", after=(T0, "d1"), limit=1) == ["d4"]
        by_callee = await store.read(
            lambda tx: tx.find_delegation("alpha", callee_session="lead-s--tu_1")
        )
        assert by_callee == d4

        def by_state(**kw: Any) -> Any:
            return store.read(
                lambda tx: [d.delegation_id for d in tx.delegations_by_state("alpha", **kw)]
            )

        def counts(team: str = "alpha", **kw: Any) -> Any:
            return store.read(lambda tx: tx.count_delegations(team, **kw))

        # the dashboard's: the pending ones oldest first, the finished newest first, each
        # state counted, a member's from both sides
        assert await by_state(pending=True) == ["d2", "d4"]
        assert await by_state(pending=True, member="lead") == ["d4"]
        assert await by_state(pending=True, member="w", limit=1) == ["d2"]
        assert await by_state(pending=False) == ["d1"]
        assert await by_state(pending=False, member="hubA") == []
        assert await counts() == {"answered": 1, "pending": 2}
        assert await counts(member="w") == {"answered": 1, "pending": 2}
        assert await counts(member="lead") == {"answered": 1, "pending": 1}
        assert await counts(member="nobody") == {}
        assert await counts("beta") == {}
        assert await page(pending_only=True) == ["d2", "d4"]
        assert await page(pending_only=True, after=(T0 + 1, "d2")) == ["d4"]
        assert await page(pending_only=True, member="lead") == ["d4"]
        assert await page(pending_only=True, member="w", limit=1) == ["d2"]
        # pruning: d1 ended at T0+5, d2 (inbound) at T0+30; d4 is pending
        d2_done = Delegation(
            **{**fields_of(d2), "state": DelegationState.ANSWERED, "answered_at": T0 + 30}
        )
        await store.transact(lambda tx: tx.update_delegation(d2_done))
        assert await by_state(pending=False) == ["d2", "d1"]
        assert await by_state(pending=False, limit=1) == ["d2"]
        assert await by_state(pending=False, member="lead") == ["d1"]
        assert await by_state(pending=False, member="hubA", limit=5) == ["d2"]
        assert await by_state(pending=True) == ["d4"]
        assert await counts(member="hubA") == {"answered": 1}
        assert await page(pending_only=True) == ["d4"]
        prune = await store.transact(
            lambda tx: tx.prune_delegations("alpha", ended_before=T0 + 100, expired_before=T0 + 400)
        )
        assert prune == 1, "d1 shares its batch with the pending d4: only d2 goes"
        left = await store.read(lambda tx: [d.delegation_id for d in tx.list_delegations("alpha")])
        assert left == ["d1", "d4"]
        d4_done = Delegation(
            **{**fields_of(d4), "state": DelegationState.FAILED, "answered_at": T0 + 6}
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

    async with opened(make_store) as store:
        await store.transact(seed_team)
        for i in range(6):
            msg = dataclasses.replace(make_msg(f"m{i}"), created_at=T0 + i)
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

        feed = await store.read(lambda tx: tx.feed("alpha", 0, 100))
        top = max(c for c, e in feed if e.message_id in ("m0", "m1", "m2", "m3"))
        assert await store.read(lambda tx: tx.feed_removed("alpha")) == 0

        # m0..m4 are older than the cut-off (m5 is not); two at a time
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, None, 2))
        assert (gone, last) == (2, (T0 + 1, "alpha", "m1")), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, last, 2))
        assert (gone, last) == (2, (T0 + 3, "alpha", "m3")), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, last, 2))
        assert (gone, last) == (0, None), "m4 is still queued: kept"
        # the largest cursor removed: m2's death, the last event of what went
        assert await store.read(lambda tx: tx.feed_removed("alpha")) == top
        for mid in ("m0", "m1", "m2", "m3"):
            assert await store.read(lambda tx, mid=mid: tx.get_message("alpha", mid)) is None
            assert await store.read(lambda tx, mid=mid: tx.deliveries("alpha", mid)) == []
            assert await store.read(lambda tx, mid=mid: tx.history("alpha", mid)) == []
        for mid in ("m4", "m5"):
            assert await store.read(lambda tx, mid=mid: tx.get_message("alpha", mid)) is not None
        assert await store.read(lambda tx: tx.pending_count("alpha", "b")) == 2
        assert await store.read(lambda tx: tx.get_job("alpha", jid)) is None
        assert await store.read(lambda tx: tx.get_job("alpha", pid)) is not None

        # more messages of one moment than a call examines, all still waiting: each call
        # goes on after the last one it examined, never reads the same ones again
        for i in range(3):
            msg = dataclasses.replace(make_msg(f"s{i}"), created_at=T0 - 10)
            await store.transact(lambda tx, msg=msg: tx.insert_message(msg, [Recipient("b")]))
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, None, 2))
        assert (gone, last) == (0, (T0 - 10, "alpha", "s1")), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, last, 2))
        assert (gone, last) == (0, (T0 + 4, "alpha", "m4")), (gone, last)
        gone, last = await store.transact(lambda tx: tx.compact(T0 + 5, last, 2))
        assert (gone, last) == (0, None), (gone, last)


async def check_budgets_and_chains(make_store: StoreFactory) -> None:
    import dataclasses

    async with opened(make_store) as store:
        await store.transact(seed_team)
        m = dataclasses.replace(make_msg("c1"), chain_id="chain-x", hop=3)
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

        # the budgets that need a human, the most recently updated first: spent or
        # extended; a pair only while its window lasts; never a ctx: record
        extended = Budget("alpha", "chain:ext", T0, used=9, granted=4, updated_at=T0 + 3)
        fine = Budget("alpha", "chain:fine", T0, used=2, updated_at=T0 + 9)
        old = Budget("alpha", "pair:a|c", T0 - 10**6, used=9, updated_at=T0 + 8)
        ctx = Budget("alpha", "ctx:a", T0, used=99, updated_at=T0 + 7)
        more = [extended, fine, old, ctx]
        await store.transact(lambda tx: [tx.put_budget(b) for b in more])
        need = BudgetNeed(pair_budget=3, chain_budget=8, window_from=T0 - 100)
        every = await store.read(lambda tx: tx.budgets_for_human("alpha", need))
        assert [b.key for b in every] == ["chain:ext", "pair:a|b", "chain:chain-x"], every
        page = await store.read(lambda tx: tx.budgets_for_human("alpha", need, offset=1, limit=1))
        assert page == [spent]
        assert await store.read(lambda tx: tx.count_budgets_for_human("alpha", need)) == 3
        assert await store.read(lambda tx: tx.count_budgets_for_human("beta", need)) == 0


async def check_credentials_and_removal(make_store: StoreFactory) -> None:
    async with opened(make_store) as store:
        await store.transact(seed_team)
        await store.transact(lambda tx: seed_team(tx, "beta"))
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
                tx.insert_message(make_msg(f"q{i}"), [Recipient("b")])
                tx.insert_message(make_msg(f"q{i}", team="beta"), [Recipient("b")])

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

    async with opened(make_store) as store:
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


async def check_a2a_claims(make_store: StoreFactory) -> None:
    """The first claim on a message stands; a claim made in a transaction that fails is
    not kept; claims are per team and go with their team."""
    from backchannel.types import A2AClaim

    async with opened(make_store) as store:
        first = A2AClaim("alpha", "a2a-m1", "t1", "c1", T0)
        held = await store.transact(lambda tx: tx.claim_a2a_message(first))
        assert held == first
        late = A2AClaim("alpha", "a2a-m1", "t2", "c2", T0 + 1)
        assert await store.transact(lambda tx: tx.claim_a2a_message(late)) == first
        assert await store.read(lambda tx: tx.get_a2a_claim("alpha", "a2a-m1")) == first
        assert await store.read(lambda tx: tx.get_a2a_claim("beta", "a2a-m1")) is None
        beta = A2AClaim("beta", "a2a-m1", "t3", "c3", T0)
        assert await store.transact(lambda tx: tx.claim_a2a_message(beta)) == beta

        def fail(tx: Tx) -> None:
            tx.claim_a2a_message(A2AClaim("alpha", "a2a-m9", "t9", "c", T0))
            raise RuntimeError("boom")

        with suppress(RuntimeError):
            await store.transact(fail)
        assert await store.read(lambda tx: tx.get_a2a_claim("alpha", "a2a-m9")) is None
        await store.transact(lambda tx: tx.delete_team("alpha"))
        assert await store.read(lambda tx: tx.get_a2a_claim("alpha", "a2a-m1")) is None
        assert await store.read(lambda tx: tx.get_a2a_claim("beta", "a2a-m1")) == beta


async def check_inbox_cursor(make_store: StoreFactory) -> None:
    """The read cursor of inbox files: idempotent records, activity per sender, forgetting."""
    from backchannel.types import InboxEntry, MemberActivity

    def entry(eid: str, sender: str, kind: str, at: float, **kw: Any) -> InboxEntry:
        return InboxEntry("alpha", kw.pop("inbox", "t/lead"), eid, sender, kind, at, T0, **kw)

    async with opened(make_store) as store:
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
