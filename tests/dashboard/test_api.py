"""The dashboard's HTTP side, without a browser: page, assets, tickets, stream, reads."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.interfaces.dashboard import (
    FINISHED_SHOWN,
    SESSIONS_SHOWN,
    SNAPSHOT_PAGE,
    _ticket_key,
    budgets_view,
    issue_ticket,
    snapshot,
    snapshot_key,
)
from backchannel.testing import MemoryStore, counting_rows
from backchannel.types import (
    Budget,
    Delegation,
    DelegationState,
    Link,
    LinkState,
    Route,
    Session,
    SessionState,
)
from tests.dashboard.conftest import Team


def _events(resp: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) pairs of a server-sent event stream."""
    name = ""
    for line in resp.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            yield name, json.loads(line[len("data: ") :])


def _ticket(team: Team, member: str | None = None) -> str:
    with team.client(member) as c:
        r = c.post("/v1/dashboard/tickets", json={"team": team.name})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["expires_at"] > time.time()
        return str(body["ticket"])


def test_page_and_assets_are_served_from_the_package(team: Team) -> None:
    with httpx.Client(base_url=team.server.url) as c:
        page = c.get("/")
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert '<script src="/static/app.js"' in page.text
        for asset, kind in (("app.js", "javascript"), ("style.css", "css")):
            r = c.get(f"/static/{asset}")
            assert r.status_code == 200
            assert kind in r.headers["content-type"]
        # no asset comes from elsewhere: the page works offline
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text)
        for asset in ("app.js", "style.css"):
            assert not re.search(r"https?://", c.get(f"/static/{asset}").text)


def test_reads_are_team_scoped(team: Team, hub_server: object) -> None:
    other = team.server.team(team.name + "x", "spy")
    with team.client("worker") as c:
        r = c.get(f"/v1/dashboard/teams/{team.name}/members")
        assert r.status_code == 200
        members = {m["name"]: m for m in r.json()["members"]}
        assert set(members) == {"user", "lead", "worker", "reviewer"}
        assert members["worker"]["state"] == "no session"
        assert members["user"]["kind"] == "human"
    with team.server.client(other["spy"]) as c:
        for path in ("members", "snapshot", "links", "timers", "delegations"):
            r = c.get(f"/v1/dashboard/teams/{team.name}/{path}")
            assert r.status_code == 404, path
            assert r.json()["error"]["code"] == "unknown_team"
        r = c.post("/v1/dashboard/tickets", json={"team": team.name})
        assert r.status_code == 404
    with httpx.Client(base_url=team.server.url) as c:
        r = c.get(f"/v1/dashboard/teams/{team.name}/members")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"


def test_members_show_session_state(team: Team) -> None:
    sid = team.open_session("worker", "worker-s1")
    with team.client() as c:  # the admin
        members = {
            m["name"]: m
            for m in c.get(f"/v1/dashboard/teams/{team.name}/members").json()["members"]
        }
    assert members["worker"]["state"] == "idle"
    assert members["worker"]["sessions"][0]["session_id"] == sid
    assert members["worker"]["last_activity"] is not None
    assert members["lead"]["state"] == "no session"


