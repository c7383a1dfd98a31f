"""What the store checks share: a factory type, a fixed time, a seeded team."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from backchannel.stores.base import Store, Tx
from backchannel.types import Member, MemberKind, Message, MessageKind, Team

#: Makes a fresh, empty, unopened store.
StoreFactory = Callable[[], Store]

T0 = 1_700_000_000.0


@asynccontextmanager
async def opened(make_store: StoreFactory) -> Any:
    # typed loosely on purpose: the checks call the store through lambdas mypy cannot type
    store = make_store()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def seed_team(tx: Tx, name: str = "alpha") -> None:
    tx.insert_team(Team(name, T0, {"k": 1}))
    for who in ("user", "a", "b", "c"):
        tx.insert_member(Member(name, who, MemberKind.LLM, T0, f"hash-{name}-{who}"))


def make_msg(
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


def fields_of(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
