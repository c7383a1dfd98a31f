"""Every statement on the hot paths is served by an index, so cost stays flat as the hub
grows (a million stored messages, ten thousand sessions, twenty thousand links).

A hub on SQLite runs one of each thing an agent team does (sends with and without a
link, closing blocks, a broadcast, receive and ack, lease expiry, timers firing, a
delegation and its answer, a session ending) while the store reports every statement.
Each one is then explained on the same file, with the planner's default statistics:
what a real hub has, since nothing runs ANALYZE. A full scan of a table that grows, or a
sort of rows the table can hold without bound, fails the test with the statement and
its plan. On PostgreSQL the same is asked of the statements that differ most, with
sequential scans and sorts disabled: a "Seq Scan" or "Sort" left in the plan means no
index can serve it.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock
from backchannel.types import MESSAGE_ID_PATTERN

# tables whose row count grows with traffic, sessions or time
GROWING = (
    "messages",
    "deliveries",
    "delivery_events",
    "session_events",
    "ledger",
    "jobs",
    "links",
    "sessions",
    "delegations",
    "spent_tokens",
    "teams",
    "budgets",
)

# sorts that are bounded by something other than the table's size, each with the bound
BOUNDED_SORTS = {
    "FROM delegations WHERE team = ? AND batch = ?": "the delegations of one caller turn",
    "FROM ledger WHERE team = ? AND session_id = ?": "the texts one turn sent",
    "WHERE d.team = ? AND d.member = ? AND d.state = ? AND d.lease_holder = ?": (
        "what one named receive holds, in lease order: a stream's window of unacked "
        "messages, or a long-poll's one lease (each at most 1,000)"
    ),
}

# reads of one team's rows that stop after a bound, each with the bound
BOUNDED_TEAM_READS = {
    "FROM delivery_events WHERE team = ? ORDER BY id DESC LIMIT ? OFFSET ?": (
        "the latest events a dashboard keeps: as many index entries as the OFFSET"
    ),
    "FROM sessions WHERE team = ? ORDER BY created_at, session_id LIMIT ?": (
        "the first page of a team's sessions: as many index entries as the LIMIT"
    ),
    "FROM links WHERE team = ? ORDER BY created_at, link_id LIMIT ?": (
        "the first page of a team's links: as many index entries as the LIMIT"
    ),
    "FROM delegations WHERE team = ? ORDER BY created_at, delegation_id LIMIT ?": (
        "the first page of a team's delegations: as many index entries as the LIMIT"
    ),
    "FROM links WHERE team = ? AND state = ? ORDER BY created_at, link_id": (
        "the team's open links: the entries of links_team_open, an index of them alone"
    ),
    "FROM links WHERE team = ? AND state != ? ORDER BY created_at DESC, link_id DESC LIMIT ?": (
        "the dashboard's latest closed links: the LIMIT, and the open links among the latest"
    ),
    "SELECT member, count(*) FROM sessions WHERE team = ? GROUP BY member": (
        "the dashboard's count of each member's sessions: index entries alone, no row"
    ),
    "SELECT (SELECT count(*) FROM links WHERE team = ?) - (SELECT count(*) FROM links": (
        "the dashboard's count of closed links: index entries alone, no row"
    ),
    "FROM sessions WHERE team = ? AND state != ? ORDER BY created_at, session_id": (
        "the team's live sessions: the entries of sessions_team_live, an index of them alone"
    ),
    "FROM sessions WHERE team = ? AND state = ? ORDER BY created_at, session_id": (
        "the team's active sessions: the entries of sessions_team_active, of them alone"
    ),
    "FROM delegations WHERE team = ? AND state = ? ORDER BY created_at, delegation_id": (
        "the team's pending delegations: the entries of delegations_state for them alone"
    ),
    "FROM delegations WHERE team = ? AND state != ? ORDER BY created_at DESC,": (
        "the dashboard's latest finished delegations: the LIMIT, and the pending among them"
    ),
    "SELECT state, count(*) FROM delegations WHERE team = ? GROUP BY state": (
        "the dashboard's count of delegations by state: index entries alone, no row"
    ),
    "SELECT member, count(*) FROM deliveries WHERE team = ? AND state IN (?, ?) GROUP BY": (
        "/metrics' count of each member's pending copies: the entries of deliveries_open,"
        " an index of those copies alone (no acked or dead copy is read)"
    ),
    "FROM budgets WHERE team = ? AND ((substr(key, ?, ?) = ? AND (used >= ? + granted OR": (
        "the dashboard's budgets that need a human: the page's LIMIT read from "
        "budgets_recent backwards (besides, at most the team's pairs and members' records"
        " that need none), and their count from its entries alone, no row"
    ),
    "FROM budgets WHERE team = ? AND (key < ? OR key >= ?) ORDER BY key LIMIT ?": (
        "the first page of a team's used budgets: the LIMIT, and the one record per member"
        " of the chain it was handed last (the 'ctx:' keys, skipped in key order)"
    ),
}


def _normalize(sql: str) -> str:
    sql = re.sub(r"\s+", " ", sql.strip())
    sql = re.sub(r"'(?:[^']|'')*'", "?", sql)
    return re.sub(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", "?", sql)


class _Statements:
    """Collects each distinct statement shape once, with one concrete example."""

    def __init__(self) -> None:
        self.examples: dict[str, str] = {}

    def __call__(self, sql: str) -> None:
        if re.match(r"\s*(SELECT|UPDATE|DELETE)\b", sql, re.IGNORECASE):
            self.examples.setdefault(_normalize(sql), sql)


def _problems(db: Path, statements: dict[str, str]) -> list[str]:
    conn = sqlite3.connect(db)
    found = []
    try:
        for shape, example in sorted(statements.items()):
            plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + example)]
            for step in plan:
                scan = re.match(r"SCAN (\w+)(.*)", step)
                if scan and scan.group(1) in GROWING and "LIMIT" not in shape.upper():
                    found.append(f"full scan: {shape}\n    plan: {plan}")
                if "TEMP B-TREE" in step and not any(k in shape for k in BOUNDED_SORTS):
                    found.append(f"unbounded sort: {shape}\n    plan: {plan}")
                if scan and scan.group(1) in GROWING and "INDEX" not in scan.group(2):
                    found.append(f"table scan: {shape}\n    plan: {plan}")
                team_only = re.match(r"SEARCH (\w+) .*\(team=\?\)$", step)
                bounded = any(k in shape for k in BOUNDED_TEAM_READS)
                if team_only and team_only.group(1) in GROWING and not bounded:
                    found.append(f"whole-team search: {shape}\n    plan: {plan}")
    finally:
        conn.close()
    return sorted(set(found))


async def _team_day(hub: Hub, clock: FakeClock) -> None:
    """One of everything a team does, on every hot path."""
    await hub.create_team("t", settings={"anchor_policy": "off"})
    for m in ("lead", "a", "b", "counter"):
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")

    async def take(member: str, session: str | None = None) -> None:
        got = await hub.receive("t", member, session=session, limit=50)
        if got:
            await hub.ack("t", member, [g.message.message_id for g in got])

    for i in range(2):
        # a linked exchange with a closing block, a broadcast and an unlinked send
        await hub.report_event("t", "a", "a-s", "turn_start")
        await hub.send("t", "a", "b", f"question {i}", sender_session="a-s")
        await hub.report_event("t", "a", "a-s", "agent_stop", f"done {i}")
        await take("b", "b-s")
        await hub.report_event("t", "b", "b-s", "turn_start")
        await hub.report_event(
            "t", "b", "b-s", "agent_stop", f'answer {i} <message to="lead">fyi {i}</message>'
        )
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        await hub.report_event(
            "t", "lead", "lead-s", "agent_stop", f'<message to="*">all {i}</message>'
        )
        await hub.send("t", "user", "a", f"from the human {i}")
        await hub.send("t", "lead", "b", f"no link {i}", link=False)
        for m in ("a", "b", "lead", "counter"):
            await take(m, f"{m}-s")
        await take("user")

    # a lease that runs out, then its redelivery
    await hub.send("t", "lead", "a", "leased and dropped", link=False)
    await hub.receive("t", "a", session="a-s", limit=5)
    clock.advance(3600)
    await hub.maintain()
    await take("a", "a-s")

    # a receive its client named, made again after its answer was lost on the way
    await hub.send("t", "lead", "a", "named and answered twice", link=False)
    first = await hub.receive("t", "a", session="a-s", limit=5, receive_id="rcv-plans")
    again = await hub.receive("t", "a", session="a-s", limit=5, receive_id="rcv-plans")
    assert first and [g.message.message_id for g in again] == [g.message.message_id for g in first]
    await hub.ack("t", "a", [g.message.message_id for g in first])

    # timers: set, fire on the clock, cancel
    await hub.set_timer("t", "a", "a-s", "anchor", 60, "back to task 3")
    await hub.set_timer("t", "a", "a-s", "check", 60, "how is b", target="b")
    t = await hub.set_timer("t", "b", "b-s", "wait", 600, "the answer from a", target="a")
    # the timers a page at a time (GET /v1/timers, list_timers: the team's, a member's,
    # a session's, with the fired ones or not) and the dashboard's page in due order
    for pending_only in (True, False):
        await hub.list_timers("t", after=1, limit=2, pending_only=pending_only)
        await hub.list_timers("t", member="a", after=1, limit=2, pending_only=pending_only)
        await hub.list_timers("t", session_id="a-s", after=1, limit=2, pending_only=pending_only)
    await hub.timers_due("t", 1, 2)
    clock.advance(120)
    await hub.maintain()
    await hub.cancel_timer("t", "b", t.timer_id)
    await take("a", "a-s")

    # a delegation and its answer
    await hub.report_event("t", "lead", "lead-s", "turn_start")
    await hub.delegate("t", "lead", "lead-s", "counter", "count the files", tool_use_id="tu_1")
    await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
    # the delegations a page at a time (GET /v1/delegations: the team's, a member's,
    # those between two members)
    dels = await hub.list_delegations("t", limit=2)
    await hub.list_delegations("t", after=dels[0].delegation_id, limit=2)
    await hub.list_delegations("t", member="lead", after=dels[0].delegation_id, limit=2)
    await hub.list_delegations("t", member="lead", peer="counter", limit=2)
    await hub.list_delegations("t", pending_only=True, limit=2)  # backchannel run's count
    await hub.list_delegations("t", pending_only=True, after=dels[0].delegation_id, limit=2)
    # and the members (GET /v1/teams/{team}/members)
    await hub.list_members("t", limit=2)
    await hub.list_members("t", after="a", limit=2)
    # the teams and a team's budgets (GET /v1/teams, GET /v1/teams/{team}/budgets)
    await hub.list_teams(limit=2)
    await hub.list_teams(after="a", limit=2)
    await hub.list_budgets("t", limit=2)
    await hub.list_budgets("t", after="chain:", limit=2)
    await hub.budgets_for_human("t", limit=2)  # the dashboard's budgets panel
    for s in await hub.list_sessions("t", "counter"):
        got = await hub.receive("t", "counter", session=s.session_id, limit=5)
        for g in got:
            await hub.ack("t", "counter", [g.message.message_id])
            await hub.report_event("t", "counter", s.session_id, "turn_start", g.message.text)
            await hub.report_event("t", "counter", s.session_id, "agent_stop", "12 files")
    await hub.maintain()
    await take("lead", "lead-s")

    # the session lists a page at a time (GET /v1/sessions, a team's or a member's)
    first = await hub.list_sessions("t", limit=2)
    await hub.list_sessions("t", after=first[-1].session_id, limit=2)
    await hub.list_sessions("t", "a", after="a-s", limit=2)
    # and the links (GET /v1/links: the team's, a member's, the open ones)
    links = await hub.list_links("t", limit=2)
    for open_only in (False, True):
        await hub.list_links("t", after=links[0].link_id, limit=2, open_only=open_only)
        await hub.list_links("t", member="a", after=links[0].link_id, limit=2, open_only=open_only)

    # the dashboard's snapshot: each member's live and latest sessions, a count of all;
    # the open links, the latest closed ones, a count of those; "auto" delivery's read
    await hub.member_sessions("t", 20)
    await hub.links_overview("t", 50)
    await hub.delegations_overview("t", 50)
    await hub.delegations_overview("t", 50, member="lead")
    await hub.list_sessions("t", "a", which="live")
    # the team's live and active sessions (GET /v1/sessions?live_only, ?active_only: the
    # MCP server's list_members and check_inbox), a page and after it
    for which in ("live", "active"):
        await hub.list_sessions("t", which=which, limit=2)
        await hub.list_sessions("t", which=which, after="a-s", limit=2)
        await hub.list_sessions("t", which=which)

    await hub.terminate_session("t", "b", "b-s", "done")
    await hub.maintain()
    await hub.pending("t", "a")
    await hub.store.read(lambda tx: tx.pending_counts("t"))  # a /metrics scrape
    await hub.store.read(lambda tx: tx.pending_job_attempts("t", "outbox"))
    await hub.feed_start("t", 1000)  # a dashboard opening
    await hub.dead_letters("t", 50)  # its dead letters panel
    await hub.compact(clock.now())  # retention, with everything old enough


async def test_hot_paths_on_sqlite_use_indexes(tmp_path: Path, clock: FakeClock) -> None:
    seen = _Statements()
    db = tmp_path / "hub.db"
    store = SqliteStore(db, on_statement=seen)
    async with Hub(store, clock=clock, background=False, lease_seconds=30) as hub:
        await _team_day(hub, clock)
    assert len(seen.examples) > 30, "the workload should reach every hot path"
    problems = _problems(db, seen.examples)
    assert not problems, "\n".join(problems)
    # every id the hub minted on the way is one a client may send back (an ack, a status)
    with sqlite3.connect(db) as conn:
        ids = [r[0] for r in conn.execute("SELECT message_id FROM messages")]
    bad = [i for i in ids if not re.fullmatch(MESSAGE_ID_PATTERN, i)]
    assert ids and not bad, bad


async def _fill(db: Path, events: dict[str, int]) -> None:
    """Teams with that many history events each, written through the store in batches
    (broadcasts of ten copies, one ``queued`` event each), the teams interleaved."""
    from backchannel.testing._fixtures import make_msg
    from backchannel.types import Recipient, Team

    to = [Recipient(f"m{i}") for i in range(10)]
    async with SqliteStore(db) as store:
        for team in events:
            await store.transact(lambda tx, team=team: tx.insert_team(Team(team, 0.0)))
        left = dict(events)
        batch = 0
        while any(left.values()):
            for team, n in left.items():
                k = min(n // 10, 100)
                await store.transact(
                    lambda tx, team=team, k=k, b=batch: [
                        tx.insert_message(make_msg(f"{team}-{b}-{i}", team=team, to="*"), to)
                        for i in range(k)
                    ]
                )
                left[team] = n - k * 10
            batch += 1


def _steps(db: Path, sql: str, args: tuple[object, ...]) -> tuple[object, int]:
    """The answer to ``sql`` and how many SQLite virtual machine steps it took."""
    conn = sqlite3.connect(db)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    try:
        conn.set_progress_handler(count, 1)
        row = conn.execute(sql, args).fetchone()
    finally:
        conn.close()
    return row[0] if row else None, steps


async def test_where_a_teams_latest_events_begin_costs_what_it_returns(tmp_path: Path) -> None:
    """A dashboard opening asks where the latest 1,000 events of its team begin. SQLite
    answers from the (team, id) index read backwards, no matter how long the team's
    history: a team with 20,000 events costs what one with 1,500 does. Counting the
    team's events, which does read its history, shows the measure can tell."""
    from backchannel.stores.sqlite.tx import Q

    db = tmp_path / "hub.db"
    await _fill(db, {"big": 20_000, "small": 1_500})
    with sqlite3.connect(db) as conn:
        plan = [r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + Q.feed_start, ("big", 1000))]
        ids = {t: [r[0] for r in conn.execute(
            "SELECT id FROM delivery_events WHERE team = ? ORDER BY id", (t,))]
            for t in ("big", "small")}  # fmt: skip
    assert plan == ["SEARCH delivery_events USING COVERING INDEX delivery_events_team (team=?)"]
    assert len(ids["big"]) == 20_000 and len(ids["small"]) == 1_500
    big, big_steps = _steps(db, Q.feed_start, ("big", 1000))
    small, small_steps = _steps(db, Q.feed_start, ("small", 1000))
    assert big == ids["big"][-1001] and small == ids["small"][-1001]
    assert big_steps < small_steps * 1.5, (big_steps, small_steps)
    _, history_steps = _steps(db, "SELECT count(*) FROM delivery_events WHERE team = ?", ("big",))
    assert history_steps > big_steps * 5, (history_steps, big_steps)


