"""The dashboard's HTTP side, without a browser: page, assets, tickets, stream, reads."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx

from backchannel.interfaces.dashboard import _ticket_key, issue_ticket
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


def test_planned_panels_answer_empty_lists(team: Team) -> None:
    with team.client("lead") as c:
        snap = c.get(f"/v1/dashboard/teams/{team.name}/snapshot").json()
        assert snap["links"] == [] or isinstance(snap["links"], list)
        for name in ("links", "timers", "delegations"):
            r = c.get(f"/v1/dashboard/teams/{team.name}/{name}")
            assert r.status_code == 200
            assert isinstance(r.json()[name], list)


def test_session_view(team: Team) -> None:
    sid = team.open_session("lead")
    with team.client("reviewer") as c:
        r = c.get(f"/v1/dashboard/teams/{team.name}/sessions/{sid}")
        assert r.status_code == 200
        body = r.json()
        assert body["session"]["member"] == "lead"
        assert body["session"]["state"] == "idle"
        assert isinstance(body["transcript"], list)
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


def test_message_detail_for_any_team_member(team: Team) -> None:
    mid = team.send("lead", "worker", "line one\nline two", summary="two lines")
    with team.client("reviewer") as c:  # neither sender nor recipient, but in the team
        r = c.get(f"/v1/dashboard/teams/{team.name}/messages/{mid}")
        assert r.status_code == 200
        body = r.json()
    assert body["text"] == "line one\nline two"
    assert body["deliveries"][0]["to"] == "worker"
    assert [e["event"] for e in body["history"]] == ["queued"]


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