def test_panels_answer_the_hubs_records(make_team: Callable[..., Team]) -> None:
    t = make_team("a", "b", settings={"anchor_policy": "off"})
    base = f"/v1/dashboard/teams/{t.name}"
    with t.client("b") as c:
        snap = c.get(f"{base}/snapshot").json()
    assert (snap["links"], snap["timers"], snap["delegations"]) == ([], [], [])
    hidden = {"links": 0, "delegations": 0, "timers": 0, "budgets": 0, "dead": 0}
    assert (snap["hidden"], snap["dead"]) == (hidden, [])
    assert set(snap["delegation_tally"].values()) == {0}
    assert abs(snap["now"] - time.time()) < 60

    t.open_session("a", "a-s")
    t.open_session("b", "b-s")
    t.report("a", "a-s", "turn_start")
    t.post("a", "/v1/messages", to="b", text="let's talk", from_session="a-s")
    t.post("a", "/v1/timers", intent="wait", minutes=5, note="did b answer?", target="b")
    t.post("a", "/v1/delegations", to="b", task="count files", tool_use_id="tu_1")
    t.report("a", "a-s", "agent_stop", "")
    with t.client("b") as c:  # any member of the team sees it all
        links = c.get(f"{base}/links").json()["links"]
        timers = c.get(f"{base}/timers").json()["timers"]
        delegations = c.get(f"{base}/delegations").json()["delegations"]
        snap = c.get(f"{base}/snapshot").json()
    [link] = links
    assert {k: link[k] for k in ("initiator", "initiator_session", "responder")} == {
        "initiator": "a",
        "initiator_session": "a-s",
        "responder": "b",
    }
    assert (link["responder_session"], link["state"], link["turns_used"], link["budget"]) == (
        "b-s",
        "open",
        0,
        8,
    )
    assert link["close_reason"] is None
    [timer] = timers
    assert (timer["intent"], timer["note"], timer["target"], timer["state"]) == (
        "wait",
        "did b answer?",
        "b",
        "pending",
    )
    assert (timer["member"], timer["session"]) == ("a", "a-s")
    assert 290 < timer["due_in"] <= 300
    [d] = delegations
    assert (d["caller"], d["callee"], d["task"], d["state"]) == ("a", "b", "count files", "pending")
    assert d["callee_session"] == "a-s--tu_1"
    assert snap["links"] == links
    assert snap["delegations"] == delegations
    assert snap["delegation_tally"] == {
        "pending": 1,
        "answered": 0,
        "timed_out": 0,
        "late": 0,
        "failed": 0,
    }


def test_stream_sends_a_new_snapshot_when_a_link_crosses(make_team: Callable[..., Team]) -> None:
    t = make_team("a", "b", settings={"anchor_policy": "off"})
    t.open_session("a", "a-s")
    t.open_session("b", "b-s")
    t.report("a", "a-s", "turn_start")
    t.post("a", "/v1/messages", to="b", text="let's talk", from_session="a-s")
    t.report("a", "a-s", "agent_stop", "")
    url = f"/v1/dashboard/teams/{t.name}/stream"
    with (
        httpx.Client(base_url=t.server.url, timeout=10) as c,
        c.stream("GET", url, params={"ticket": _ticket(t, "a")}) as resp,
    ):
        events = _events(resp)
        assert next(events) == ("replay", {"after": 0}), "from the start: no `last`"
        name, snap = next(events)
        assert name == "snapshot"
        assert [x["turns_used"] for x in snap["links"]] == [0]
        while next(events)[0] != "live":
            pass
        t.turn("b", "b-s", "here is what I think")
        snaps = (data for name, data in events if name == "snapshot")
        seen = next(s for s in snaps if s["links"][0]["turns_used"] == 1)
        assert seen["links"][0]["history"][-1]["event"] == "crossing"


def test_snapshots_change_with_the_records_not_the_clock() -> None:
    timer = {"timer_id": 1, "due_at": 100.0, "due_in": 30.0}
    snap: dict[str, Any] = {"now": 70.0, "links": [], "timers": [timer]}
    later = {**snap, "now": 71.0, "timers": [{**timer, "due_in": 29.0}]}
    assert snapshot_key(snap) == snapshot_key(later)
    moved = {**snap, "timers": [{**timer, "due_at": 200.0}]}
    assert snapshot_key(snap) != snapshot_key(moved)


def test_spent_budgets_are_a_bounded_panel() -> None:
    """Spent chain budgets are never forgotten; the snapshot carries the first page of
    them (spent ones first, newest first) and counts the rest, which pages read."""

    async def check() -> None:
        async with Hub(MemoryStore(), background=False) as hub:
            await hub.create_team("t")
            n = SNAPSHOT_PAGE + 30

            def spend(tx: Any) -> None:
                for i in range(n):
                    tx.put_budget(Budget("t", f"chain:c{i}", 0.0, used=10_000, updated_at=float(i)))

            await hub.store.transact(spend)
            snap = await snapshot(hub, "t")
            assert len(snap["budgets"]) == SNAPSHOT_PAGE
            assert snap["hidden"]["budgets"] == 30
            assert snap["budgets"][0]["key"] == f"chain:c{n - 1}"  # the newest first
            page, hidden = await budgets_view(hub, "t", SNAPSHOT_PAGE, 100)
            assert (len(page), hidden) == (30, SNAPSHOT_PAGE)
            assert page[-1]["key"] == "chain:c0"

    # the browser tests of this folder keep an event loop running on this thread
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, check()).result()


