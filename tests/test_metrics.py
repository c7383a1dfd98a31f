"""``GET /metrics`` and ``serve --log-format json`` on a real ``serve``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backchannel.testing import eventually_blocking
from tests.conftest import Server, start_server


@pytest.fixture
def strict_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", None, "--max-attempts", "1", "--log-format", "json")
    try:
        yield srv
    finally:
        srv.stop()


def samples(srv: Server) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with srv.client() as c:
        r = c.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_what_operators_watch(strict_server: Server) -> None:
    srv = strict_server
    tok = srv.team("ops", "a", "b", "idle")
    with httpx.Client(base_url=srv.url, timeout=30) as h:
        assert h.get("/metrics").status_code == 401
        assert h.get("/metrics", headers={"Authorization": f"Bearer {tok['a']}"}).status_code == 401
    a, b = srv.client(tok["a"]), srv.client(tok["b"])
    with a, b:
        # one send, received and acked: one latency observation, queue back to 0
        assert a.post("/v1/messages", json={"to": "b", "text": "one"}).status_code == 201
        assert samples(srv)[("backchannel_queue_depth", (("member", "b"), ("team", "ops")))] == 1
        got = b.get("/v1/inbox").json()["messages"]
        b.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        # one send left to lapse: with --max-attempts 1 it is a dead letter
        dead = a.post("/v1/messages", json={"to": "b", "text": "lapse"}).json()["message_id"]

        def lapsed() -> bool:
            b.get("/v1/inbox", params={"lease": 0.1})  # leased, never acked
            return bool(a.get(f"/v1/messages/{dead}").json()["status"] == "dead")

        eventually_blocking(lapsed, what="the lapsed copy is given up on", within=20)
        # a link crossing: a's turn sends to b (opening a link), its output crosses at stop
        b.post("/v1/sessions", json={"session_id": "b-1"})
        a.post("/v1/sessions", json={"session_id": "a-1"})
        a.post("/v1/sessions/a-1/events", json={"kind": "turn_start", "text": "go"})
        a.post("/v1/messages", json={"to": "b", "text": "start", "from_session": "a-1"})
        stop = a.post("/v1/sessions/a-1/events", json={"kind": "agent_stop", "text": "my output"})
        assert [c["to"] for c in stop.json()["crossed"]] == ["b"]
        a.post(
            "/v1/timers", json={"intent": "anchor", "minutes": 30, "note": "n", "session": "a-1"}
        )

        # a long poll held open is an open connection
        def hold() -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                c.get(
                    "/v1/inbox",
                    params={"wait": 5},
                    headers={"Authorization": f"Bearer {tok['idle']}"},
                )

        poll = threading.Thread(target=hold)
        poll.start()
        try:
            eventually_blocking(
                lambda: samples(srv)[("backchannel_open_connections", ())] >= 2,
                what="poll open",
                within=20,
            )
        finally:
            poll.join()
    m = samples(srv)
    assert m[("backchannel_delivery_latency_seconds_count", (("team", "ops"),))] == 1
    assert m[("backchannel_dead_letters_total", (("team", "ops"),))] == 1
    assert m[("backchannel_link_crossings", (("team", "ops"),))] == 1
    assert m[("backchannel_timer_lateness_seconds", (("team", "ops"),))] == 0
    assert m[("backchannel_outbox_retries", (("team", "ops"),))] == 0
    assert m[("backchannel_queue_depth", (("member", "b"), ("team", "ops")))] >= 1  # b's link copy
    assert m[("backchannel_messages_sent_total", (("kind", "direct"), ("team", "ops")))] >= 3


def test_json_logs_are_one_object_per_line(strict_server: Server) -> None:
    srv = strict_server
    tok = srv.team("logs", "a")
    with srv.client(tok["a"]) as a:
        r = a.post("/v1/hooks/claude-code", content=b"not json")
        assert r.status_code == 200
    log = srv.home / "serve.log"
    eventually_blocking(
        lambda: "backchannel" in log.read_text().split("listening", 1)[-1],
        what="a log line",
        within=20,
    )
    lines = [x for x in log.read_text().splitlines() if x.startswith("{")]
    assert lines, log.read_text()
    entries = [json.loads(x) for x in lines]
    assert {"ts", "level", "logger", "message"} <= entries[0].keys()


async def _linked_team(hub: object) -> None:
    """Team ``t``: a, b and c each sent to the others in a turn (three links, three
    crossings), and a holds three timers, the first due 50 s ago once 120 s pass."""
    from backchannel.hub import Hub

    assert isinstance(hub, Hub)
    await hub.create_team("t", settings={"anchor_policy": "off"})
    for m in ("a", "b", "c"):
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")
        await hub.report_event("t", m, f"{m}-s", "turn_start")
    for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
        await hub.send("t", x, y, f"{x} to {y}", sender_session=f"{x}-s")
    for m in ("a", "b", "c"):
        await hub.report_event("t", m, f"{m}-s", "agent_stop", f"{m} is done")
    for seconds in (70, 90, 600):
        await hub.set_timer("t", "a", "a-s", "check", seconds, f"in {seconds}", target="b")


def _gauge(reg: object, name: str) -> float:
    from prometheus_client import CollectorRegistry

    assert isinstance(reg, CollectorRegistry)
    value = reg.get_sample_value(name, {"team": "t"})
    assert value is not None, name
    return value


async def test_the_snapshot_counts_in_the_store_on_every_store(make_store: object) -> None:
    from backchannel.hub import Hub
    from backchannel.interfaces.metrics import snapshot
    from backchannel.testing import FakeClock

    assert callable(make_store)
    clock = FakeClock()
    async with Hub(make_store(), clock=clock, background=False) as hub:
        await _linked_team(hub)
        crossed = sum(x.turns_used for x in await hub.list_links("t"))
        assert crossed > 0
        clock.advance(120)
        reg = await snapshot(hub)
        assert _gauge(reg, "backchannel_link_crossings") == crossed
        assert _gauge(reg, "backchannel_timer_lateness_seconds") == pytest.approx(50)


async def test_the_snapshot_reads_no_link_and_one_timer(tmp_path: Path) -> None:
    """``/metrics`` is answered from a sum of the links' crossings and the first timer
    due, not by reading every link and pending job of every team (a team may hold
    twenty thousand links and as many timers)."""
    import re

    from backchannel.hub import Hub
    from backchannel.interfaces.metrics import snapshot
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import FakeClock

    seen: list[str] = []
    clock = FakeClock()
    store = SqliteStore(tmp_path / "hub.db", on_statement=seen.append)
    async with Hub(store, clock=clock, background=False) as hub:
        await _linked_team(hub)
        seen.clear()
        await snapshot(hub)
    reads = [" ".join(s.split()) for s in seen]
    rows_of_links = [s for s in reads if re.search(r"SELECT .*link_id.* FROM links", s)]
    assert not rows_of_links, rows_of_links
    jobs = [s for s in reads if "FROM jobs WHERE team = " in s]
    assert jobs and all(" AND kind = " in s for s in jobs), jobs  # never every job
    (timers,) = [s for s in jobs if "kind = 'timer'" in s]
    assert timers.endswith("LIMIT 1"), timers  # the timer first due, alone


async def _crowd(hub: object, members: int) -> None:
    """Team ``t`` with ``members`` members m000...: m000 sent each of the others one
    message and every third one two; m001 acked its copies; nobody else took any."""
    from backchannel.hub import Hub

    assert isinstance(hub, Hub)
    await hub.create_team("t", settings={"anchor_policy": "off"})
    names = [f"m{i:03}" for i in range(members)]
    for m in names:
        await hub.add_member("t", m)
    for i, m in enumerate(names[1:], start=1):
        for n in range(2 if i % 3 == 0 else 1):
            await hub.send("t", names[0], m, f"to {m} #{n}", link=False)
    got = await hub.receive("t", "m001", limit=10)
    await hub.ack("t", "m001", [g.message.message_id for g in got])


async def test_queue_depth_is_counted_per_member_in_one_read(make_store: object) -> None:
    """Each member's queue depth is right, on every store, from one grouped count: a
    member with copies waiting shows how many, and one with none (all acked, or never
    sent to) still shows 0, as the gauge always did."""
    from prometheus_client import CollectorRegistry

    from backchannel.hub import Hub
    from backchannel.interfaces.metrics import snapshot
    from backchannel.testing import FakeClock

    assert callable(make_store)
    async with Hub(make_store(), clock=FakeClock(), background=False) as hub:
        await _crowd(hub, 8)
        reg = await snapshot(hub)
    assert isinstance(reg, CollectorRegistry)
    depths = {
        s.labels["member"]: s.value
        for family in reg.collect()
        if family.name == "backchannel_queue_depth"
        for s in family.samples
    }
    want = {f"m{i:03}": float(2 if i % 3 == 0 else 1) for i in range(8)}
    want.update({"m000": 0.0, "m001": 0.0, "user": 0.0})
    assert depths == want


async def test_a_scrape_costs_the_same_with_many_members(tmp_path: Path) -> None:
    """A scrape reads a team in a fixed number of statements however many members it
    has (a hub with two thousand members is scraped every 15 s), and none of them reads
    every copy ever delivered: the pending ones are counted from their own index."""
    from backchannel.hub import Hub
    from backchannel.interfaces.metrics import snapshot
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import FakeClock

    async def statements(members: int) -> list[str]:
        seen: list[str] = []
        store = SqliteStore(tmp_path / f"hub-{members}.db", on_statement=seen.append)
        async with Hub(store, clock=FakeClock(), background=False) as hub:
            await _crowd(hub, members)
            seen.clear()
            await snapshot(hub)
        # the reads alone: a PRAGMA checking the reader's cache comes when it comes
        return [" ".join(s.split()) for s in seen if s.lstrip().startswith("SELECT")]

    few, many = await statements(4), await statements(60)
    assert len(many) == len(few), (len(few), len(many), many)
    counts = [s for s in many if "FROM deliveries" in s]
    assert len(counts) == 1 and "GROUP BY member" in counts[0], counts


async def test_a_scrape_reads_no_callback_post(tmp_path: Path) -> None:
    """The retries of pending callback posts are summed in the store: a post's payload
    carries the answer it delivers (up to the message size limit), and a scrape every
    15 s during an outage that piled up posts must not read them all out."""
    from backchannel.hub import Hub
    from backchannel.hub.outbox import OUTBOX_JOB
    from backchannel.interfaces.metrics import snapshot
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import FakeClock
    from backchannel.types import Job

    seen: list[str] = []
    clock = FakeClock()
    store = SqliteStore(tmp_path / "hub.db", on_statement=seen.append)
    async with Hub(store, clock=clock, background=False) as hub:
        await hub.create_team("t")
        body = {"text": "an answer " * 1000}
        for attempt in (0, 2, 5):
            job = Job("t", OUTBOX_JOB, clock.now() + 3600, clock.now(), None,
                      {"attempt": attempt, "body": body})  # fmt: skip
            await hub.store.transact(lambda tx, job=job: tx.add_job(job))
        seen.clear()
        reg = await snapshot(hub)
    assert _gauge(reg, "backchannel_outbox_retries") == 7
    reads = [" ".join(s.split()) for s in seen]
    posts = [s for s in reads if "'outbox'" in s]
    assert posts and not [s for s in posts if "SELECT team, kind," in s], posts  # no row out
