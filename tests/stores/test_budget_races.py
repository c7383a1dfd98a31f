"""Budgets under concurrent sends: two hubs on one store (two SQLite writers on one file,
two PostgreSQL pools on one database) send between the same two agents at the same
moment. Whatever the interleaving, the exchanges that passed, in the order the store
committed them, are exactly what the pair's record counts, never past its budget, and
the sends past it were refused; a chain's last hop is announced once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backchannel.errors import BudgetExhausted
from backchannel.hub import Hub
from backchannel.stores.base import Store
from backchannel.stores.postgres import PostgresStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.types import MessageKind
from tests.pg_harness import PgServer

PAIR_BUDGET = 12
ROUNDS = 40


async def _race_pair(stores: list[Store]) -> None:
    hubs = [Hub(s, background=False) for s in stores]
    for hub in hubs:
        await hub.start()
    try:
        one = hubs[0]
        await one.create_team("t", settings={"anchor_policy": "off", "pair_budget": PAIR_BUDGET})
        await one.add_member("t", "a")
        await one.add_member("t", "b")
        passed = refused = 0

        async def send(hub: Hub, frm: str, to: str, i: int) -> None:
            nonlocal passed, refused
            try:
                await hub.send("t", frm, to, f"{frm} {i}", link=False)
                passed += 1
            except BudgetExhausted:
                refused += 1

        for i in range(ROUNDS):
            # a→b on one hub and b→a on the other, at the same moment, every round
            await asyncio.gather(send(hubs[0], "a", "b", i), send(hubs[1], "b", "a", i))
        feed = [item.message for item in await one.feed("t", 0, 100_000)]
        sent = [m for m in feed if m is not None and m.kind is MessageKind.DIRECT]
        sent = [m for m in sent if m.sender in ("a", "b") and m.to in ("a", "b")]
        exchanges, last = 0, None
        for m in sent:  # in the order the store committed them
            if m.sender != last:
                exchanges, last = exchanges + 1, m.sender
        [budget] = [b for b in await one.list_budgets("t") if b["scope"] == "pair"]
        assert len(sent) == passed and passed + refused == 2 * ROUNDS
        assert exchanges == budget["used"] == PAIR_BUDGET, (exchanges, budget)
        assert refused > 0
    finally:
        for hub in hubs:
            await hub.close()


async def _race_chain(stores: list[Store]) -> None:
    """b's turn at the hop before the chain budget sends to a and to c at once, one send
    on each hub: both reach the budget (siblings at it pass), the human is told once, and
    the turns on them can send nothing further."""
    hubs = [Hub(s, background=False) for s in stores]
    for hub in hubs:
        await hub.start()
    try:
        one = hubs[0]
        await one.create_team("t", settings={"anchor_policy": "off", "chain_budget": 2})
        for n in ("a", "b", "c"):
            await one.add_member("t", n)
            await one.open_session("t", n, f"{n}-s")
        start = await one.send("t", "user", "a", "start")
        await one.receive("t", "a", session="a-s")
        await one.report_event("t", "a", "a-s", "turn_start", "[From user] start")
        await one.send("t", "a", "b", "over to you", sender_session="a-s", link=False)
        await one.report_event("t", "a", "a-s", "agent_stop", "")
        got = await one.receive("t", "b", session="b-s")
        await one.report_event("t", "b", "b-s", "turn_start", got[0].message.text)
        sent = await asyncio.gather(
            hubs[0].send("t", "b", "a", "to a", sender_session="b-s", link=False),
            hubs[1].send("t", "b", "c", "to c", sender_session="b-s", link=False),
        )
        for r in sent:
            m = (await one.message_status("t", r.message_id)).message
            assert (m.chain_id, m.hop) == (start.message_id, 2)
        told = [
            g.message
            for g in await one.receive("t", "user", limit=100)
            if g.message.meta.get("budget") == "chain"
        ]
        assert len(told) == 1, [m.text for m in told]
        for n, peer in (("a", "c"), ("c", "a")):
            got = await hubs[1].receive("t", n, session=f"{n}-s", limit=10)
            await hubs[1].report_event(
                "t", n, f"{n}-s", "turn_start", "\n".join(g.message.text for g in got)
            )
            with pytest.raises(BudgetExhausted):
                await hubs[1].send("t", n, peer, "further", sender_session=f"{n}-s", link=False)
    finally:
        for hub in hubs:
            await hub.close()


async def test_two_sqlite_writers_on_one_file_count_each_exchange_once(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    await _race_pair([SqliteStore(path), SqliteStore(path)])


async def test_two_sqlite_writers_on_one_file_announce_a_chain_stop_once(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    await _race_chain([SqliteStore(path), SqliteStore(path)])


@pytest.mark.slow
@pytest.mark.postgres
async def test_two_postgres_hubs_on_one_database_announce_a_chain_stop_once(
    postgres_server: PgServer,
) -> None:
    url = postgres_server.new_database("chain_race")
    await _race_chain([PostgresStore(url), PostgresStore(url)])


@pytest.mark.slow
@pytest.mark.postgres
async def test_two_postgres_hubs_on_one_database_count_each_exchange_once(
    postgres_server: PgServer,
) -> None:
    url = postgres_server.new_database("budget_race")
    await _race_pair([PostgresStore(url), PostgresStore(url)])