def test_a_snapshot_of_a_long_lived_team_reads_what_it_shows(tmp_path: Path) -> None:
    """A team that ran for months holds thousands of sessions (every /clear opens one)
    and closed links, and a week of delegations. Its snapshot, taken every second for
    each open page, reads each member's live sessions and latest few, the open links
    and the latest closed ones, and the pending delegations and the latest finished
    ones, counting the rest: not every record the team ever had. The page still shows
    each member's state, latest sessions and count, the links panel's tally and the
    delegations panel's, every delegation counted by state."""
    from backchannel.stores.sqlite import SqliteStore

    old_sessions, closed_links, finished_delegations = 2_000, 1_000, 1_000

    async def check() -> None:
        async with Hub(SqliteStore(tmp_path / "hub.db"), background=False) as hub:
            await hub.create_team("t")
            for name in ("busy", "quiet", "away", "new"):
                await hub.add_member("t", name)

            def history(tx: Any) -> None:
                def session(member: str, i: int, state: SessionState) -> None:
                    at = float(i)
                    tx.put_session(Session("t", f"{member}-{i:05d}", member, state, at, at + 0.5))

                for i in range(old_sessions):
                    session("busy", i, SessionState.TERMINATED)
                session("busy", old_sessions, SessionState.ACTIVE)
                for i in range(30):
                    session("quiet", i, SessionState.TERMINATED)
                session("away", 5, SessionState.EXITED)
                for i in range(closed_links + 2):
                    closed = i < closed_links
                    a, b = ("busy", "quiet") if i <= closed_links else ("away", "new")
                    tx.insert_link(  # at most one open link per pair
                        Link(
                            "t",
                            f"l{i:05d}",
                            a,
                            "busy-00000",
                            b,
                            None,
                            10,
                            float(i),
                            state=LinkState.CLOSED if closed else LinkState.OPEN,
                            closed_at=float(i) + 1 if closed else None,
                        )
                    )

                # a week of delegations kept (busy asks quiet, away asks busy), three pending
                for i in range(finished_delegations + 3):
                    caller, callee = ("busy", "quiet") if i % 2 else ("away", "busy")
                    done = i < finished_delegations
                    tx.insert_delegation(
                        Delegation(
                            "t",
                            f"d{i:05d}",
                            Route.LOCAL,
                            caller,
                            f"{caller}-s",
                            f"tu_{i}",
                            callee,
                            "count",
                            float(i),
                            float(i) + 300,
                            f"{caller}-s#{i}",
                            state=DelegationState.ANSWERED if done else DelegationState.PENDING,
                            answered_at=float(i) + 1 if done else None,
                        )
                    )

            await hub.store.transact(history)
            with counting_rows(hub.store) as read:
                snap = await snapshot(hub, "t")
            live = 2  # busy's active session, away's exited one
            assert read["Session"] <= live + 3 * SESSIONS_SHOWN, read
            assert read["Link"] <= 2 + FINISHED_SHOWN, read
            assert read["Delegation"] <= 3 + FINISHED_SHOWN, read
            # the pending delegations first, newest first, then the latest finished ones;
            # the rest counted, every one tallied by state
            ids = [x["delegation_id"] for x in snap["delegations"]]
            n = finished_delegations
            assert ids[:4] == [f"d{n + 2:05d}", f"d{n + 1:05d}", f"d{n:05d}", f"d{n - 1:05d}"]
            assert len(ids) == SNAPSHOT_PAGE
            assert snap["hidden"]["delegations"] == n + 3 - SNAPSHOT_PAGE
            assert snap["delegation_tally"] == {
                "pending": 3, "answered": n, "timed_out": 0, "late": 0, "failed": 0
            }  # fmt: skip
            # a member sees its own share, read as boundedly: quiet is asked every other one
            with counting_rows(hub.store) as read:
                mine = await snapshot(hub, "t", viewer="quiet")
            assert read["Delegation"] <= 3 + FINISHED_SHOWN, read
            ids = [x["delegation_id"] for x in mine["delegations"]]
            assert ids[:3] == [f"d{n + 1:05d}", f"d{n - 1:05d}", f"d{n - 3:05d}"]
            assert mine["delegation_tally"]["pending"] == 1
            assert mine["delegation_tally"]["answered"] == n // 2
            assert mine["hidden"]["delegations"] == n // 2 + 1 - SNAPSHOT_PAGE

            members = {m["name"]: m for m in snap["members"]}
            assert {n: m["state"] for n, m in members.items()} == {
                "busy": "active",
                "quiet": "terminated",
                "away": "exited",
                "new": "no session",
                "user": "no session",  # the team's human
            }
            busy = members["busy"]
            assert busy["sessions_total"] == old_sessions + 1
            shown = [s["session_id"] for s in busy["sessions"]]  # the latest, oldest first
            assert shown == [f"busy-{i:05d}" for i in range(old_sessions - 19, old_sessions + 1)]
            assert len(shown) == SESSIONS_SHOWN
            assert busy["last_activity"] == old_sessions + 0.5
            assert members["quiet"]["sessions_total"] == 30
            assert members["quiet"]["sessions"][-1]["session_id"] == "quiet-00029"
            assert (members["new"]["sessions"], members["new"]["sessions_total"]) == ([], 0)
            assert members["new"]["last_activity"] is None
            # the open links first, then the latest closed ones; the rest counted
            ids = [x["link_id"] for x in snap["links"]]
            assert ids[:3] == [f"l{closed_links + 1:05d}", f"l{closed_links:05d}", "l00999"]
            assert len(ids) == SNAPSHOT_PAGE
            assert snap["hidden"]["links"] == closed_links + 2 - SNAPSHOT_PAGE

    # the browser tests of this folder keep an event loop running on this thread
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, check()).result()


