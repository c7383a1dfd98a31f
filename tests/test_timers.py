"""Heartbeats: timers with intent, their breadcrumbs, durability, and the anchor rule."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from backchannel.errors import (
    AnchorRequired,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    UnknownRecipient,
)
from backchannel.hub import Hub
from backchannel.stores.base import Store
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import MessageKind


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A fresh store of ``kind``: memory, sqlite or postgres (a database of its own)."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp_path / "timers.db")
    from backchannel.stores.postgres import PostgresStore

    return PostgresStore(request.getfixturevalue("new_postgres_url")())


async def _team(hub: Hub, *members: str, policy: str = "enforce") -> None:
    await hub.create_team("t", settings={"anchor_policy": policy})
    for m in members:
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")


async def _take(hub: Hub, member: str) -> list[str]:
    got = await hub.receive("t", member, session=f"{member}-s", limit=100)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return [g.message.text for g in got if g.message.kind is MessageKind.TIMER]


async def test_anchor_fires_as_the_agents_breadcrumb(hub: Hub, clock: FakeClock) -> None:
    await _team(hub, "a")
    timer = await hub.set_timer(
        "t", "a", "a-s", "anchor", 600, "return to task 3 — implement the report generator"
    )
    assert (timer.intent, timer.due_at, timer.state) == ("anchor", clock.now() + 600, "pending")
    clock.advance(599)
    await hub.maintain()
    assert await _take(hub, "a") == []
    clock.advance(1)
    await hub.maintain()
    assert await _take(hub, "a") == ["ANCHOR: return to task 3 — implement the report generator"]
    clock.advance(10_000)
    await hub.maintain()
    assert await _take(hub, "a") == [], "a timer fires once"
    assert await hub.list_timers("t") == []


async def test_a_timer_set_again_under_its_request_id_is_set_once(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub, "a")
    first = await hub.set_timer("t", "a", "a-s", "anchor", 60, "the report", request_id="r1")
    clock.advance(60)
    await hub.maintain()  # fired before the set was made again: still the same timer
    again = await hub.set_timer("t", "a", "a-s", "anchor", 60, "the report", request_id="r1")
    assert (again.timer_id, again.state) == (first.timer_id, "done")
    assert await _take(hub, "a") == ["ANCHOR: the report"]
    assert [t.timer_id for t in await hub.list_timers("t", pending_only=False)] == [first.timer_id]
    with pytest.raises(Conflict, match="'r1' was already used for timer"):
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "another", request_id="r1")


async def test_check_timer_shows_the_peers_state_and_last_output(
    hub: Hub, clock: FakeClock
) -> None:
    await _team(hub, "lead", "w")
    await hub.report_event("t", "w", "w-s", "turn_start")
    await hub.report_event(
        "t", "w", "w-s", "agent_stop", "Counted 1,204 Python lines in src/ and 310 in tests/."
    )
    await hub.report_event("t", "w", "w-s", "turn_start")
    await hub.set_timer("t", "lead", "lead-s", "check", 60, "is the count done?", target="w")
    clock.advance(60)
    await hub.maintain()
    [text] = await _take(hub, "lead")
    assert text.splitlines() == [
        "CHECK: is the count done?",
        "w is active (session w-s, turn 2).",
        'Its last finished output began: "Counted 1,204 Python lines in src/ and 310 in tests/."',
    ]


async def _lead_waits_for_w_and_x(hub: Hub) -> None:
    """``lead`` sets a two-minute wait timer on each of ``w`` and ``x``."""
    await _team(hub, "lead", "w", "x", policy="off")
    await hub.set_timer("t", "lead", "lead-s", "wait", 120, "the reviewer's verdict", target="w")
    await hub.set_timer("t", "lead", "lead-s", "wait", 120, "x's numbers", target="x")


async def _fired(hub: Hub, clock: FakeClock, seconds: float, member: str = "lead") -> list[str]:
    """The timers' texts ``member`` gets once ``seconds`` passed and they fired."""
    clock.advance(seconds)
    await hub.maintain()
    return sorted(await _take(hub, member))