async def test_counting_each_members_pending_copies_reads_no_acked_copy(
    tmp_path: Path,
) -> None:
    """``/metrics`` counts each member's pending copies on every scrape. A team whose
    20,000 copies are nearly all acked (a year of traffic) costs less to count than one
    with 1,500 pending: only the pending copies are read, from their own index, and
    counting every copy of the team, which reads them all, shows the measure can tell."""
    from backchannel.stores.sqlite.tx import Q

    db = tmp_path / "hub.db"
    await _fill(db, {"big": 20_000, "small": 1_500})
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE deliveries SET state = 'acked' WHERE team = 'big' AND seq % 100 != 0")
        counts = {
            t: dict(conn.execute(Q.pending_counts, (t,)).fetchall()) for t in ("big", "small")
        }
    assert sum(counts["big"].values()) == 200 and sum(counts["small"].values()) == 1_500
    assert sorted(counts["small"]) == [f"m{i}" for i in range(10)]
    _, big_steps = _steps(db, Q.pending_counts, ("big",))
    _, small_steps = _steps(db, Q.pending_counts, ("small",))
    assert big_steps < small_steps, (big_steps, small_steps)
    _, every_steps = _steps(db, "SELECT count(*) FROM deliveries WHERE team = ?", ("big",))
    assert every_steps > big_steps * 5, (every_steps, big_steps)


