"""Delegation over real sockets: in one hub, and across two hubs with their own data."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server, free_port, start_server
from tests.helpers_hubs import budget_notices
from tests.peers import Peer, QuietHandler


def _wait_inbox(c: httpx.Client, session: str, kind: str, seconds: float = 20) -> dict[str, Any]:
    def arrived() -> dict[str, Any] | None:
        got = c.get("/v1/inbox", params={"session": session, "wait": 2, "limit": 20}).json()[
            "messages"
        ]
        if got:
            c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        return next((m for m in got if m["kind"] == kind), None)

    return eventually_blocking(arrived, what=f"a {kind} message for {session}", within=seconds)


def _play_callee(c: httpx.Client, member: str, answer: str, seconds: float = 20) -> str:
    """Find the task in one of the member's sessions and answer it, as a runtime would."""

    def answered() -> str | None:
        for s in c.get("/v1/sessions", params={"member": member}).json()["sessions"]:
            got = c.get("/v1/inbox", params={"session": s["session_id"], "limit": 5}).json()[
                "messages"
            ]
            for m in got:
                c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"]]})
                if m["kind"] == "delegation":
                    sid = s["session_id"]
                    c.post(
                        f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": m["text"]}
                    )
                    c.post(
                        f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": answer}
                    )
                    return str(m["text"])
        return None

    return eventually_blocking(answered, what=f"a task for {member}", within=seconds)


def test_in_hub_round_trip(server: Server) -> None:
    with server.client() as admin:
        admin.post("/v1/teams", json={"name": "t", "settings": {"anchor_policy": "off"}})
        lead = admin.post("/v1/teams/t/members", json={"name": "lead"}).json()["token"]
        worker = admin.post("/v1/teams/t/members", json={"name": "worker"}).json()["token"]
    with server.client(lead) as c, server.client(worker) as w:
        c.post("/v1/sessions", json={"session_id": "lead-s"})
        c.post("/v1/sessions/lead-s/events", json={"kind": "turn_start"})
        r = c.post(
            "/v1/delegations", json={"to": "worker", "task": "count files", "tool_use_id": "tu_1"}
        )
        assert r.status_code == 201
        assert (r.json()["state"], r.json()["callee_session"]) == ("pending", "lead-s--tu_1")
        c.post("/v1/sessions/lead-s/events", json={"kind": "agent_stop", "text": ""})
        assert _play_callee(w, "worker", "12 files") == "count files"
        result = _wait_inbox(c, "lead-s", "tool_result")
        assert result["text"] == "Result of delegate(to='worker') [tu_1]:\n12 files"
        listed = c.get("/v1/delegations").json()["delegations"]
        assert [d["state"] for d in listed] == ["answered"]


def test_a_member_sees_only_its_own_delegations(server: Server) -> None:
    # a delegation carries its task and its result, as a message does: a member lists
    # and reads those it made or was asked, as it reads only messages it sent or got;
    # the team's human sees the team's
    with server.client() as admin:
        r = admin.post("/v1/teams", json={"name": "t", "settings": {"anchor_policy": "off"}})
        user = r.json()["user_token"]
        tokens = {
            name: admin.post("/v1/teams/t/members", json={"name": name}).json()["token"]
            for name in ("lead", "worker", "outsider")
        }
    with server.client(tokens["lead"]) as lead, server.client(tokens["outsider"]) as other:
        lead.post("/v1/sessions", json={"session_id": "lead-s"})
        lead.post("/v1/sessions/lead-s/events", json={"kind": "turn_start"})
        r = lead.post(
            "/v1/delegations", json={"to": "worker", "task": "the secret plan", "tool_use_id": "t1"}
        )
        assert r.status_code == 201, r.text
        did = r.json()["delegation_id"]
        assert other.get("/v1/delegations").json()["delegations"] == []
        assert other.get("/v1/delegations", params={"member": "lead"}).json()["delegations"] == []
        r = other.get(f"/v1/delegations/{did}")
        assert r.status_code == 404, r.text
        assert "the secret plan" not in r.text
        assert "that you made or were asked" in r.json()["error"]["message"]
        for token in (tokens["lead"], tokens["worker"], user):
            with server.client(token) as c:
                listed = c.get("/v1/delegations").json()["delegations"]
                assert [d["delegation_id"] for d in listed] == [did]
                assert c.get(f"/v1/delegations/{did}").status_code == 200


def _hub_env(me: str, other: str, other_url: str, token: str | None = None) -> dict[str, str]:
    """The settings of hub ``me`` that knows hub ``other`` at ``other_url`` (and, with
    ``token``, holds its member token on ``other``)."""
    env = {
        "BACKCHANNEL_SERVICE_NAME": me,
        "BACKCHANNEL_CALLBACK_SECRET": f"secret-of-{me.removeprefix('hub-')}",
        "BACKCHANNEL_CALLBACKS": f"{other}={other_url}",
    }
    if token is not None:
        env["BACKCHANNEL_CALLBACK_TOKENS"] = f"{other}={token}"
    return env


def _member(admin: httpx.Client, team: str, name: str) -> str:
    token: str = admin.post(f"/v1/teams/{team}/members", json={"name": name}).json()["token"]
    return token