def test_session_view(team: Team) -> None:
    sid = team.open_session("lead")
    team.report("lead", sid, "turn_start", "plan")
    team.report("lead", sid, "tool_call", "", name="read_file", input={"path": "a.py"})
    team.report("lead", sid, "agent_stop", "all planned")
    with team.client("reviewer") as c:
        r = c.get(f"/v1/dashboard/teams/{team.name}/sessions/{sid}")
        assert r.status_code == 200
        body = r.json()
        assert body["session"]["member"] == "lead"
        assert body["session"]["state"] == "idle"
        assert body["session"]["last_output"] == "all planned"
        kinds = [e["kind"] for e in body["transcript"]]
        assert kinds == ["session", "turn_start", "tool_call", "agent_stop"]
        assert body["transcript"][2]["data"] == {"name": "read_file", "input": {"path": "a.py"}}
        assert body["note"] is None
        # only the end of a long transcript, and a note that says so
        r = c.get(f"/v1/dashboard/teams/{team.name}/sessions/{sid}", params={"tail_chars": 5})
        body = r.json()
        assert [e["text"] for e in body["transcript"]] == ["[…cut…] anned"]
        assert "last 5 characters" in body["note"]
        r = c.get(f"/v1/dashboard/teams/{team.name}/sessions/nope")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "unknown_session"


def test_composer_sends_as_user_for_admin_and_user_only(team: Team) -> None:
    path = f"/v1/dashboard/teams/{team.name}/messages"
    with team.client("worker") as c:
        r = c.post(path, json={"to": "lead", "text": "hi"})
        assert r.status_code == 403
        assert "user" in r.json()["error"]["message"]
    with team.client("user") as c:
        r = c.post(path, json={"to": "worker", "text": "from user", "message_id": "dash-1"})
        assert r.status_code == 201
        assert r.json()["recipients"] == ["worker"]
        again = c.post(path, json={"to": "worker", "text": "from user", "message_id": "dash-1"})
        assert again.status_code == 200  # idempotent on message_id
        r = c.post(path, json={"to": "wroker", "text": "typo"})
        assert r.status_code == 404
        assert r.json()["error"]["suggestions"] == ["worker"]
        assert c.post(path, json={"to": "worker", "text": "   "}).status_code == 422
    with team.client() as c:
        r = c.post(path, json={"to": "*", "text": "everyone"})
        assert r.status_code == 201
        assert sorted(r.json()["recipients"]) == ["lead", "reviewer", "worker"]
    got = team.receive("worker")
    assert [(m["from"], m["text"]) for m in got] == [("user", "from user"), ("user", "everyone")]