async def test_a_timer_is_found_by_its_request_id_in_one_index_search(
    tmp_path: Path, clock: FakeClock
) -> None:
    """``set_timer`` made again under its ``request_id`` finds the timer it set by that
    key: an index search on (team, session, kind, request_id), not a range of every
    timer the session set within the retention window, done and cancelled too."""
    seen = _Statements()
    db = tmp_path / "hub.db"
    async with Hub(SqliteStore(db, on_statement=seen), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "a")
        await hub.open_session("t", "a", "a-s")
        for i in range(3):
            await hub.set_timer("t", "a", "a-s", "anchor", 60, f"n{i}", request_id=f"r{i}")
            clock.advance(61)
            await hub.maintain()
        again = await hub.set_timer("t", "a", "a-s", "anchor", 60, "n1", request_id="r1")
        assert (again.note, again.state) == ("n1", "done")
    lookups = [sql for sql in seen.examples.values() if "request_id" in sql]
    assert lookups, "set_timer under a request_id should look it up by that key"
    with sqlite3.connect(db) as conn:
        plans = [[r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)] for sql in lookups]
    for plan in plans:
        assert len(plan) == 1 and "USING INDEX jobs_request" in plan[0], plans
        assert "request_id" in plan[0] or "json_extract" in plan[0] or "<expr>" in plan[0], plans