def _start_two_hubs(
    tmp_path: Path, port_a: int, a_as_seen_by_b: str
) -> tuple[Server, Server, dict[str, str]]:
    port_b = free_port()
    url_b = f"http://127.0.0.1:{port_b}"
    hub_b = start_server(
        tmp_path / "b", port=port_b, env=_hub_env("hub-b", "hub-a", a_as_seen_by_b)
    )
    with hub_b.client() as admin:
        admin.post("/v1/teams", json={"name": "workers"})
        worker, caller = _member(admin, "workers", "worker"), _member(admin, "workers", "hub-a")
    hub_a = start_server(tmp_path / "a", port=port_a, env=_hub_env("hub-a", "hub-b", url_b, caller))
    with hub_a.client() as admin:
        admin.post("/v1/teams", json={"name": "leads", "settings": {"anchor_policy": "off"}})
        lead = _member(admin, "leads", "lead")
    return hub_a, hub_b, {"lead": lead, "worker": worker, "caller": caller}


@pytest.fixture
def two_hubs(tmp_path: Path) -> Iterator[tuple[Server, Server, dict[str, str]]]:
    port_a = free_port()
    hub_a, hub_b, tokens = _start_two_hubs(tmp_path, port_a, f"http://127.0.0.1:{port_a}")
    try:
        yield hub_a, hub_b, tokens
    finally:
        hub_a.stop()
        hub_b.stop()


@pytest.mark.slow
def test_cross_hub_round_trip(two_hubs: tuple[Server, Server, dict[str, str]]) -> None:
    hub_a, hub_b, tokens = two_hubs
    with hub_a.client(tokens["lead"]) as lead, hub_b.client(tokens["worker"]) as worker:
        lead.post("/v1/sessions", json={"session_id": "lead-s"})
        lead.post("/v1/sessions/lead-s/events", json={"kind": "turn_start"})
        r = lead.post(
            "/v1/delegations",
            json={"to": "worker@hub-b", "task": "list every TODO", "tool_use_id": "tu_x"},
        )
        assert r.status_code == 201, r.text
        lead.post("/v1/sessions/lead-s/events", json={"kind": "agent_stop", "text": ""})
        assert _play_callee(worker, "worker", "3 TODOs: a, b, c") == "list every TODO"
        sessions = [
            s["session_id"]
            for s in worker.get("/v1/sessions", params={"member": "worker"}).json()["sessions"]
        ]
        assert sessions == ["hub-a:lead-s--tu_x"]
        result = _wait_inbox(lead, "lead-s", "tool_result")
        assert result["text"] == "Result of delegate(to='worker@hub-b') [tu_x]:\n3 TODOs: a, b, c"


