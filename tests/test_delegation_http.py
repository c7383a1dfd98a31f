"""Delegation over real sockets: in one hub, and across two hubs with their own data."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server, free_port, start_server


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


def _start_two_hubs(
    tmp_path: Path, port_a: int, a_as_seen_by_b: str
) -> tuple[Server, Server, dict[str, str]]:
    port_b = free_port()
    url_b = f"http://127.0.0.1:{port_b}"
    hub_b = start_server(
        tmp_path / "b",
        port=port_b,
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-b",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-b",
            "BACKCHANNEL_CALLBACKS": f"hub-a={a_as_seen_by_b}",
        },
    )
    with hub_b.client() as admin:
        admin.post("/v1/teams", json={"name": "workers"})
        worker = admin.post("/v1/teams/workers/members", json={"name": "worker"}).json()["token"]
        caller = admin.post("/v1/teams/workers/members", json={"name": "hub-a"}).json()["token"]
    hub_a = start_server(
        tmp_path / "a",
        port=port_a,
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-a",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-a",
            "BACKCHANNEL_CALLBACKS": f"hub-b={url_b}",
            "BACKCHANNEL_CALLBACK_TOKENS": f"hub-b={caller}",
        },
    )
    with hub_a.client() as admin:
        admin.post("/v1/teams", json={"name": "leads", "settings": {"anchor_policy": "off"}})
        lead = admin.post("/v1/teams/leads/members", json={"name": "lead"}).json()["token"]
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
        assert sessions == ["lead-s--tu_x"]
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


class DropFirstAck:
    """A proxy in front of hub A as hub B reaches it: it forwards every request, but cuts
    the connection instead of relaying hub A's answer to the first tool response, as a
    network fault after hub A committed would."""

    def __init__(self, upstream: str) -> None:
        self.relayed: list[tuple[str, int, bool]] = []  # path, upstream status, dropped
        outer = self

        class Handler(BaseHTTPRequestHandler):
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

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