async def test_a_page_of_timers_costs_what_it_shows(tmp_path: Path) -> None:
    """A page of timers (``GET /v1/timers``, ``list_timers``: the team's, a member's, a
    session's) is read from an index in the order it is shown, and the dashboard's page
    in due order hands back the page and a count: a team holding 600 pending timers and
    300 cancelled ones costs what one holding 20 does, where sorting every timer of the
    team (what the hub did) costs ten times more."""
    from backchannel.interfaces.dashboard import timers_view

    seen: list[str] = []
    db = tmp_path / "hub.db"
    clock = FakeClock()
    async with Hub(SqliteStore(db, on_statement=seen.append), clock=clock, background=False) as hub:
        for team, n in (("small", 10), ("big", 300)):
            await hub.create_team(team, settings={"anchor_policy": "off", "max_timers": 1000})
            for m in ("a", "b", "c"):
                await hub.add_member(team, m)
                await hub.open_session(team, m, f"{m}-s")
            for i in range(n):
                for m in ("c", "a", "b"):
                    t = await hub.set_timer(team, m, f"{m}-s", "anchor", 60 + i, f"{m} {i}")
                    if m == "c":  # c's timers, cancelled: none of the pending pages
                        await hub.cancel_timer(team, "c", t.timer_id)

        async def cost(team: str, *reads: Callable[[], object]) -> tuple[int, int]:
            """The SQLite steps and the rows the store's reads of jobs took."""
            seen.clear()
            for read in reads:
                await read()  # type: ignore[misc]
            steps = rows = 0
            conn = sqlite3.connect(db)
            try:
                for sql in [s for s in seen if "FROM jobs" in s and s.startswith("SELECT")]:
                    n = 0

                    def count() -> int:
                        nonlocal n
                        n += 1
                        return 0

                    conn.set_progress_handler(count, 1)
                    rows += len(conn.execute(sql).fetchall())
                    steps += n
            finally:
                conn.close()
            return steps, rows

        def pages(team: str) -> list[Callable[[], object]]:
            return [
                lambda: hub.list_timers(team, limit=6),
                lambda: hub.list_timers(team, member="a", limit=6),
                lambda: hub.list_timers(team, session_id="b-s", limit=6),
                lambda: hub.list_timers(team, pending_only=False, after=3, limit=6),
            ]

        small_steps, small_rows = await cost("small", *pages("small"))
        big_steps, big_rows = await cost("big", *pages("big"))
        assert big_rows == small_rows == 24, (small_rows, big_rows)
        assert big_steps < small_steps * 1.5, (small_steps, big_steps)
        # every pending timer of the big team, sorted: what one page used to cost
        every, _ = await cost("big", lambda: hub.list_timers("big"))
        assert every > big_steps * 10, (every, big_steps)

        # the dashboard: the page and a count, not every pending timer of the team
        page, total = await timers_view(hub, "big", 4, 5)
        assert total == 600 and len(page) == 5
        assert [t["note"] for t in page] == ["a 2", "b 2", "a 3", "b 3", "a 4"]
        _, rows = await cost("big", lambda: timers_view(hub, "big", 4, 5))
        assert rows == 5 + 1, rows