@pytest.mark.slow
def test_cross_hub_ingress_refusals(two_hubs: tuple[Server, Server, dict[str, str]]) -> None:
    hub_a, hub_b, tokens = two_hubs
    with hub_b.client(tokens["caller"]) as c:
        bad = c.post(
            "/api/chat",
            json={
                "agent": "worker",
                "message": "x",
                "reply": {"callbackService": "evil", "bearerToken": "t"},
            },
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "unknown_callback_service"
        ok = c.post(
            "/api/chat",
            json={
                "agent": "worker",
                "message": "x",
                "reply": {"callbackService": "hub-a", "bearerToken": "t"},
            },
        )
        assert ok.status_code == 202
        odd = c.post(
            "/api/chat",
            json={
                "agent": "worker",
                "message": "x",
                "reply": {"callbackService": "hub-a", "bearerToken": "t\u00f8ken"},
            },
        )
        assert odd.status_code == 422, odd.text
        assert "reply.bearerToken" in odd.text
    for token in ("garbage", "e30.AAAA", "x.y.z"):
        r = httpx.post(
            f"{hub_a.url}/api/tools/response",
            json={"result": "x"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 401, token
    r = httpx.post(
        f"{hub_b.url}/v1/tools/response",
        json={"result": "x"},
        headers={"Authorization": "Bearer a.b"},
    )
    assert r.status_code == 401


class DropFirstAck(Peer):
    """A proxy in front of hub A as hub B reaches it: it forwards every request, but cuts
    the connection instead of relaying hub A's answer to the first tool response, as a
    network fault after hub A committed would."""

    def __init__(self, upstream: str) -> None:
        self.relayed: list[tuple[str, int, bool]] = []  # path, upstream status, dropped
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type")
                }
                r = httpx.post(upstream + self.path, content=body, headers=headers, timeout=30)
                drop = self.path.endswith("/tools/response") and not any(
                    d for _, _, d in outer.relayed
                )
                outer.relayed.append((self.path, r.status_code, drop))
                if drop:
                    self.close_connection = True
                    return  # no status line: the caller sees the connection cut
                self.send_response(r.status_code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

        self.serve(Handler)


def _reply_jobs(hub: Server) -> list[tuple[str, dict[str, Any]]]:
    """Hub B's answer POSTs as its own database holds them: (state, payload)."""
    with contextlib.closing(sqlite3.connect(hub.home / "backchannel.db")) as db:
        rows = db.execute("SELECT state, payload FROM jobs WHERE kind = 'outbox'").fetchall()
    jobs = [(state, json.loads(payload)) for state, payload in rows]
    return [(state, p) for state, p in jobs if p.get("purpose") == "reply"]


@pytest.mark.slow
def test_a_lost_acknowledgement_is_no_dead_letter(tmp_path: Path) -> None:
    """Hub A takes the answer, its acknowledgement is lost on the way back, hub B sends
    the answer again: hub A acknowledges the repeat, hub B records the answer as
    delivered and tells its agent nothing false; the lead gets the result once."""
    port_a = free_port()
    proxy = DropFirstAck(f"http://127.0.0.1:{port_a}")
    hub_a, hub_b, tokens = _start_two_hubs(tmp_path, port_a, proxy.url)
    try:
        with hub_a.client(tokens["lead"]) as lead, hub_b.client(tokens["worker"]) as worker:
            lead.post("/v1/sessions", json={"session_id": "lead-s"})
            lead.post("/v1/sessions/lead-s/events", json={"kind": "turn_start"})
            r = lead.post(
                "/v1/delegations",
                json={"to": "worker@hub-b", "task": "list every TODO", "tool_use_id": "tu_x"},
            )
            assert r.status_code == 201, r.text
            lead.post("/v1/sessions/lead-s/events", json={"kind": "agent_stop", "text": ""})
            _play_callee(worker, "worker", "3 TODOs: a, b, c")
            result = _wait_inbox(lead, "lead-s", "tool_result")
            assert result["text"].endswith("3 TODOs: a, b, c")
            # wait until hub B has recorded how its answer POST ended
            jobs = eventually_blocking(
                lambda: j if (j := _reply_jobs(hub_b)) and j[0][0] != "pending" else None,
                what="hub B to finish its answer POST",
                within=30,
            )
            assert [(path, status, dropped) for path, status, dropped in proxy.relayed] == [
                ("/api/tools/response", 200, True),
                ("/api/tools/response", 200, False),
            ]
            [(state, payload)] = jobs
            assert (state, payload["attempt"]) == ("done", 2)
            assert payload["bearer"] is None, "a finished POST keeps no credentials"
            [d] = worker.get("/v1/delegations").json()["delegations"]
            assert (d["state"], d["error"]) == ("answered", None)
            notes = worker.get("/v1/inbox", params={"limit": 20}).json()["messages"]
            assert not [m for m in notes if "could not be delivered" in m["text"]]
            more = lead.get("/v1/inbox", params={"session": "lead-s", "limit": 20}).json()
            assert more["messages"] == [], "the repeated answer was not delivered twice"
            [mine] = lead.get("/v1/delegations").json()["delegations"]
            assert (mine["state"], mine["result"]) == ("answered", "3 TODOs: a, b, c")
            # the same token once more, straight to hub A: the same answer is acknowledged,
            # a different one is a conflict, a forged one is unauthorized
            with contextlib.closing(sqlite3.connect(hub_b.home / "backchannel.db")) as db:
                [(token,)] = db.execute("SELECT reply_token FROM delegations").fetchall()
            url, auth = f"{hub_a.url}/api/tools/response", {"Authorization": f"Bearer {token}"}
            same = httpx.post(url, json={"result": "3 TODOs: a, b, c"}, headers=auth)
            assert (same.status_code, same.json()["state"]) == (200, "answered")
            other = httpx.post(url, json={"result": "4 TODOs"}, headers=auth)
            assert other.status_code == 409
            assert "already answered with a different result" in other.json()["error"]["message"]
            forged = httpx.post(
                url, json={"result": "x"}, headers={"Authorization": f"Bearer {token}x"}
            )
            assert forged.status_code == 401
    finally:
        hub_a.stop()
        hub_b.stop()
        proxy.close()


# -- the chain budget across hubs ----------------------------------------------------------


def _start_hubs_both_ways(
    tmp_path: Path, chain_budget: int, pair_budget: int | None = None
) -> tuple[Server, Server, dict[str, str]]:
    """Two hubs whose agents can delegate to each other: ``lead`` on hub A (team
    ``leads``) and ``worker`` on hub B (team ``workers``), each hub a member of the other's
    team. Hub A starts again once hub B's token for it exists."""
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    settings: dict[str, Any] = {"anchor_policy": "off", "chain_budget": chain_budget}
    if pair_budget is not None:
        settings["pair_budget"] = pair_budget
    hub_a = start_server(tmp_path / "a", port=port_a, env=_hub_env("hub-a", "hub-b", url_b))
    with hub_a.client() as admin:
        made = admin.post("/v1/teams", json={"name": "leads", "settings": settings}).json()
        tokens = {"user_a": made["user_token"], "lead": _member(admin, "leads", "lead")}
        b_on_a = _member(admin, "leads", "hub-b")
    hub_b = start_server(tmp_path / "b", port=port_b, env=_hub_env("hub-b", "hub-a", url_a, b_on_a))
    with hub_b.client() as admin:
        made = admin.post("/v1/teams", json={"name": "workers", "settings": settings}).json()
        tokens["user_b"] = made["user_token"]
        tokens["worker"] = _member(admin, "workers", "worker")
        a_on_b = _member(admin, "workers", "hub-a")
    hub_a.stop()  # again, now with its token on hub B
    hub_a = start_server(tmp_path / "a", port=port_a, env=_hub_env("hub-a", "hub-b", url_b, a_on_b))
    return hub_a, hub_b, tokens


def _task_waiting(c: httpx.Client, member: str) -> tuple[str, dict[str, Any]] | None:
    """One look for a task in one of ``member``'s sessions, acking what each session got
    on the way. Returns the session and the task, or None."""
    for s in c.get("/v1/sessions", params={"member": member}).json()["sessions"]:
        sid = s["session_id"]
        got = c.get("/v1/inbox", params={"session": sid, "limit": 20}).json()["messages"]
        if got:
            c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        found = next((m for m in got if m["kind"] == "delegation"), None)
        if found is not None:
            return sid, found
    return None


def _take_task(c: httpx.Client, member: str, what: str) -> tuple[str, dict[str, Any]]:
    """Wait for a task in one of ``member``'s sessions (see ``_task_waiting``). Returns the
    session and the task."""
    found: tuple[str, dict[str, Any]] = eventually_blocking(
        lambda: _task_waiting(c, member), what=what, within=30
    )
    return found


def _delegate_on(
    c: httpx.Client, sid: str, task: dict[str, Any], to: str, n: int
) -> httpx.Response:
    """The turn in session ``sid`` on ``task``: it delegates the task on to ``to`` as
    ``tu_{n}`` and ends. Returns the delegate answer."""
    c.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": task["text"]})
    r = c.post(
        "/v1/delegations",
        json={"to": to, "task": f"pass it on ({n})", "tool_use_id": f"tu_{n}", "session": sid},
    )
    c.post(f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": f"passed on {n}"})
    return r


def _pass_on(
    c: httpx.Client, member: str, to: str, n: int
) -> tuple[dict[str, Any], httpx.Response]:
    """Play ``member``: take the task waiting in one of its sessions, delegate it on to
    ``to`` in the same turn, end the turn. Returns the task and the delegate answer."""
    sid, m = _take_task(c, member, what=f"task {n} for {member}")
    return m, _delegate_on(c, sid, m, to, n)


def _answer_task(c: httpx.Client, member: str, answer: str) -> dict[str, Any]:
    """Play ``member``: take the task waiting in one of its sessions and answer it with
    the turn's closing text. Returns the task."""

    sid, m = _take_task(c, member, what=f"a task for {member}")
    c.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start", "text": m["text"]})
    c.post(f"/v1/sessions/{sid}/events", json={"kind": "agent_stop", "text": answer})
    return m


@dataclass
class Ring:
    """Two hubs' agents that always delegate to each other, driven to the chain budget."""

    lead: httpx.Client
    worker: httpx.Client
    start: dict[str, Any]  # the human's message that started the chain
    tasks: list[tuple[str, str, int]]  # (member, chain id, hop) of each task taken


def first_delegation(lead: httpx.Client, user_a: httpx.Client) -> dict[str, Any]:
    """The human's "start" to lead (hub A), taken in a turn of lead's session ``lead-s``
    that delegates "pass it on (0)" to worker (hub B) and ends: the start's send answer,
    whose id names the chain every task of the ring goes on in."""
    start: dict[str, Any] = user_a.post("/v1/messages", json={"to": "lead", "text": "start"}).json()
    lead.post("/v1/sessions", json={"session_id": "lead-s"})
    got = lead.get("/v1/inbox", params={"session": "lead-s", "limit": 5}).json()
    lead.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got["messages"]]})
    lead.post("/v1/sessions/lead-s/events", json={"kind": "turn_start", "text": "start"})
    first = lead.post(
        "/v1/delegations",
        json={"to": "worker@hub-b", "task": "pass it on (0)", "tool_use_id": "tu_0"},
    )
    assert first.status_code == 201, first.text
    lead.post("/v1/sessions/lead-s/events", json={"kind": "agent_stop", "text": ""})
    return start


@contextlib.contextmanager
def ring_to_the_budget(
    hub_a: Server, hub_b: Server, tokens: dict[str, str], budget: int
) -> Iterator[Ring]:
    """lead (hub A) delegates to worker (hub B), whose turn on the task delegates back to
    lead, and so on, until the delegation past ``budget`` is refused. Checks what every
    route must show (each task one hop further in the human's chain, the refusal a 429
    ``budget_exhausted`` of the chain, both hubs' humans told, no delegation made by the
    refused call), then yields the ring for what a route adds."""
    with (
        hub_a.client(tokens["lead"]) as lead,
        hub_b.client(tokens["worker"]) as worker,
        hub_a.client(tokens["user_a"]) as user_a,
        hub_b.client(tokens["user_b"]) as user_b,
    ):
        start = first_delegation(lead, user_a)
        tasks: list[tuple[str, str, int]] = []
        refused = None
        players = [(worker, "worker", "lead@hub-a"), (lead, "lead", "worker@hub-b")]
        for n in range(1, 2 * budget):
            c, member, to = players[(n - 1) % 2]
            task, r = _pass_on(c, member, to, n)
            tasks.append((member, task["chain_id"], task["hop"]))
            if r.status_code != 201:
                refused = r
                break
        assert tasks == [
            (("worker", "lead")[i % 2], start["message_id"], i + 1) for i in range(budget)
        ]
        assert refused is not None and refused.status_code == 429, refused
        error = refused.json()["error"]
        assert (error["code"], error["budget"]) == ("budget_exhausted", "chain")
        assert error["key"] == f"chain:{start['message_id']}"
        assert error["message"].startswith("not sent: this conversation chain")
        # the task that reached the budget spent it on both hubs: their humans are told
        for user in (user_a, user_b):
            notes = budget_notices(user, "chain")
            assert "budget extend" in notes[0]["text"]
        # nothing was sent past the budget: the refused call left no delegation
        mine = lead.get("/v1/delegations").json()["delegations"]
        assert f"tu_{len(tasks)}" not in {d["tool_use_id"] for d in mine}
        yield Ring(lead, worker, start, tasks)


@pytest.mark.slow
def test_agents_of_two_hubs_that_always_delegate_to_each_other_stop_at_the_chain_budget(
    tmp_path: Path,
) -> None:
    """lead (hub A) delegates to worker (hub B), whose turn on the task delegates back to
    lead, and so on: each task carries its chain to the other hub, one hop further, until
    the delegation past chain_budget is refused like a send of this hub."""
    budget = 4
    hub_a, hub_b, tokens = _start_hubs_both_ways(tmp_path, budget)
    try:
        with ring_to_the_budget(hub_a, hub_b, tokens, budget):
            pass  # what every route shows is checked by the ring itself
    finally:
        hub_a.stop()
        hub_b.stop()


def ask_again_to_the_budget(
    hub_a: Server, hub_b: Server, tokens: dict[str, str], budget: int
) -> None:
    """lead (hub A) delegates to worker (hub B); worker answers; lead's turn on the answer
    delegates again, and so on, until a delegation is refused (or a deadline in rounds
    passes: the exchange never stopped). Each answer comes back one hop past the task, so
    the tasks go out at hops 1, 3, 5, ... of the human's chain, and the one past the
    budget is refused as a chain's."""
    with (
        hub_a.client(tokens["lead"]) as lead,
        hub_b.client(tokens["worker"]) as worker,
        hub_a.client(tokens["user_a"]) as user_a,
    ):
        start = first_delegation(lead, user_a)
        hops: list[tuple[str, int]] = []
        refused = None
        for n in range(1, 4 * budget):
            task = _answer_task(worker, "worker", f"answer {n}")
            hops.append((task["chain_id"], task["hop"]))
            result = _wait_inbox(lead, "lead-s", "tool_result")
            lead.post(
                "/v1/sessions/lead-s/events", json={"kind": "turn_start", "text": result["text"]}
            )
            r = lead.post(
                "/v1/delegations",
                json={"to": "worker@hub-b", "task": f"again ({n})", "tool_use_id": f"tu_{n}"},
            )
            lead.post("/v1/sessions/lead-s/events", json={"kind": "agent_stop", "text": ""})
            if r.status_code != 201:
                refused = r
                break
        assert refused is not None, f"still asking after {len(hops)} answers: {hops}"
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["budget"], error["key"]) == ("chain", f"chain:{start['message_id']}")
        assert hops == [(start["message_id"], hop) for hop in range(1, budget + 1, 2)]