async def test_wait_timer_says_whether_the_peer_replied(hub: Hub, clock: FakeClock) -> None:
    await _lead_waits_for_w_and_x(hub)
    clock.advance(30)
    await hub.send("t", "w", "lead", "Verdict: the totals match.")
    await hub.send("t", "x", "user", "not for lead")
    texts = await _fired(hub, clock, 90)
    assert texts[0].splitlines() == [
        "WAIT: the reviewer's verdict",
        'w has replied since you set this timer (30 s after): "Verdict: the totals match."',
    ]
    assert texts[1].splitlines() == [
        "WAIT: x's numbers",
        "x has not replied since you set this timer (2 min ago).",
    ]


def _wait_lines(texts: list[str]) -> list[str]:
    [text] = texts
    return text.splitlines()


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_wait_timer_shows_the_first_reply_of_many(
    store: str, tmp_path: Path, clock: FakeClock
) -> None:
    made = MemoryStore() if store == "memory" else SqliteStore(tmp_path / "wait.db")
    async with Hub(made, clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "lead", "w", "x", policy="off")
        await hub.send("t", "w", "lead", "before the timer")
        await _take(hub, "lead")  # read: no reply to wait for
        clock.advance(1)
        await hub.set_timer("t", "lead", "lead-s", "wait", 120, "the verdict", target="w")
        clock.advance(10)
        await hub.send("t", "w", "x", "to someone else")
        await hub.send("t", "x", "lead", "from someone else")
        clock.advance(10)
        await hub.send("t", "w", "*", "the verdict, to everyone")
        clock.advance(10)
        await hub.send("t", "w", "lead", "a second word")
        clock.advance(90)
        await hub.maintain()
        assert _wait_lines(await _take(hub, "lead")) == [
            "WAIT: the verdict",
            'w has replied since you set this timer (20 s after): "the verdict, to everyone"',
        ]


async def test_a_reply_sent_as_the_timer_is_set_counts(tmp_path: Path, clock: FakeClock) -> None:
    """A reply created at the timer's moment but stored before it is found when the
    timer is stored."""
    async with Hub(SqliteStore(tmp_path / "early.db"), clock=clock, background=False) as hub:
        await _team(hub, "lead", "w", policy="off")
        await hub.send("t", "w", "lead", "already done")
        await hub.set_timer("t", "lead", "lead-s", "wait", 60, "the count", target="w")
        clock.advance(60)
        await hub.maintain()
        assert _wait_lines(await _take(hub, "lead")) == [
            "WAIT: the count",
            'w has replied since you set this timer (0 s after): "already done"',
        ]