def test_message_detail_for_its_sender_recipients_and_the_teams_human(team: Team) -> None:
    """A member opens the messages it sent or got, as GET /v1/messages/{id} lets it;
    the team's human and the admin open any of the team's."""
    mid = team.send("lead", "worker", "line one\nline two", summary="two lines")
    for who in ("lead", "worker", "user", None):
        with team.client(who) as c:
            r = c.get(f"/v1/dashboard/teams/{team.name}/messages/{mid}")
            assert r.status_code == 200, (who, r.text)
            body = r.json()
        assert body["text"] == "line one\nline two"
        assert body["deliveries"][0]["to"] == "worker"
        assert [e["event"] for e in body["history"]] == ["queued"]
    with team.client("reviewer") as c:  # neither sender nor recipient: as if unknown
        r = c.get(f"/v1/dashboard/teams/{team.name}/messages/{mid}")
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "unknown_message"
        assert "line one" not in r.text


def test_a_member_sees_only_the_delegations_it_made_or_was_asked(
    make_team: Callable[..., Team],
) -> None:
    """The dashboard shows a member what GET /v1/delegations does: the delegations it
    made or was asked, in the snapshot, the panel's pages, the tally and the stream,
    and not the task's message; the team's human and the admin see every one."""
    t = make_team("a", "b", "c", settings={"anchor_policy": "off"})
    base = f"/v1/dashboard/teams/{t.name}"
    t.open_session("a", "a-s")
    t.report("a", "a-s", "turn_start")
    d = t.post("a", "/v1/delegations", to="b", task="the secret plan", tool_use_id="tu_1")
    t.report("a", "a-s", "agent_stop", "")
    [task] = t.receive("b", session=d["callee_session"])
    for who in ("a", "b", "user", None):
        with t.client(who) as c:
            snap = c.get(f"{base}/snapshot").json()
            page = c.get(f"{base}/delegations").json()
        assert [x["delegation_id"] for x in snap["delegations"]] == [d["delegation_id"]], who
        assert page["delegations"] == snap["delegations"], who
        assert snap["delegation_tally"]["pending"] == 1, who
    with t.client("c") as c:
        snap = c.get(f"{base}/snapshot").json()
        page = c.get(f"{base}/delegations").json()
        opened = c.get(f"{base}/messages/{task['message_id']}")
    assert (snap["delegations"], page["delegations"]) == ([], [])
    assert set(snap["delegation_tally"].values()) == {0}
    assert (snap["hidden"]["delegations"], page["hidden"]) == (0, 0)
    assert "the secret plan" not in json.dumps(snap)
    assert opened.status_code == 404
    with (
        t.server.client() as c,
        c.stream("GET", f"{base}/stream", params={"ticket": _ticket(t, "c")}, timeout=10) as resp,
    ):
        for name, data in _events(resp):
            if name == "snapshot":
                assert data["delegations"] == [], data["delegations"]
                assert "the secret plan" not in json.dumps(data)
                break