@pytest.mark.slow
def test_a_lead_that_asks_another_hub_again_on_every_answer_stops_at_the_chain_budget(
    tmp_path: Path,
) -> None:
    """The answer to /api/tools/response names the chain it goes on in: lead's next task
    goes on from there instead of leaving at the same hop every time."""
    budget = 5
    hub_a, hub_b, tokens = _start_hubs_both_ways(tmp_path, budget)
    try:
        ask_again_to_the_budget(hub_a, hub_b, tokens, budget)
    finally:
        hub_a.stop()
        hub_b.stop()


@pytest.mark.slow
def test_a_chat_with_a_bad_chain_is_refused_naming_the_field(
    two_hubs: tuple[Server, Server, dict[str, str]],
) -> None:
    _, hub_b, tokens = two_hubs
    base = {
        "agent": "worker",
        "message": "x",
        "reply": {"callbackService": "hub-a", "bearerToken": "t"},
    }
    bad = [
        ({"id": "", "hop": 1}, "chain.id"),
        ({"id": "-starts-with-a-dash", "hop": 1}, "chain.id"),
        ({"id": "has space", "hop": 1}, "chain.id"),
        ({"id": "x" * 129, "hop": 1}, "chain.id"),
        ({"id": 12, "hop": 1}, "chain.id"),
        ({"hop": 1}, "chain.id"),
        ({"id": "c1", "hop": -1}, "chain.hop"),
        ({"id": "c1", "hop": 1_000_001}, "chain.hop"),
        ({"id": "c1", "hop": 2**70}, "chain.hop"),
        ({"id": "c1", "hop": 1.5}, "chain.hop"),
        ({"id": "c1", "hop": 2.0}, "chain.hop"),
        ({"id": "c1", "hop": "3"}, "chain.hop"),
        ({"id": "c1", "hop": True}, "chain.hop"),
        ({"id": "c1"}, "chain.hop"),
        ("c1", "chain"),
        ([["c1", 1]], "chain"),
    ]
    with hub_b.client(tokens["caller"]) as c, hub_b.client(tokens["worker"]) as worker:
        for chain, field in bad:
            r = c.post("/api/chat", json={**base, "chain": chain})
            assert r.status_code == 422, (chain, r.text)
            problems = r.json()["error"]["problems"]
            assert field in {p["field"] for p in problems}, (chain, problems)
        assert worker.get("/v1/delegations").json()["delegations"] == []
        # a good chain is taken at its hop; no chain starts a new one at hop 0
        ok = c.post(
            "/api/chat",
            json={**base, "tool_use_id": "tu_c", "chain": {"id": "chain-1:x", "hop": 3}},
        )
        assert ok.status_code == 202, ok.text
        plain = c.post("/api/chat", json={**base, "tool_use_id": "tu_p"})
        assert plain.status_code == 202, plain.text
        by_session = {}
        for sid in (ok.json()["session"], plain.json()["session"]):
            got = worker.get("/v1/inbox", params={"session": sid, "limit": 5}).json()["messages"]
            [task] = [m for m in got if m["kind"] == "delegation"]
            by_session[sid] = (task["chain_id"], task["hop"], task["message_id"])
        assert by_session[ok.json()["session"]][:2] == ("chain-1:x", 3)
        chain_id, hop, message_id = by_session[plain.json()["session"]]
        assert (chain_id, hop) == (message_id, 0)