async def test_the_budgets_panel_costs_what_it_shows(tmp_path: Path) -> None:
    """Spent chain budgets are kept for good. The dashboard's budgets panel (its
    snapshot every second, and its pages) read every budget of the team to keep the
    first page: a team with 3,000 spent chains read 3,000 records a second. It now reads
    the page from an index, the most recently updated first, and counts the rest from
    the index's entries alone: the page costs what it shows, whatever the history."""
    from backchannel.interfaces.dashboard import SNAPSHOT_PAGE, budgets_view
    from backchannel.types import Budget

    seen: list[str] = []
    db = tmp_path / "hub.db"
    clock = FakeClock()
    async with Hub(SqliteStore(db, on_statement=seen.append), clock=clock, background=False) as hub:
        now = clock.now()
        for team, n in (("small", 60), ("big", 3_000)):
            await hub.create_team(team, settings={"pair_budget": 2})
            for m in ("a", "b", "c"):
                await hub.add_member(team, m)

            def spend(tx: Any, team: str = team, n: int = n) -> None:
                for i in range(n):  # spent chains, the newest last
                    at = now - 10 * (n - i)
                    tx.put_budget(Budget(team, f"chain:c{i:05}", at, used=10_000, updated_at=at))
                # a spent pair, one in use and one whose window passed: the first shows
                tx.put_budget(Budget(team, "pair:a|b", now, used=2, updated_at=now - 5))
                tx.put_budget(Budget(team, "pair:a|c", now, used=1, updated_at=now - 1))
                tx.put_budget(Budget(team, "pair:b|c", now - 10**7, used=9, updated_at=now))

            await hub.store.transact(spend)

        async def cost(team: str) -> tuple[list[dict[str, Any]], int, int, int]:
            """The page, the rows the panel's reads of budgets returned, and the SQLite
            steps of the page's read (the count's apart)."""
            seen.clear()
            page, hidden = await budgets_view(hub, team)
            reads = [q for q in seen if "FROM budgets" in q and q.startswith("SELECT")]
            rows = steps = 0
            conn = sqlite3.connect(db)
            try:
                for sql in reads:
                    n = 0

                    def count() -> int:
                        nonlocal n
                        n += 1
                        return 0

                    conn.set_progress_handler(count, 1)
                    rows += len(conn.execute(sql).fetchall())
                    conn.set_progress_handler(None, 1)
                    if "count(*)" not in sql:
                        assert "LIMIT" in sql, sql
                        steps += n
                    else:
                        plan = [r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)]
                        assert plan == [
                            "SEARCH budgets USING COVERING INDEX budgets_recent (team=?)"
                        ], plan
            finally:
                conn.close()
            return page, hidden, rows, steps

        page, hidden, rows, small_steps = await cost("small")
        assert [b["key"] for b in page[:3]] == ["pair:a|b", "chain:c00059", "chain:c00058"]
        assert (len(page), hidden) == (SNAPSHOT_PAGE, 61 - SNAPSHOT_PAGE)
        page, hidden, rows, big_steps = await cost("big")
        assert [b["key"] for b in page[:2]] == ["pair:a|b", "chain:c02999"]
        assert (len(page), hidden) == (SNAPSHOT_PAGE, 3_001 - SNAPSHOT_PAGE)
        assert rows == SNAPSHOT_PAGE + 1, rows  # the page, and the count's one row
        assert big_steps < small_steps * 1.5, (small_steps, big_steps)
        # a later page is read from where it starts, the newest first
        later, hidden = await budgets_view(hub, "big", 3_000, 50)
        assert [b["key"] for b in later] == ["chain:c00000"] and hidden == 3_000