async def test_a_reply_through_another_hub_on_the_same_file_counts(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "two.db"
    async with (
        Hub(SqliteStore(db), clock=clock, background=False) as one,
        Hub(SqliteStore(db), clock=clock, background=False) as two,
    ):
        await _team(one, "lead", "w", policy="off")
        await two.send("t", "w", "lead", "before: two's writer reads the team now")
        await _take(one, "lead")  # read: no reply to wait for
        clock.advance(1)
        await one.set_timer("t", "lead", "lead-s", "wait", 60, "the count", target="w")
        clock.advance(5)
        await two.send("t", "w", "lead", "sent through the other hub")
        clock.advance(55)
        await one.maintain()
        assert _wait_lines(await _take(one, "lead"))[1] == (
            'w has replied since you set this timer (5 s after): "sent through the other hub"'
        )


@pytest.mark.parametrize(
    "store", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_delegations_answer_is_the_callees_reply(
    store: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """The hub hands a delegation's answer over as its own tool result, not as a message
    from the callee; a wait timer on the callee notes the answer all the same. A callee
    that timed out did not reply."""
    async with Hub(_store(store, tmp_path, request), clock=clock, background=False) as hub:
        await _team(hub, "lead", "counter", "lister", policy="off")
        await hub.report_event("t", "lead", "lead-s", "turn_start", "count and list")
        await hub.delegate("t", "lead", "lead-s", "counter", "count the files", timeout_s=60)
        await hub.delegate("t", "lead", "lead-s", "lister", "list the files", timeout_s=60)
        await hub.set_timer("t", "lead", "lead-s", "wait", 120, "the count", target="counter")
        await hub.set_timer("t", "lead", "lead-s", "wait", 120, "the list", target="lister")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "waiting for both")
        clock.advance(20)
        [task] = [s for s in await hub.list_sessions("t", "counter") if s.session_id != "counter-s"]
        got = await hub.receive("t", "counter", session=task.session_id)
        await hub.ack("t", "counter", [g.message.message_id for g in got])
        await hub.report_event("t", "counter", task.session_id, "turn_start", "count the files")
        await hub.report_event("t", "counter", task.session_id, "agent_stop", "12 files.")
        clock.advance(40)  # the lister's deadline: the results go to lead now
        await hub.maintain()
        texts = await _fired(hub, clock, 60)
        assert [t.splitlines() for t in texts] == [
            [
                "WAIT: the count",
                'counter has replied since you set this timer (20 s after): "12 files."',
            ],
            ["WAIT: the list", "lister has not replied since you set this timer (2 min ago)."],
        ]


async def test_a_timer_due_mid_turn_waits_for_the_turn_to_end(hub: Hub, clock: FakeClock) -> None:
    await _team(hub, "a")
    await hub.set_timer("t", "a", "a-s", "anchor", 10, "back to work")
    await hub.report_event("t", "a", "a-s", "turn_start")
    clock.advance(11)
    await hub.maintain()
    assert await _take(hub, "a") == []
    await hub.report_event("t", "a", "a-s", "agent_stop", "done")
    assert await _take(hub, "a") == ["ANCHOR: back to work"]


async def test_cancel(hub: Hub, clock: FakeClock) -> None:
    await _team(hub, "a", "b")
    timer = await hub.set_timer("t", "a", None, "anchor", 10, "x")  # the member's only session
    assert timer.session == "a-s"
    with pytest.raises(Forbidden):
        await hub.cancel_timer("t", "b", timer.timer_id)
    cancelled = await hub.cancel_timer("t", "a", timer.timer_id)
    assert cancelled.state == "cancelled"
    # cancelled again (its answer was lost): the same answer, nothing else changes
    assert await hub.cancel_timer("t", "a", timer.timer_id) == cancelled
    with pytest.raises(NotFound):
        await hub.cancel_timer("t", "a", 999_999)
    clock.advance(20)
    await hub.maintain()
    assert await _take(hub, "a") == []


async def test_bad_timers_are_refused_with_the_way_out(hub: Hub) -> None:
    await _team(hub, "a", "b")
    with pytest.raises(InvalidRequest, match="unknown timer intent 'remind'; use 'anchor'"):
        await hub.set_timer("t", "a", "a-s", "remind", 60, "x")
    with pytest.raises(InvalidRequest, match="'check' timer needs target"):
        await hub.set_timer("t", "a", "a-s", "check", 60, "x")
    with pytest.raises(InvalidRequest, match="needs a note"):
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "  ")
    for seconds in (-5, 0, 0.001, 0.999, float("nan"), float("inf"), 30 * 86400 + 1):
        with pytest.raises(InvalidRequest, match="between 1 second and 30 days"):
            await hub.set_timer("t", "a", "a-s", "anchor", seconds, "x")
    with pytest.raises(InvalidRequest, match="at most 2000 characters"):
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "x" * 2001)
    assert await hub.list_timers("t") == []
    with pytest.raises(UnknownRecipient, match="did you mean 'b'"):
        await hub.set_timer("t", "a", "a-s", "wait", 60, "x", target="bb")


async def test_a_timer_due_while_the_hub_was_down_fires_once_marked_late(tmp_path: Path) -> None:
    clock = FakeClock()
    db = tmp_path / "timers.db"
    async with Hub(SqliteStore(db), clock=clock, background=False) as hub:
        await _team(hub, "a")
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "finish the report")
    clock.advance(3600)  # the hub was down for an hour
    async with Hub(SqliteStore(db), clock=clock, background=False) as hub:
        await hub.maintain()
        [text] = await _take(hub, "a")
        assert text.splitlines() == [
            "ANCHOR: finish the report",
            "(late by 59 min: the hub was not running when it was due)",
        ]
        await hub.maintain()
        assert await _take(hub, "a") == []
    async with Hub(SqliteStore(db), clock=clock, background=False) as hub:
        await hub.maintain()
        assert await _take(hub, "a") == [], "fired once, across restarts"