# -- two callers of one team ---------------------------------------------------------------


class ReplyRecorder(Peer):
    """Where the callers' hubs would take their answers: records every POST (path, bearer,
    body) and acknowledges it."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, dict[str, Any]]] = []
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                bearer = self.headers.get("authorization", "").partition(" ")[2]
                outer.got.append((self.path, bearer, json.loads(body)))
                raw = b'{"state": "answered"}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.serve(Handler)


def _answer_each(c: httpx.Client, member: str, count: int) -> list[str]:
    """Play ``member``: answer each of ``count`` tasks, in whichever of its sessions it
    waits, with ``done: <task>``. Returns the tasks' texts."""
    seen: list[str] = []

    def all_answered() -> list[str] | None:
        for s in c.get("/v1/sessions", params={"member": member}).json()["sessions"]:
            sid = s["session_id"]
            got = c.get("/v1/inbox", params={"session": sid, "limit": 5}).json()["messages"]
            for m in got:
                c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"]]})
                if m["kind"] == "delegation":
                    c.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"})
                    c.post(
                        f"/v1/sessions/{sid}/events",
                        json={"kind": "agent_stop", "text": f"done: {m['text']}"},
                    )
                    seen.append(str(m["text"]))
        return seen if len(seen) >= count else None

    return eventually_blocking(all_answered, what=f"{count} tasks for {member}", within=20)