def test_the_check_catches_a_scan(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE deliveries (seq INTEGER PRIMARY KEY, state TEXT, lease_until REAL)")
    conn.execute(
        "CREATE TABLE links (team TEXT, link_id TEXT, a TEXT, PRIMARY KEY (team, link_id))"
    )
    conn.close()
    bad = "SELECT seq FROM deliveries WHERE state = 'leased' ORDER BY lease_until"
    team_wide = "SELECT link_id FROM links WHERE team = 't' AND a = 'x'"
    found = _problems(db, {_normalize(bad): bad, _normalize(team_wide): team_wide})
    assert any(p.startswith("table scan") for p in found), found
    assert any(p.startswith("unbounded sort") for p in found), found
    assert any(p.startswith("whole-team search") for p in found), found


# the statements the two stores write differently, each with the index that must serve it
PG_CHECKS = {
    "sessions_live": "SELECT session_id FROM sessions WHERE team = 't' AND member = 'a' "
    "AND state != 'terminated' ORDER BY created_at, session_id LIMIT 2",
    "sessions_active": "SELECT session_id FROM sessions WHERE team = 't' AND member = 'a' "
    "AND state = 'active' ORDER BY created_at, session_id LIMIT 2",
    "links_open_responder": "SELECT link_id FROM links WHERE team = 't' AND initiator = 'a' "
    "AND state = 'open' UNION ALL SELECT link_id FROM links WHERE team = 't' "
    "AND responder = 'a' AND initiator != 'a' AND state = 'open'",
    "jobs_session_pending": "SELECT job_id FROM jobs WHERE team = 't' AND session_id = 'a-s' "
    "AND kind = 'checkpoint' AND state = 'pending' ORDER BY due_at, job_id",
    "deliveries_leased": "SELECT seq FROM deliveries WHERE state = 'leased' "
    "AND lease_until <= 1e12 ORDER BY lease_until, seq LIMIT 500",
    "deliveries_queued": "SELECT seq FROM deliveries WHERE team = 't' AND member = 'a' "
    "AND state = 'queued' ORDER BY seq LIMIT 64",
    "deliveries_open": "SELECT count(*) FROM deliveries WHERE team = 't' AND member = 'a' "
    "AND state IN ('queued', 'leased')",
    "deliveries_holder": "SELECT seq FROM deliveries WHERE team = 't' AND member = 'a' "
    "AND state = 'leased' AND lease_holder = 'rcv-1' AND lease_until > 0 ORDER BY seq",
    "messages_created": "SELECT team, message_id FROM messages WHERE created_at < 1e12 "
    "AND (created_at, team, message_id) > (0, 't', 'm') "
    "ORDER BY created_at, team, message_id LIMIT 500",
    "jobs_finished": "DELETE FROM jobs WHERE state != 'pending' AND done_at < 1e12",
    "jobs_watch": "SELECT job_id FROM jobs WHERE team = 't' AND watch = 'a' "
    "AND state = 'pending' ORDER BY job_id",
    "jobs_request": "SELECT job_id FROM jobs WHERE team = 't' AND session_id = 'a-s' "
    "AND kind = 'timer' AND payload->>'request_id' = 'r1'",
    "jobs_kind_pending": "SELECT job_id FROM jobs WHERE team = 't' AND kind = 'prune' "
    "AND state = 'pending' ORDER BY due_at, job_id",
    "jobs_timers_pending": "SELECT job_id FROM jobs WHERE team = 't' AND kind = 'timer' "
    "AND state = 'pending' AND job_id > 5 ORDER BY job_id LIMIT 101",
    "jobs_timers": "SELECT job_id FROM jobs WHERE team = 't' AND kind = 'timer' "
    "AND job_id > 5 ORDER BY job_id LIMIT 101",
    "jobs_timers_member": "SELECT job_id FROM jobs WHERE team = 't' AND kind = 'timer' "
    "AND state = 'pending' AND (payload->>'member') = 'a' AND job_id > 5 "
    "ORDER BY job_id LIMIT 101",
    "jobs_timers_session": "SELECT job_id FROM jobs WHERE team = 't' AND kind = 'timer' "
    "AND session_id = 'a-s' AND job_id > 5 ORDER BY job_id LIMIT 101",
    "delivery_events_pkey": "SELECT id FROM delivery_events WHERE team = 't' "
    "ORDER BY id DESC LIMIT 1 OFFSET 1000",
    "deliveries_dead": "SELECT seq FROM deliveries WHERE team = 't' AND state = 'dead' "
    "ORDER BY updated_at DESC, seq DESC LIMIT 50",
    "sessions_team": "SELECT session_id FROM sessions WHERE team = 't' "
    "AND (created_at, session_id) > (0, 'a') ORDER BY created_at, session_id LIMIT 101",
    "links_team": "SELECT link_id FROM links WHERE team = 't' "
    "AND (created_at, link_id) > (0, 'l') ORDER BY created_at, link_id LIMIT 101",
    "links_team_open": "SELECT link_id FROM links WHERE team = 't' AND state = 'open' "
    "AND (created_at, link_id) > (0, 'l') ORDER BY created_at, link_id LIMIT 101",
    "members_pkey": "SELECT name FROM members WHERE team = 't' AND name > 'a' "
    "ORDER BY name LIMIT 101",
    "teams_pkey": "SELECT name FROM teams WHERE name > 'a' ORDER BY name LIMIT 101",
    "budgets_recent": "SELECT key FROM budgets WHERE team = 't' AND ((substr(key, 1, 6) = "
    "'chain:' AND (used >= 32 + granted OR granted > 0)) OR (substr(key, 1, 5) = 'pair:' "
    "AND window_start > 0 AND (used >= 24 + granted OR granted > 0))) "
    "ORDER BY updated_at DESC, key DESC LIMIT 51",
    "budgets_pkey": "SELECT key FROM budgets WHERE team = 't' AND key > 'chain:' "
    "AND (key < 'ctx:' OR key >= 'ctx;') ORDER BY key LIMIT 101",
    "delegations_team": "SELECT delegation_id FROM delegations WHERE team = 't' "
    "AND (created_at, delegation_id) > (0, 'd') ORDER BY created_at, delegation_id LIMIT 101",
    "delegations_callee_open": "SELECT delegation_id FROM delegations WHERE team = 't' "
    "AND callee_session = 'c-s' AND state IN ('pending', 'timed_out') "
    "ORDER BY created_at, delegation_id LIMIT 1",
    "sessions_team_live": "SELECT session_id FROM sessions WHERE team = 't' "
    "AND state != 'terminated' ORDER BY created_at, session_id LIMIT 101",
    "sessions_team_active": "SELECT session_id FROM sessions WHERE team = 't' "
    "AND (created_at, session_id) > (0, 'a') AND state = 'active' "
    "ORDER BY created_at, session_id LIMIT 101",
    "delegations_state": "SELECT delegation_id FROM delegations WHERE team = 't' "
    "AND state = 'pending' ORDER BY created_at, delegation_id",
}


# pages read in an index's order that more than one index can serve (a new database's
# statistics pick either): no sort and no sequential scan is what they must show
PG_ORDERED = {
    "a member's links, a page": "(SELECT link_id, created_at FROM links WHERE team = 't' "
    "AND initiator = 'a' AND (created_at, link_id) > (0, 'l') "
    "ORDER BY created_at, link_id LIMIT 101) UNION ALL (SELECT link_id, created_at "
    "FROM links WHERE team = 't' AND responder = 'a' AND initiator != 'a' "
    "AND (created_at, link_id) > (0, 'l') ORDER BY created_at, link_id LIMIT 101) "
    "ORDER BY created_at, link_id LIMIT 101",
    "a member's delegations, a page": "(SELECT delegation_id, created_at FROM delegations "
    "WHERE team = 't' AND caller = 'a' AND (created_at, delegation_id) > (0, 'd') "
    "ORDER BY created_at, delegation_id LIMIT 101) UNION ALL (SELECT delegation_id, "
    "created_at FROM delegations WHERE team = 't' AND callee = 'a' AND caller != 'a' "
    "AND (created_at, delegation_id) > (0, 'd') ORDER BY created_at, delegation_id "
    "LIMIT 101) ORDER BY created_at, delegation_id LIMIT 101",
    # the dashboard's snapshot
    "the latest finished delegations": "SELECT delegation_id FROM delegations "
    "WHERE team = 't' AND state != 'pending' ORDER BY created_at DESC, delegation_id DESC "
    "LIMIT 50",
    "a member's latest finished delegations": "(SELECT delegation_id, created_at "
    "FROM delegations WHERE team = 't' AND caller = 'a' AND state != 'pending' "
    "ORDER BY created_at DESC, delegation_id DESC LIMIT 50) UNION ALL (SELECT "
    "delegation_id, created_at FROM delegations WHERE team = 't' AND callee = 'a' "
    "AND caller != 'a' AND state != 'pending' ORDER BY created_at DESC, delegation_id DESC "
    "LIMIT 50) ORDER BY created_at DESC, delegation_id DESC LIMIT 50",
    "the count of delegations by state": "SELECT state, count(*) FROM delegations "
    "WHERE team = 't' GROUP BY state",
    "a member's latest sessions": "SELECT session_id FROM sessions WHERE team = 't' "
    "AND member = 'a' ORDER BY created_at DESC, session_id DESC LIMIT 20",
    "each member's count of sessions": "SELECT member, count(*) FROM sessions "
    "WHERE team = 't' GROUP BY member",
    "the latest closed links": "SELECT link_id FROM links WHERE team = 't' "
    "AND state != 'open' ORDER BY created_at DESC, link_id DESC LIMIT 50",
    "the count of closed links": "SELECT (SELECT count(*) FROM links WHERE team = 't') "
    "- (SELECT count(*) FROM links WHERE team = 't' AND state = 'open')",
    "each member's count of pending copies": "SELECT member, count(*) FROM deliveries "
    "WHERE team = 't' AND state IN ('queued', 'leased') GROUP BY member",
    "a member's sessions, a page": "SELECT session_id FROM sessions WHERE team = 't' "
    "AND member = 'a' AND (created_at, session_id) > (0, 'a') "
    "ORDER BY created_at, session_id LIMIT 101",
}


def _pg_plans(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        # and sorts: an index that gives the order the statement asks is chosen if it
        # exists, as the planner does once a table is big (its stats here are a new file's)
        conn.execute("SET enable_sort = off")
        return {
            index: "\n".join(row[0] for row in conn.execute(f"EXPLAIN {sql}"))  # type: ignore[arg-type]
            for index, sql in {**PG_CHECKS, **PG_ORDERED}.items()
        }


@pytest.mark.postgres
async def test_hot_paths_on_postgres_use_indexes(
    new_postgres_url: Callable[[], str], clock: FakeClock
) -> None:
    from backchannel.stores.postgres import PostgresStore

    url = new_postgres_url()
    async with Hub(PostgresStore(url), clock=clock, background=False, lease_seconds=30) as hub:
        await _team_day(hub, clock)
    plans = await asyncio.to_thread(_pg_plans, url)
    bad = [
        f"{index}: {plan}"
        for index, plan in plans.items()
        if "Seq Scan" in plan
        or (index in PG_CHECKS and ("Sort" in plan or index not in plan))
        # a Merge Append has a "Sort Key" (the order it keeps), but a Sort node sorts
        or (index in PG_ORDERED and re.search(r"Sort  \(", plan))
    ]
    assert not bad, "\n".join(bad)
