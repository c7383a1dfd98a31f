"""Conformance checks for the push-delivery ownership lease (part of
:data:`backchannel.testing.STORE_CHECKS`): ``claim_dispatch``, ``release_dispatch``,
``dispatch_owner`` and ``requeue_leased``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backchannel.stores.base import Store, Tx
from backchannel.types import (
    DeliveryState,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Team,
)

__all__ = ["check_dispatch_ownership", "check_requeue_leased"]

T0 = 1_700_000_000.0


def _setup(tx: Tx) -> None:
    tx.insert_team(Team("alpha", T0, {}))
    for who in ("a", "b", "c"):
        tx.insert_member(Member("alpha", who, MemberKind.LLM, T0, f"hash-dispatch-{who}"))


def _msg(mid: str) -> Message:
    return Message(
        team="alpha",
        message_id=mid,
        sender="a",
        to="b",
        text=f"text of {mid}",
        kind=MessageKind.DIRECT,
        created_at=T0,
        fingerprint=f"fp-{mid}",
        summary=None,
        meta={},
    )


class _Abort(RuntimeError):
    pass


async def check_dispatch_ownership(make_store: Callable[[], Store]) -> None:
    store = make_store()
    await store.open()
    try:
        await store.transact(_setup)

        async def claim(owner: str, now: float, until: float, member: str = "b") -> bool:
            return await store.transact(
                lambda tx: tx.claim_dispatch("alpha", member, owner, now, until)
            )

        async def owner_of(member: str = "b") -> tuple[str, float] | None:
            return await store.read(lambda tx: tx.dispatch_owner("alpha", member))

        assert await owner_of() is None
        assert await claim("hub-1", T0, T0 + 10)
        assert await owner_of() == ("hub-1", T0 + 10)
        # another hub cannot take a live lease, and writes nothing trying
        assert not await claim("hub-2", T0 + 5, T0 + 15)
        assert await owner_of() == ("hub-1", T0 + 10)
        # the owner renews
        assert await claim("hub-1", T0 + 5, T0 + 15)
        assert await owner_of() == ("hub-1", T0 + 15)
        # members are independent
        assert await claim("hub-2", T0 + 5, T0 + 15, member="c")
        assert await owner_of("c") == ("hub-2", T0 + 15)
        # once the lease runs out (at lease_until), another hub takes it over
        assert not await claim("hub-2", T0 + 14.9, T0 + 25)
        assert await claim("hub-2", T0 + 15, T0 + 25)
        assert await owner_of() == ("hub-2", T0 + 25)
        # the old owner's renewal now fails: it lost the lease
        assert not await claim("hub-1", T0 + 16, T0 + 26)
        # release: only by the owner, and then anyone may claim at once
        assert not await store.transact(lambda tx: tx.release_dispatch("alpha", "b", "hub-1"))
        assert await store.transact(lambda tx: tx.release_dispatch("alpha", "b", "hub-2"))
        assert await owner_of() is None
        assert await claim("hub-1", T0 + 16, T0 + 26)

        # a claim in a transaction that fails is not held
        def claim_then_fail(tx: Tx) -> None:
            assert tx.claim_dispatch("alpha", "a", "hub-3", T0, T0 + 10)
            raise _Abort("rolled back")

        try:
            await store.transact(claim_then_fail)
        except _Abort:
            pass
        else:
            raise AssertionError("the transaction should have raised")
        assert await owner_of("a") is None

        # concurrent claims of a free member: exactly one wins
        won = await asyncio.gather(
            *(claim(f"racer-{i}", T0 + 20, T0 + 30, member="a") for i in range(8))
        )
        assert sum(won) == 1, won
        winner = f"racer-{won.index(True)}"
        assert await owner_of("a") == (winner, T0 + 30)
    finally:
        await store.close()


async def check_requeue_leased(make_store: Callable[[], Store]) -> None:
    store = make_store()
    await store.open()
    try:
        await store.transact(_setup)
        for i in range(4):
            mid = f"m{i}"
            await store.transact(lambda tx, m=mid: tx.insert_message(_msg(m), [Recipient("b")]))  # type: ignore[misc]
        await store.transact(lambda tx: tx.insert_message(_msg("p4"), [Recipient("b", "s-b")]))
        await store.transact(lambda tx: tx.insert_message(_msg("x5"), [Recipient("c")]))
        await store.transact(lambda tx: tx.lease("alpha", "b", None, T0, T0 + 60, 2))
        await store.transact(
            lambda tx: tx.lease("alpha", "b", "s-b", T0, T0 + 60, 10, include_unpinned=False)
        )
        await store.transact(lambda tx: tx.lease("alpha", "c", None, T0, T0 + 60, 10))
        got = await store.transact(lambda tx: tx.requeue_leased("alpha", "b", T0 + 1, "moved"))
        # every leased copy of the member, pinned or not, lowest seq first; m2, m3 were queued
        assert got == ["m0", "m1", "p4"], got
        for mid in got:
            copies = await store.read(lambda tx, m=mid: tx.deliveries("alpha", m))  # type: ignore[misc]
            d = copies[0]
            assert d.state is DeliveryState.QUEUED, d
            assert d.lease_until is None, d
            assert d.attempts == 1, "attempts are kept"
            hist = await store.read(lambda tx, m=mid: tx.history("alpha", m))  # type: ignore[misc]
            assert [(e.event, e.detail) for e in hist][-1] == ("released", "moved"), hist
        # another member's leases are not touched
        other = await store.read(lambda tx: tx.deliveries("alpha", "x5"))
        assert other[0].state is DeliveryState.LEASED
        assert await store.transact(lambda tx: tx.requeue_leased("alpha", "b", T0 + 2, "")) == []
        # the requeued copies go out again first, in send order
        again = await store.transact(lambda tx: tx.lease("alpha", "b", "s-b", T0 + 2, T0 + 60, 10))
        assert [(g.message.message_id, g.attempt) for g in again] == [
            ("m0", 2),
            ("m1", 2),
            ("m2", 1),
            ("m3", 1),
            ("p4", 2),
        ], again
    finally:
        await store.close()