@pytest.mark.slow
def test_two_callers_with_the_same_ids_each_get_their_own_delegation(tmp_path: Path) -> None:
    """Two callers of one team (hub-a, hub-c) send tasks with the same session_id and
    tool_use_id: each is its own delegation, run and answered to its own caller; neither
    is told anything of the other's, and a repeat by either returns its own."""
    recorder = ReplyRecorder()
    hub_b = start_server(
        tmp_path / "b",
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-b",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-b",
            "BACKCHANNEL_CALLBACKS": f"hub-a={recorder.url},hub-c={recorder.url}",
        },
    )
    try:
        with hub_b.client() as admin:
            admin.post("/v1/teams", json={"name": "workers"})
            worker = _member(admin, "workers", "worker")
            caller_a, caller_c = (
                _member(admin, "workers", "hub-a"),
                _member(admin, "workers", "hub-c"),
            )
        ids = {"session_id": "lead-s", "tool_use_id": "tu_1"}

        def chat(c: httpx.Client, service: str, text: str) -> httpx.Response:
            return c.post(
                "/api/chat",
                json={
                    "agent": "worker",
                    "message": text,
                    **ids,
                    "reply": {"callbackService": service, "bearerToken": f"reply-for-{service}"},
                },
            )

        with (
            hub_b.client(caller_a) as a,
            hub_b.client(caller_c) as c,
            hub_b.client(worker) as w,
        ):
            first_a = chat(a, "hub-a", "the task of A")
            assert first_a.status_code == 202, first_a.text
            first_c = chat(c, "hub-c", "the task of C")
            assert first_c.status_code == 202, first_c.text
            mine_a, mine_c = first_a.json(), first_c.json()
            assert mine_c["delegation_id"] != mine_a["delegation_id"]
            assert mine_c["session"] != mine_a["session"]
            assert mine_a["delegation_id"] not in first_c.text
            assert mine_a["session"] not in first_c.text
            # a repeat is idempotent for its own caller only
            assert chat(c, "hub-c", "the task of C").json() == mine_c
            assert chat(a, "hub-a", "the task of A").json() == mine_a
            # both tasks ran, each answered to its own caller's service
            assert sorted(_answer_each(w, "worker", 2)) == ["the task of A", "the task of C"]
            replies = eventually_blocking(
                lambda: list(recorder.got) if len(recorder.got) >= 2 else None,
                what="both answers at the callers' services",
                within=20,
            )
            assert sorted((bearer, body["result"]) for _, bearer, body in replies) == [
                ("reply-for-hub-a", "done: the task of A"),
                ("reply-for-hub-c", "done: the task of C"),
            ]
            listed = w.get("/v1/delegations").json()["delegations"]
            assert sorted((d["caller"], d["task"], d["state"]) for d in listed) == [
                ("hub-a", "the task of A", "answered"),
                ("hub-c", "the task of C", "answered"),
            ]
    finally:
        hub_b.stop()
        recorder.close()


def test_a_member_names_only_a_callback_service_of_its_own_team(tmp_path: Path) -> None:
    """Services registered for teams (``BACKCHANNEL_CALLBACK_TEAMS``, or ``teams:`` in the
    config file) are theirs: a member of team workers that names team ops's service as its
    ``callbackService`` is refused (403, naming the service and the way out), no task is
    started and nothing is called back there; its own team's service is taken and answered
    to. A delegation through another team's service is refused the same way. A service
    registered for no team serves a hub of one team only: on this hub of two it is refused
    too (naming the setting), and one registered for every team (``*``) is every team's."""
    rec_workers, rec_ops = ReplyRecorder(), ReplyRecorder()
    hub_b = start_server(
        tmp_path / "b",
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-b",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-b",
            "BACKCHANNEL_CALLBACKS": (
                f"hub-a={rec_workers.url},hub-c={rec_ops.url},shared={rec_workers.url},"
                f"unset={rec_ops.url}"
            ),
            "BACKCHANNEL_CALLBACK_TEAMS": "hub-a=workers,hub-c=ops,shared=*",
        },
    )
    try:
        with hub_b.client() as admin:
            admin.post("/v1/teams", json={"name": "workers"})
            admin.post("/v1/teams", json={"name": "ops"})
            worker = _member(admin, "workers", "worker")
            caller = _member(admin, "workers", "hub-a")
            ops = _member(admin, "ops", "opsbot")

        with hub_b.client(caller) as a, hub_b.client(worker) as w, hub_b.client(ops) as o:
            refused = _task(a, "hub-c", "tu_other")
            assert refused.status_code == 403, refused.text
            error = refused.json()["error"]
            assert error["code"] == "callback_service_not_allowed", error
            assert "'hub-c'" in error["message"], error
            assert "BACKCHANNEL_CALLBACK_TEAMS" in error["message"], error
            assert "ops" not in error["message"], "another team's name is not told"
            assert w.get("/v1/delegations").json()["delegations"] == []
            assert w.get("/v1/sessions").json()["sessions"] == []
            ok = _task(a, "hub-a", "tu_own")
            assert ok.status_code == 202, ok.text
            assert _task(a, "shared", "tu_shared").status_code == 202
            unset = _task(a, "unset", "tu_unset")  # no teams, on a hub of two teams
            assert unset.status_code == 403, unset.text
            error = unset.json()["error"]
            assert error["code"] == "callback_service_not_allowed", error
            assert "BACKCHANNEL_CALLBACK_TEAMS=unset=" in error["message"], error
            assert "ops" not in error["message"], "another team's name is not told"
            assert sorted(_answer_each(w, "worker", 2)) == ["task tu_own", "task tu_shared"]
            replies = eventually_blocking(
                lambda: list(rec_workers.got) if len(rec_workers.got) >= 2 else None,
                what="the answers at the caller's own services",
                within=20,
            )
            assert sorted(bearer for _, bearer, _ in replies) == ["reply-tu_own", "reply-tu_shared"]
            assert rec_ops.got == [], "nothing was called back at another team's service"
            # delegating through another team's service is refused alike
            o.post("/v1/sessions", json={"session_id": "ops-s"})
            o.post("/v1/sessions/ops-s/events", json={"kind": "turn_start"})
            r = o.post("/v1/delegations", json={"to": "lead@hub-a", "task": "x"})
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "callback_service_not_allowed"
            assert "'hub-a'" in r.json()["error"]["message"]
            r = o.post("/v1/delegations", json={"to": "lead@unset", "task": "x"})
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "callback_service_not_allowed"
            assert rec_ops.got == [], "nothing was called back at a service of no team"
    finally:
        hub_b.stop()
        rec_workers.close()
        rec_ops.close()