async def test_a_terminated_sessions_timers_are_cancelled_not_fired_into_nothing(
    tmp_path: Path,
) -> None:
    """A terminated session never takes input again: its pending timers are cancelled
    as it ends (explicitly, or when its exit grace runs out), its record says so, and
    they stop counting against the member's timer quota, instead of staying pending for
    up to 30 days and then being marked done without reaching anyone."""
    clock = FakeClock()
    async with Hub(SqliteStore(tmp_path / "t.db"), clock=clock, background=False) as hub:
        await _team(hub, "a")
        await hub.update_member("t", "a", settings={"max_timers": 2})
        await hub.open_session("t", "a", "a-2")
        ended = await hub.set_timer("t", "a", "a-s", "anchor", 60, "gone with a-s")
        exited = await hub.set_timer("t", "a", "a-2", "anchor", 7200, "gone with a-2")
        await hub.terminate_session("t", "a", "a-s", "done")
        assert [t.timer_id for t in await hub.list_timers("t")] == [exited.timer_id]
        states = {t.timer_id: t.state for t in await hub.list_timers("t", pending_only=False)}
        assert states[ended.timer_id] == "cancelled"
        data = await hub.get_session_data("t", "a-s")
        assert any(f"timer {ended.timer_id} cancelled" in e["text"] for e in data["events"]), data[
            "events"
        ]
        await hub.exit_session("t", "a", "a-2")
        clock.advance(3601)  # the exit grace runs out: a-2 terminates before its timer
        await hub.maintain()
        assert await hub.list_timers("t") == []
        await hub.open_session("t", "a", "a-3")
        for i in range(2):  # the cancelled ones no longer take the member's quota
            await hub.set_timer("t", "a", "a-3", "anchor", 10, f"new {i}")
        clock.advance(7200)
        await hub.maintain()
        states = {t.timer_id: t.state for t in await hub.list_timers("t", pending_only=False)}
        assert (states[ended.timer_id], states[exited.timer_id]) == ("cancelled", "cancelled")


async def test_a_timer_left_pending_on_an_ended_session_is_cancelled_when_due(
    tmp_path: Path,
) -> None:
    """A store whose hub ended sessions without cancelling their timers (before they
    were): such a timer, once due, is recorded as cancelled, not done, and fires nothing."""
    clock = FakeClock()
    db = tmp_path / "old.db"
    async with Hub(SqliteStore(db), clock=clock, background=False) as hub:
        await _team(hub, "a")
        timer = await hub.set_timer("t", "a", "a-s", "anchor", 60, "for an ended session")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET state = 'terminated' WHERE session_id = 'a-s'")
    clock.advance(61)
    async with Hub(SqliteStore(db), clock=clock, background=False) as hub:
        await hub.maintain()
        [t] = await hub.list_timers("t", pending_only=False)
        assert (t.timer_id, t.state) == (timer.timer_id, "cancelled")
        assert await hub.receive("t", "a", limit=10) == []


# -- the anchor rule --------------------------------------------------------------------


async def _linked(hub: Hub) -> None:
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.send("t", "a", "b", "first message opens the link", sender_session="a-s")
    assert len(await hub.list_links("t", open_only=True)) == 1


