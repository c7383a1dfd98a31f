"""Delegation over real sockets: in one hub, and across two hubs with their own data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, free_port, start_server


def _wait_inbox(c: httpx.Client, session: str, kind: str, seconds: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = c.get("/v1/inbox", params={"session": session, "wait": 2, "limit": 20}).json()[
            "messages"
        ]
        if got:
            c.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in got]})
        for m in got:
            if m["kind"] == kind:
                return m
    raise AssertionError(f"no {kind} message for {session} within {seconds} s")


def _play_callee(c: httpx.Client, member: str, answer: str, seconds: float = 20) -> str:
    """Find the task in one of the member's sessions and answer it, as a runtime would."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
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
        time.sleep(0.05)
    raise AssertionError("the callee never got its task")


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


@pytest.fixture
def two_hubs(tmp_path: Path) -> Iterator[tuple[Server, Server, dict[str, str]]]:
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    hub_b = start_server(
        tmp_path / "b",
        port=port_b,
        env={
            "BACKCHANNEL_SERVICE_NAME": "hub-b",
            "BACKCHANNEL_CALLBACK_SECRET": "secret-of-b",
            "BACKCHANNEL_CALLBACKS": f"hub-a={url_a}",
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
    try:
        yield hub_a, hub_b, {"lead": lead, "worker": worker, "caller": caller}
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