def test_a_task_names_a_bound_callback_service_only_as_its_member(tmp_path: Path) -> None:
    """A service whose ``member:`` names the member of this hub its tasks come in as
    (``BACKCHANNEL_CALLBACK_MEMBERS``) is that member's: another member of the team that
    names it as the ``callbackService`` of a task is refused (403, naming the service, the
    member it is bound to and the way out), no task is started and nothing is sent to the
    service's URL, where the answer would go to a hub that never asked; the bound member
    itself is taken and answered. A member of another team is refused by ``teams:`` first,
    and is not told the member."""
    rec = ReplyRecorder()
    hub_b = start_server(
        tmp_path / "b",
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-b",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-b",
            "BACKCHANNEL_CALLBACKS": f"hub-a={rec.url}",
            "BACKCHANNEL_CALLBACK_TEAMS": "hub-a=workers",
            "BACKCHANNEL_CALLBACK_MEMBERS": "hub-a=peer-a",
        },
    )
    try:
        with hub_b.client() as admin:
            admin.post("/v1/teams", json={"name": "workers"})
            admin.post("/v1/teams", json={"name": "ops"})
            worker = _member(admin, "workers", "worker")
            peer = _member(admin, "workers", "peer-a")
            other = _member(admin, "workers", "other")
            _member(admin, "ops", "worker")
            ops = _member(admin, "ops", "opsbot")

        with (
            hub_b.client(peer) as p,
            hub_b.client(other) as o,
            hub_b.client(worker) as w,
            hub_b.client(ops) as x,
        ):
            refused = _task(o, "hub-a", "tu_other")
            assert refused.status_code == 403, refused.text
            error = refused.json()["error"]
            assert error["code"] == "callback_service_not_allowed", error
            assert "'hub-a'" in error["message"] and "'peer-a'" in error["message"], error
            assert "BACKCHANNEL_CALLBACK_MEMBERS=hub-a=" in error["message"], error
            assert (error["service"], error["member"]) == ("hub-a", "peer-a"), error
            assert w.get("/v1/delegations").json()["delegations"] == []
            assert w.get("/v1/sessions").json()["sessions"] == []
            elsewhere = _task(x, "hub-a", "tu_ops")
            assert elsewhere.status_code == 403, elsewhere.text
            assert elsewhere.json()["error"]["code"] == "callback_service_not_allowed"
            assert "peer-a" not in elsewhere.text, "another team's member is not told"
            ok = _task(p, "hub-a", "tu_own")
            assert ok.status_code == 202, ok.text
            assert _answer_each(w, "worker", 1) == ["task tu_own"]
            replies = eventually_blocking(
                lambda: list(rec.got) or None, what="the answer at the service", within=20
            )
            assert [(bearer, body["result"]) for _, bearer, body in replies] == [
                ("reply-tu_own", "done: task tu_own")
            ]
            listed = w.get("/v1/delegations").json()["delegations"]
            assert [(d["caller"], d["state"]) for d in listed] == [("peer-a", "answered")]
    finally:
        hub_b.stop()
        rec.close()