def test_stream_needs_a_valid_ticket(team: Team) -> None:
    url = f"/v1/dashboard/teams/{team.name}/stream"
    with httpx.Client(base_url=team.server.url, timeout=10) as c:
        assert c.get(url).status_code == 422  # no ticket at all
        r = c.get(url, params={"ticket": "bogus.sig"})
        assert r.status_code == 401
        assert "ticket" in r.json()["error"]["message"]
        # a genuine ticket that has expired
        key = _ticket_key(team.server.admin_token)
        stale, _ = issue_ticket(key, team.name, None, time.time() - 3600)
        assert c.get(url, params={"ticket": stale}).status_code == 401
        # a ticket for one team does not open another's stream
        other = team.server.team(team.name + "y")
        assert other
        r = c.get(f"/v1/dashboard/teams/{team.name}y/stream", params={"ticket": _ticket(team)})
        assert r.status_code == 404
        # the bearer token itself is not accepted in the URL
        assert c.get(url, params={"ticket": team.tokens["lead"]}).status_code == 401


def test_stream_sends_snapshot_then_live_traffic(team: Team) -> None:
    first = team.send("lead", "worker", "before the stream")
    ticket = _ticket(team, "reviewer")
    url = f"/v1/dashboard/teams/{team.name}/stream"
    with (
        httpx.Client(base_url=team.server.url, timeout=10) as c,
        c.stream("GET", url, params={"ticket": ticket}) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = _events(resp)
        assert next(events) == ("replay", {"after": 0}), "from the start: no `last`"
        name, snap = next(events)
        assert name == "snapshot"
        assert {m["name"] for m in snap["members"]} == {"user", "lead", "worker", "reviewer"}
        name, data = next(events)
        assert (name, data["message_id"], data["event"]) == ("traffic", first, "queued")
        assert next(events)[0] == "live"
        second = team.send("worker", "lead", "during the stream", summary="live one")
        name, data = next(events)
        assert name == "traffic"
        assert data["message_id"] == second
        assert data["summary"] == "live one"
        assert (data["from"], data["to"], data["kind"]) == ("worker", "lead", "direct")
        # a session opening changes the members: a new snapshot follows
        team.open_session("lead")
        name, snap = next(events)
        assert name == "snapshot"
        states = {m["name"]: m["state"] for m in snap["members"]}
        assert states["lead"] == "idle"


def _replay(team: Team, **params: object) -> tuple[int, list[dict[str, Any]]]:
    """Open the stream with ``params``: where its replay starts and the traffic it sends
    before ``live``."""
    url = f"/v1/dashboard/teams/{team.name}/stream"
    with (
        httpx.Client(base_url=team.server.url, timeout=30) as c,
        c.stream("GET", url, params={"ticket": _ticket(team), **params}) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        events = _events(resp)
        name, start = next(events)
        assert name == "replay"
        traffic = []
        for name, data in events:
            if name == "live":
                return start["after"], traffic
            if name == "traffic":
                traffic.append(data)
    raise AssertionError("the stream ended before it was live")


def test_a_stream_asked_for_the_latest_events_replays_only_those(
    make_team: Callable[..., Team],
) -> None:
    """A page that keeps 1,000 events asks for no more: the replay starts where the
    team's latest 1,000 begin, not at its first event, and a stream resuming from a
    later cursor starts there."""
    t = make_team("a", "b", "c", "d")
    t.flood("user", 1_000)  # 4 copies each: 4,000 events
    start, sent = _replay(t, last=1000)
    assert len(sent) == 1000, len(sent)
    _, every = _replay(t)  # no `last`: the whole history, as before
    assert len(every) == 4000
    assert sent == every[-1000:], "the newest 1,000, in order"
    assert start == every[-1001]["cursor"]
    # a cursor later than where the latest 1,000 begin wins; `last` beyond the history
    # replays it all
    _, resumed = _replay(t, last=1000, after=every[-10]["cursor"])
    assert resumed == every[-9:]
    assert _replay(t, last=5000) == (0, every)
    with httpx.Client(base_url=t.server.url) as c:
        url = f"/v1/dashboard/teams/{t.name}/stream"
        too_many = c.get(url, params={"ticket": _ticket(t), "last": 10_001})
        assert too_many.status_code == 422


@pytest.mark.parametrize("traffic", [True, False], ids=["traffic", "quiet"])
def test_a_stream_ends_when_its_members_token_is_rotated(team: Team, traffic: bool) -> None:
    """A ticket is checked when the stream opens; a member whose token is rotated (or
    who is removed) meanwhile must not go on watching the team's traffic. With nothing
    new to send, the stream still ends, within a snapshot's interval, rather than staying
    open with keep-alives for as long as the team is quiet (a read timeout of 10 s:
    keep-alives come every 15 s)."""
    ticket = _ticket(team, "reviewer")
    url = f"/v1/dashboard/teams/{team.name}/stream"
    with (
        httpx.Client(base_url=team.server.url, timeout=10) as c,
        c.stream("GET", url, params={"ticket": ticket}) as resp,
    ):
        assert resp.status_code == 200
        events = _events(resp)
        assert [next(events)[0] for _ in range(3)] == ["replay", "snapshot", "live"]
        with team.client() as admin:
            r = admin.post(f"/v1/teams/{team.name}/members/reviewer/token")
            assert r.status_code == 200, r.text
        secret = team.send("lead", "worker", "after the rotation") if traffic else None
        rest = list(events)  # the stream ends
    assert [name for name, _ in rest] == ["error"], rest
    assert rest[0][1]["error"]["code"] == "unauthorized"
    assert "rotated" in rest[0][1]["error"]["message"]
    assert secret is None or secret not in json.dumps(rest)


def test_a_rotation_by_another_hub_process_ends_a_stream_too(tmp_path: Path) -> None:
    """Hub processes sharing a store each know their own rotations at once; another's
    is seen once the member's last check is TOKEN_CACHE_SECONDS old, as for a bearer
    token (two hubs on one SQLite file here, as two `serve` processes would be)."""
    from backchannel.hub.members import TOKEN_CACHE_SECONDS
    from backchannel.interfaces.dashboard import Watcher
    from backchannel.interfaces.http import Principal
    from backchannel.stores.sqlite import SqliteStore
    from backchannel.testing import FakeClock

    async def check() -> None:
        clock = FakeClock()
        path = tmp_path / "hub.db"
        async with (
            Hub(SqliteStore(path), clock=clock, background=False) as hub,
            Hub(SqliteStore(path), clock=clock, background=False) as other,
        ):
            await hub.create_team("w")
            member, _ = await hub.add_member("w", "lead")
            watcher = Watcher(hub, "w", Principal(member))
            assert await watcher.revoked() is None
            await other.rotate_token("w", "lead")
            assert await watcher.revoked() is None, "the last check is fresh"
            clock.advance(TOKEN_CACHE_SECONDS)
            error = await watcher.revoked()
            assert error is not None
            assert "rotated or its member removed while the dashboard watched" in error.message
            assert await Watcher(hub, "w", Principal(None)).revoked() is None, "the admin"
            # a rotation by the watcher's own hub counts at once
            peer_member, _ = await hub.add_member("w", "peer")
            peer = Watcher(hub, "w", Principal(peer_member))
            assert await peer.revoked() is None
            await hub.rotate_token("w", "peer")
            assert await peer.revoked() is not None

    # the browser tests of this folder keep an event loop running on this thread
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, check()).result()


def test_another_teams_ids_answer_as_unknown(make_team: Callable[..., Team]) -> None:
    """A team's human (who sees all of its own team) asks its own team's endpoints for
    another team's message and session by id, and the other team's stream with its own
    ticket: each is answered as unknown, and nothing of the other team shows."""
    mine, theirs = make_team("a"), make_team("b", "c")
    mid = theirs.send("b", "c", "the other team's secret")
    sid = theirs.open_session("b", "theirs-s")
    theirs.report("b", sid, "turn_start")
    theirs.report("b", sid, "thought", "the other team's secret")
    base = f"/v1/dashboard/teams/{mine.name}"
    with mine.client("user") as c:
        for path in (f"{base}/messages/{mid}", f"{base}/sessions/{sid}"):
            r = c.get(path)
            assert r.status_code == 404, (path, r.text)
            assert "secret" not in r.text
        r = c.get(f"/v1/dashboard/teams/{theirs.name}/sessions/{sid}")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_team")
        r = c.get(
            f"/v1/dashboard/teams/{theirs.name}/stream",
            params={"ticket": _ticket(mine, "user")},
        )
        assert r.status_code == 404, r.text
        assert "secret" not in r.text
