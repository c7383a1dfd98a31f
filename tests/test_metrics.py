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