def test_the_config_file_registers_a_service_for_teams(tmp_path: Path) -> None:
    from backchannel.callbacks import CallbackConfig
    from backchannel.errors import InvalidRequest, ServiceNotAllowed

    (tmp_path / "config.yaml").write_text(
        "callbacks:\n"
        "  hub-a: {url: 'http://127.0.0.1:1', teams: [workers, leads]}\n"
        "  open: 'http://127.0.0.1:2'\n"
    )
    cfg = CallbackConfig.load(tmp_path, env={})
    assert cfg.resolve("hub-a", team="leads", teams_in_hub=3).teams == frozenset(
        {"workers", "leads"}
    )
    # a service of no team serves the only team of a hub, and none of a hub of several
    assert cfg.resolve("open", team="ops", teams_in_hub=1).teams is None
    with pytest.raises(ServiceNotAllowed) as refused:
        cfg.resolve("open", team="ops", teams_in_hub=2)
    assert "teams: in the config file" in refused.value.message
    with pytest.raises(ServiceNotAllowed) as refused:
        cfg.resolve("hub-a", team="ops", teams_in_hub=1)
    assert "name one of this team's services (open)" in refused.value.message
    with pytest.raises(ServiceNotAllowed) as refused:
        cfg.resolve("hub-a", team="ops", teams_in_hub=2)
    assert "(none is registered)" in refused.value.message
    (tmp_path / "config.yaml").write_text("callbacks:\n  all: {url: 'http://x:1', teams: ['*']}\n")
    assert CallbackConfig.load(tmp_path, env={}).resolve("all", team="ops", teams_in_hub=9)
    for bad in ("[]", "'workers'", "[1]", "['has space']"):
        (tmp_path / "config.yaml").write_text(
            f"callbacks:\n  hub-a: {{url: 'http://127.0.0.1:1', teams: {bad}}}\n"
        )
        with pytest.raises(InvalidRequest, match="non-empty list of team names"):
            CallbackConfig.load(tmp_path, env={})
    with pytest.raises(InvalidRequest, match="not a registered callback service"):
        CallbackConfig.load(None, env={"BACKCHANNEL_CALLBACK_TEAMS": "nope=workers"})


def _task(c: httpx.Client, service: str, tuid: str) -> httpx.Response:
    """A task for ``worker`` over ``/api/chat``, answered at ``service``."""
    return c.post(
        "/api/chat",
        json={
            "agent": "worker",
            "message": f"task {tuid}",
            "session_id": "lead-s",
            "tool_use_id": tuid,
            "reply": {"callbackService": service, "bearerToken": f"reply-{tuid}"},
        },
    )


def test_serve_warns_of_services_of_no_team_on_a_hub_of_several(tmp_path: Path) -> None:
    """A hub of several teams starts with a warning naming each callback service
    registered for no team (none of them may use it) and the setting that names its
    teams; a hub of one team, which such a service serves, starts without one."""
    env = {"BACKCHANNEL_CALLBACKS": "peer=http://127.0.0.1:1,own=http://127.0.0.1:2"}
    env["BACKCHANNEL_CALLBACK_TEAMS"] = "own=alpha"
    home = tmp_path / "hub"
    hub = start_server(home, env=env)
    try:
        hub.team("alpha")
    finally:
        hub.stop()
    hub = start_server(home, env=env)  # one team: the service is that team's
    try:
        hub.team("beta")
    finally:
        hub.stop()
    assert "registered for no team" not in (home / "serve.log").read_text()
    hub = start_server(home, env=env)
    hub.stop()
    log = (home / "serve.log").read_text()
    [warning] = [line for line in log.splitlines() if "registered for no team" in line]
    assert "'peer'" in warning and "this hub has 2 teams" in warning, warning
    assert "BACKCHANNEL_CALLBACK_TEAMS=peer=" in warning, warning
    assert "'own'" not in log


def test_only_the_pending_delegations_when_asked(server: Server) -> None:
    """``pending_only``: the delegations still waiting for their answer, over HTTP, the
    SDK (``backchannel run``'s live table counts them every half second with it) and the
    command line (``--pending``); the rest are not read."""
    from backchannel.client import SyncClient
    from tests.test_cli_conventions import run

    with server.client() as admin:
        admin.post("/v1/teams", json={"name": "pend", "settings": {"anchor_policy": "off"}})
        lead = admin.post("/v1/teams/pend/members", json={"name": "lead"}).json()["token"]
        worker = admin.post("/v1/teams/pend/members", json={"name": "worker"}).json()["token"]
    with server.client(lead) as c, server.client(worker) as w:
        c.post("/v1/sessions", json={"session_id": "lead-s"}).raise_for_status()
        c.post("/v1/sessions/lead-s/events", json={"kind": "turn_start"}).raise_for_status()
        ids = []
        for n in (1, 2, 3):
            r = c.post(
                "/v1/delegations", json={"to": "worker", "task": f"t{n}", "tool_use_id": f"tu_{n}"}
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["delegation_id"])
        for event in ({"kind": "turn_start", "text": "t2"}, {"kind": "agent_stop", "text": "2"}):
            w.post("/v1/sessions/lead-s--tu_2/events", json=event).raise_for_status()
        assert [d["state"] for d in c.get("/v1/delegations").json()["delegations"]] == [
            "pending", "answered", "pending"
        ]  # fmt: skip
        r = c.get("/v1/delegations", params={"pending_only": "true", "limit": 1})
        assert [d["delegation_id"] for d in r.json()["delegations"]] == [ids[0]]
        after = r.json()["next_after"]
        r = c.get("/v1/delegations", params={"pending_only": "true", "after": after})
        assert [d["delegation_id"] for d in r.json()["delegations"]] == [ids[2]]
        assert r.json()["next_after"] is None
        r = w.get("/v1/delegations", params={"pending_only": "true", "member": "lead"})
        assert [d["delegation_id"] for d in r.json()["delegations"]] == [ids[0], ids[2]]
        r = c.get("/v1/delegations", params={"pending_only": "maybe"})
        assert r.status_code == 422 and "pending_only" in r.text, r.text
    with SyncClient(server.url, lead) as sdk:
        assert [d.delegation_id for d in sdk.delegations(pending_only=True)] == [ids[0], ids[2]]
    env = {"BACKCHANNEL_URL": server.url, "BACKCHANNEL_TOKEN": lead}
    page = run("delegations", "--pending", "--limit", "1", env=env)
    assert page.returncode == 0, page.stderr
    assert [line.split("\t")[0] for line in page.stdout.splitlines()] == [ids[0]]
    assert f"--after {ids[0]} --pending" in page.stderr