async def test_anchor_rule_enforce_refuses_with_the_exact_call(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _linked(hub)
    with pytest.raises(AnchorRequired) as exc:
        await hub.send("t", "a", "b", "second message", sender_session="a-s")
    assert exc.value.status == 403
    assert exc.value.message == (
        "session 'a-s' holds no pending anchor timer, and 'b' is a linked peer: set an anchor "
        "first so you come back to your own work, for example "
        'set_timer(intent="anchor", minutes=10, note="return to <your task> (talking with b)"); '
        "then send again"
    )
    await hub.set_timer("t", "a", "a-s", "anchor", 600, "back to the plan")
    await hub.send("t", "a", "b", "second message", sender_session="a-s")
    texts = [g.message.text for g in await hub.receive("t", "b", session="b-s", limit=10)]
    assert "second message" in texts


async def test_anchor_rule_applies_to_the_responder_too(hub: Hub) -> None:
    await _team(hub, "a", "b")
    await _linked(hub)
    with pytest.raises(AnchorRequired, match="session 'b-s'"):
        await hub.send("t", "b", "a", "reply", sender_session="b-s")
    await hub.send("t", "b", "user", "unlinked members are not affected", sender_session="b-s")


async def test_anchor_rule_warn_delivers_with_a_reminder(hub: Hub) -> None:
    await _team(hub, "a", "b", policy="warn")
    await _linked(hub)
    await hub.send("t", "a", "b", "second message", sender_session="a-s")
    await hub.report_event("t", "a", "a-s", "agent_stop", "")  # the reminder waits for the turn
    got = await hub.receive("t", "a", session="a-s", limit=10)
    reminders = [g.message.text for g in got if g.message.meta.get("anchor_reminder")]
    assert reminders == [
        "Reminder: you messaged your linked peer b without a pending anchor timer. Set one so you "
        'come back to your own work: set_timer(intent="anchor", minutes=10, note="return to '
        '<your task> (talking with b)")'
    ]
    texts = [g.message.text for g in await hub.receive("t", "b", session="b-s", limit=10)]
    assert "second message" in texts


async def test_anchor_rule_off(hub: Hub) -> None:
    await _team(hub, "a", "b", policy="off")
    await _linked(hub)
    await hub.send("t", "a", "b", "second message", sender_session="a-s")


async def test_a_fired_anchor_no_longer_counts(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        await _team(hub, "a", "b")
        await hub.set_timer("t", "a", "a-s", "anchor", 60, "back to the plan")
        await _linked(hub)
        await hub.send("t", "a", "b", "fine while the anchor is pending", sender_session="a-s")
        clock.advance(61)
        await hub.maintain()
        with pytest.raises(AnchorRequired):
            await hub.send("t", "a", "b", "after it fired", sender_session="a-s")


async def test_two_hubs_on_one_store_fire_a_timer_once(tmp_path: Path) -> None:
    import asyncio

    clock = FakeClock()
    db = tmp_path / "two.db"
    async with (
        Hub(SqliteStore(db), clock=clock, background=False) as one,
        Hub(SqliteStore(db), clock=clock, background=False) as two,
    ):
        await _team(one, "a")
        for i in range(20):
            await one.set_timer("t", "a", "a-s", "anchor", 5, f"note {i}")
        clock.advance(5)
        await asyncio.gather(one.maintain(), two.maintain(), one.maintain(), two.maintain())
        fired = await _take(two, "a")
        assert sorted(fired) == sorted(f"ANCHOR: note {i}" for i in range(20))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_timer_cancelled_as_it_fires_on_another_hub_fires_once_or_not_at_all(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One hub fires due timers while another cancels them, at the same moment. Each
    timer either fires once and its cancel is refused with a conflict that says it
    fired, or is cancelled and never fires: never both, never twice."""
    import asyncio

    from backchannel.stores.postgres import PostgresStore

    clock = FakeClock()
    if kind == "sqlite":
        db = tmp_path / "race.db"

        def store() -> Store:
            return SqliteStore(db)
    else:
        url = request.getfixturevalue("new_postgres_url")()

        def store() -> Store:
            return PostgresStore(url)

    async with (
        Hub(store(), clock=clock, background=False) as firing,
        Hub(store(), clock=clock, background=False) as cancelling,
    ):
        await _team(firing, "a", "b", policy="off")
        cancelled: set[int] = set()
        refused: dict[int, str] = {}
        for i in range(30):
            t = await firing.set_timer("t", "a", "a-s", "anchor", 1, f"note {i}")
            clock.advance(1)

            async def cancel(timer_id: int = t.timer_id) -> None:
                try:
                    await cancelling.cancel_timer("t", "a", timer_id)
                    cancelled.add(timer_id)
                except Conflict as exc:
                    refused[timer_id] = exc.message

            await asyncio.gather(firing.maintain(), cancel())
        got = await firing.receive("t", "a", session="a-s", limit=100)
        fired = [g.message.meta["timer_id"] for g in got]
        assert sorted(fired) == sorted(refused), "each refused cancel's timer fired, once"
        assert not cancelled & set(fired), "a cancelled timer never fires"
        assert len(cancelled) + len(refused) == 30
        for timer_id, message in refused.items():
            assert message.startswith(f"timer {timer_id} fired before this cancel")
        assert await firing.list_timers("t") == []


# -- a store from before timers watched their targets (schema 10) ---------------------------

_TO_SCHEMA_10 = {
    "sqlite": [
        "DROP TABLE store_identity",  # schema 25
        "DELETE FROM schema_migrations WHERE version = 25",
        "DROP INDEX jobs_timers_member_pending",  # schema 24
        "DELETE FROM schema_migrations WHERE version = 24",
        "DROP INDEX budgets_recent",  # schema 23
        "DELETE FROM schema_migrations WHERE version = 23",
        "DROP INDEX delegations_state",  # schema 22
        "DROP INDEX sessions_team_live",
        "DROP INDEX sessions_team_active",
        "DROP INDEX jobs_timers",
        "DROP INDEX jobs_timers_pending",
        "DROP INDEX jobs_timers_member",
        "DELETE FROM schema_migrations WHERE version = 22",
        "DROP INDEX deliveries_holder",  # schema 21
        "ALTER TABLE deliveries DROP COLUMN lease_holder",
        "DELETE FROM schema_migrations WHERE version = 21",
        "DROP INDEX delegations_team",  # schema 20
        "DROP INDEX delegations_caller",
        "DROP INDEX delegations_callee",
        "DELETE FROM schema_migrations WHERE version = 20",
        "DROP INDEX sessions_team",  # schema 19
        "DROP INDEX links_team",
        "DROP INDEX links_team_open",
        "DELETE FROM schema_migrations WHERE version = 19",
        "DROP TABLE a2a_claims",  # schema 18
        "DELETE FROM schema_migrations WHERE version = 18",
        "DROP TABLE push_circuits",  # schema 17
        "DELETE FROM schema_migrations WHERE version = 17",
        "ALTER TABLE teams DROP COLUMN feed_removed",  # schema 16
        "DELETE FROM schema_migrations WHERE version = 16",
        "DROP INDEX delivery_events_reaction",  # schema 15
        "DELETE FROM schema_migrations WHERE version = 15",
        "DROP INDEX jobs_request",  # schema 14
        "DELETE FROM schema_migrations WHERE version = 14",
        "DROP INDEX messages_created",  # schema 13
        "CREATE INDEX messages_created ON messages (created_at)",
        "DELETE FROM schema_migrations WHERE version = 13",
        "DROP INDEX deliveries_dead",  # schema 12
        "DELETE FROM schema_migrations WHERE version = 12",
        "UPDATE jobs SET payload = json_remove(payload, '$.reply')",
        "DROP INDEX jobs_watch",
        "ALTER TABLE jobs DROP COLUMN watch",
        "CREATE INDEX messages_sender ON messages (team, sender, created_at)",
        "DELETE FROM schema_migrations WHERE version = 11",
    ],
    "postgres": [
        "DROP TABLE store_identity",  # schema 25
        "DELETE FROM schema_migrations WHERE version = 25",
        "DROP INDEX jobs_timers_member_pending",  # schema 24
        "DELETE FROM schema_migrations WHERE version = 24",
        "DROP INDEX budgets_recent",  # schema 23
        "DELETE FROM schema_migrations WHERE version = 23",
        "DROP INDEX delegations_state",  # schema 22
        "DROP INDEX sessions_team_live",
        "DROP INDEX sessions_team_active",
        "DROP INDEX jobs_timers",
        "DROP INDEX jobs_timers_pending",
        "DROP INDEX jobs_timers_member",
        "DROP INDEX jobs_timers_session",
        "DELETE FROM schema_migrations WHERE version = 22",
        "DROP INDEX deliveries_holder",  # schema 21
        "ALTER TABLE deliveries DROP COLUMN lease_holder",
        "DELETE FROM schema_migrations WHERE version = 21",
        "DROP INDEX delegations_team",  # schema 20
        "DROP INDEX delegations_caller",
        "DROP INDEX delegations_callee",
        "DELETE FROM schema_migrations WHERE version = 20",
        "DROP INDEX sessions_team",  # schema 19
        "DROP INDEX links_team",
        "DROP INDEX links_team_open",
        "DELETE FROM schema_migrations WHERE version = 19",
        "DROP TABLE a2a_claims",  # schema 18
        "DELETE FROM schema_migrations WHERE version = 18",
        "DROP TABLE push_circuits",  # schema 17
        "DELETE FROM schema_migrations WHERE version = 17",
        "ALTER TABLE teams DROP COLUMN feed_removed",  # schema 16
        "DELETE FROM schema_migrations WHERE version = 16",
        "DROP INDEX delivery_events_reaction",  # schema 15
        "DELETE FROM schema_migrations WHERE version = 15",
        "DROP INDEX jobs_request",  # schema 14
        "DELETE FROM schema_migrations WHERE version = 14",
        "DROP INDEX messages_created",  # schema 13
        "CREATE INDEX messages_created ON messages (created_at)",
        "DELETE FROM schema_migrations WHERE version = 13",
        "DROP INDEX deliveries_dead",  # schema 12
        "DELETE FROM schema_migrations WHERE version = 12",
        "UPDATE jobs SET payload = payload - 'reply'",
        "DROP INDEX jobs_watch",
        "ALTER TABLE jobs DROP COLUMN watch",
        "CREATE INDEX messages_sender ON messages (team, sender, created_at)",
        "DELETE FROM schema_migrations WHERE version = 11",
    ],
}


def _downgrade(kind: str, where: str) -> None:
    """Make the store what schema 10 left: targets only in the timers' payloads, no reply
    noted, the index by sender."""
    if kind == "sqlite":
        conn = sqlite3.connect(where, isolation_level=None)
        try:
            for statement in _TO_SCHEMA_10[kind]:
                conn.execute(statement)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(where, autocommit=True) as pg:
        for statement in _TO_SCHEMA_10[kind]:
            pg.execute(statement.encode())


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_pending_wait_timers_of_schema_10_are_migrated(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Migration 11 gives a pending wait timer its target's reply already sent, or its
    target to watch for one."""
    clock = FakeClock()
    if kind == "sqlite":
        where = str(tmp_path / "old.db")

        def store() -> Store:
            return SqliteStore(where)
    else:
        where = request.getfixturevalue("new_postgres_url")()
        from backchannel.stores.postgres import PostgresStore

        def store() -> Store:
            return PostgresStore(where)

    async with Hub(store(), clock=clock, background=False) as hub:
        await _lead_waits_for_w_and_x(hub)
        clock.advance(5)
        await hub.send("t", "w", "lead", "verdict: fine")
    _downgrade(kind, where)
    async with Hub(store(), clock=clock, background=False) as hub:
        clock.advance(5)
        await hub.send("t", "x", "lead", "numbers: 42")
        await hub.send("t", "w", "lead", "a later word")
        texts = await _fired(hub, clock, 110)
    assert [t.splitlines()[1] for t in texts] == [
        'w has replied since you set this timer (5 s after): "verdict: fine"',
        'x has replied since you set this timer (10 s after): "numbers: 42"',
    ]


@pytest.mark.parametrize(
    "store", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_reply_sent_before_the_wait_timer_was_set_counts(
    store: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """The peer answered fast, between the question and the ``wait`` call: the answer,
    still unread in the asker's inbox, is the reply the timer waits for. One that a
    later question of the asker's made old is not."""
    async with Hub(_store(store, tmp_path, request), clock=clock, background=False) as hub:
        await _team(hub, "lead", "w", "x", policy="off")
        await hub.report_event("t", "lead", "lead-s", "turn_start", "ask w and x")
        await hub.send("t", "lead", "w", "what is the total?")
        await hub.send("t", "lead", "x", "what is the count?")
        clock.advance(2)
        await hub.send("t", "w", "lead", "The total is 42.")
        await hub.send("t", "x", "lead", "The count is 7.")
        clock.advance(1)
        await hub.send("t", "lead", "x", "and the mean?")  # x's answer above is not to this
        clock.advance(2)
        await hub.set_timer("t", "lead", "lead-s", "wait", 60, "the total", target="w")
        await hub.set_timer("t", "lead", "lead-s", "wait", 60, "the mean", target="x")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "waiting")
        await _take(hub, "lead")  # the replies, read at the turn's end
        texts = await _fired(hub, clock, 60)
        assert [t.splitlines() for t in texts] == [
            [
                "WAIT: the mean",
                "x has not replied since you set this timer (60 s ago).",
            ],
            [
                "WAIT: the total",
                "w replied before you set this timer (3 s before), in a message you had "
                'not read yet: "The total is 42."',
            ],
        ]


@pytest.mark.parametrize(
    "store", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_wait_timer_fired_mid_turn_says_the_reply_that_came_before_it_was_read(
    store: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """A ``wait`` timer that fired while its session's turn ran waits for the turn to
    end; a reply that came meanwhile is what it says when it is handed over, not the
    "has not replied" of the moment it fired."""
    async with Hub(_store(store, tmp_path, request), clock=clock, background=False) as hub:
        await _team(hub, "lead", "w", "x", policy="off")
        await hub.set_timer("t", "lead", "lead-s", "wait", 10, "the total", target="w")
        await hub.set_timer("t", "lead", "lead-s", "wait", 10, "the count", target="x")
        await hub.report_event("t", "lead", "lead-s", "turn_start", "long work")
        clock.advance(10)
        await hub.maintain()  # both fire mid-turn: neither peer has replied
        clock.advance(5)
        await hub.send("t", "w", "lead", "The total is 42.")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "done")
        got = await hub.receive("t", "lead", session="lead-s", limit=100)
        timers = sorted(
            (g.message for g in got if g.message.kind is MessageKind.TIMER),
            key=lambda m: m.text,
        )
        assert [m.text.splitlines() for m in timers] == [
            ["WAIT: the count", "x has not replied since you set this timer (10 s ago)."],
            [
                "WAIT: the total",
                "w replied after this timer fired, before you read it (5 s after it fired): "
                '"The total is 42."',
            ],
        ]
        assert [m.meta["replied"] for m in timers] == [False, True]
        # the reply itself is handed over too, once
        assert [g.message.text for g in got].count("The total is 42.") == 1


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_the_timer_quota_holds_across_hubs_on_one_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each hub remembered the room it last counted and handed out half of it unseen:
    two hubs on one store (``serve`` and the CLI's own, or several ``serve``) held 5
    timers under a limit of 4, and a limit an administrator lowered on one hub did not
    apply on the other. Every pending timer of the member is counted when one is set,
    whichever hub set the others, under the limit in force; a session that ends frees
    what it held."""
    from backchannel.stores.postgres import PostgresStore

    if kind == "sqlite":
        db = tmp_path / "quota.db"

        def store() -> Store:
            return SqliteStore(db)
    else:
        url = request.getfixturevalue("new_postgres_url")()

        def store() -> Store:
            return PostgresStore(url)

    async with (
        Hub(store(), background=False) as one,
        Hub(store(), background=False) as two,
    ):
        await _team(one, "a", policy="off")
        await one.open_session("t", "a", "a-2")
        await one.set_timer("t", "a", "a-s", "anchor", 60, "first, under the default limit")
        await two.update_member("t", "a", settings={"max_timers": 4})  # lowered elsewhere
        hubs = [one, two, one, two, one, two]
        sessions = ["a-s", "a-2", "a-2", "a-s", "a-2", "a-s"]
        refused: dict[int, str] = {}
        for i, (hub, sid) in enumerate(zip(hubs, sessions, strict=True)):
            try:
                await hub.set_timer("t", "a", sid, "anchor", 60, f"note {i}")
            except QuotaExceeded as exc:
                refused[i] = exc.message
        assert list(refused) == [3, 4, 5]
        said = "already has 4 pending timers, the limit (max_timers=4)"
        assert all(said in why for why in refused.values()), refused
        assert len(await one.list_timers("t", member="a")) == 4
        await two.exit_session("t", "a", "a-2")  # exited, resumable: its timers still fire
        with pytest.raises(QuotaExceeded):
            await one.set_timer("t", "a", "a-s", "anchor", 60, "while a-2 may come back")
        await two.terminate_session("t", "a", "a-2", "done")  # its two timers end with it
        for i in range(2):
            await one.set_timer("t", "a", "a-s", "anchor", 60, f"after a-2 ended {i}")
        with pytest.raises(QuotaExceeded):
            await two.set_timer("t", "a", "a-s", "anchor", 60, "one too many")
        assert len(await two.list_timers("t", member="a")) == 4
