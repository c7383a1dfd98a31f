"""The HTTP API v1 over a real socket, against `backchannel serve` in a subprocess."""

from __future__ import annotations

import json
import os
import stat
import threading

import httpx
import pytest

from tests.conftest import Server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.conftest import start_server

    home = tmp_path_factory.mktemp("api") / "home"
    s = start_server(home, env={"BACKCHANNEL_CALLBACKS": "ops=http://127.0.0.1:9"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(srv: Server) -> dict[str, str]:
    t = srv.team("alpha", "lead", "worker-1", "worker-2")
    t.update({f"beta:{k}": v for k, v in srv.team("beta", "outsider").items()})
    return t


def test_admin_token_file_is_private(srv: Server) -> None:
    mode = stat.S_IMODE(os.stat(srv.home / "admin.token").st_mode)
    assert mode == 0o600


def test_healthz_and_openapi(srv: Server) -> None:
    assert httpx.get(f"{srv.url}/healthz").json() == {"status": "ok"}
    # a health checker that asks with HEAD (load balancers, `curl -I`) hears it is up
    head = httpx.head(f"{srv.url}/healthz")
    assert (head.status_code, head.content) == (200, b""), head
    spec = httpx.get(f"{srv.url}/openapi.json").json()
    for path in (
        "/v1/teams",
        "/v1/messages",
        "/v1/inbox",
        "/v1/inbox/ack",
        "/v1/messages/{message_id}",
    ):
        assert path in spec["paths"]


def test_send_receive_ack_roundtrip(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["lead"]) as lead, srv.client(tokens["worker-1"]) as w1:
        r = lead.post(
            "/v1/messages", json={"to": "worker-1", "text": "count lines", "summary": "job"}
        )
        assert r.status_code == 201
        body = r.json()
        assert body["status"] == "queued"
        got = w1.get("/v1/inbox", params={"limit": 10}).json()["messages"]
        mine = [m for m in got if m["message_id"] == body["message_id"]]
        assert len(mine) == 1
        m = mine[0]
        assert (m["from"], m["to"], m["kind"], m["text"], m["summary"], m["attempt"]) == (
            "lead",
            "worker-1",
            "direct",
            "count lines",
            "job",
            1,
        )
        assert w1.post("/v1/inbox/ack", json={"message_ids": [m["message_id"]]}).json() == {
            "acked": 1,
            "not_held": [],
        }
        status = lead.get(f"/v1/messages/{m['message_id']}").json()
        assert status["status"] == "acked"
        assert [h["event"] for h in status["history"]] == ["queued", "leased", "acked"]


def test_sender_is_the_authenticated_member_never_the_body(
    srv: Server, tokens: dict[str, str]
) -> None:
    with srv.client(tokens["worker-2"]) as w2:
        r = w2.post("/v1/messages", json={"to": "lead", "text": "hi", "from": "user"})
        assert r.status_code == 422
        assert "from" in r.json()["error"]["message"]


def test_idempotent_replay_is_200_and_conflict_is_409(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["lead"]) as lead:
        body = {"to": "worker-2", "text": "once", "message_id": "idem-1"}
        first = lead.post("/v1/messages", json=body)
        again = lead.post("/v1/messages", json=body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["message_id"] == again.json()["message_id"] == "idem-1"
        clash = lead.post("/v1/messages", json={**body, "text": "different"})
        assert clash.status_code == 409
        assert clash.json()["error"]["code"] == "message_id_conflict"


def test_unknown_recipient_404_with_suggestions(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["lead"]) as lead:
        r = lead.post("/v1/messages", json={"to": "wrker-1", "text": "hi"})
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "unknown_recipient"
        assert err["suggestions"][0] == "worker-1"
        assert "did you mean 'worker-1'" in err["message"]


def test_other_team_is_indistinguishable_from_nonexistent(
    srv: Server, tokens: dict[str, str]
) -> None:
    with srv.client(tokens["beta:outsider"]) as out:
        to_alpha = out.post("/v1/messages", json={"to": "lead", "text": "hi"})
        assert to_alpha.status_code == 404
        assert to_alpha.json()["error"]["suggestions"] == []  # nothing leaks from alpha
        assert "alpha" not in to_alpha.text
        other = out.get("/v1/teams/alpha/members")
        missing = out.get("/v1/teams/nosuchteam/members")
        assert other.status_code == missing.status_code == 404
        assert other.json()["error"]["code"] == missing.json()["error"]["code"] == "unknown_team"
        assert out.get("/v1/teams").json() == {"teams": [{"name": "beta"}], "next_after": None}


def test_auth_errors(srv: Server, tokens: dict[str, str]) -> None:
    none = httpx.get(f"{srv.url}/v1/inbox")
    assert none.status_code == 401
    assert "Authorization: Bearer" in none.json()["error"]["message"]
    wrong = httpx.get(f"{srv.url}/v1/inbox", headers={"Authorization": "Bearer bc_nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "unauthorized"
    with srv.client(tokens["lead"]) as lead:
        r = lead.post("/v1/teams", json={"name": "gamma"})
        assert r.status_code == 403
    with srv.client() as admin:
        r = admin.post("/v1/messages", json={"to": "lead", "text": "x"})
        assert r.status_code == 403
        assert "member token" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "headers", "needle"),
    [
        (b"{not json", {"content-type": "application/json"}, "not valid JSON"),
        (b"[1, 2]", {"content-type": "application/json"}, "JSON object"),
        (
            b'{"to": 5, "text": "x"}',
            {"content-type": "application/json"},
            "to: Input should be a valid string",
        ),
        (b'{"to": "lead"}', {"content-type": "application/json"}, "text: Field required"),
    ],
)
def test_malformed_requests_are_422_with_the_problem(
    srv: Server, tokens: dict[str, str], body: bytes, headers: dict[str, str], needle: str
) -> None:
    with srv.client(tokens["worker-1"]) as w1:
        r = w1.post("/v1/messages", content=body, headers=headers)
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "invalid_request"
        assert needle in r.json()["error"]["message"]


def test_oversized_text_is_413_and_nothing_is_kept(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["worker-1"]) as w1:
        r = w1.post(
            "/v1/messages",
            json={"to": "lead", "text": "x" * (256 * 1024 + 1), "message_id": "big-1"},
        )
        assert r.status_code == 413
        assert r.json()["error"]["limit"] == 256 * 1024
        huge = w1.post(
            "/v1/messages",
            content=b"x" * (2 * 1024 * 1024),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413
        assert w1.get("/v1/messages/big-1").status_code == 404


def test_invalid_team_and_member_names(srv: Server) -> None:
    with srv.client() as admin:
        r = admin.post("/v1/teams", json={"name": "has space"})
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "invalid_name"
        r = admin.post("/v1/teams/alpha/members", json={"name": "../etc"})
        assert r.status_code == 422
        r = admin.post("/v1/teams/alpha/members", json={"name": "ok", "kind": "robot"})
        assert r.status_code == 422
        assert admin.post("/v1/teams", json={"name": "alpha"}).status_code == 409


def test_ack_of_ids_not_held(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["worker-2"]) as w2:
        r = w2.post("/v1/inbox/ack", json={"message_ids": ["nope-1"]})
        assert r.status_code == 200
        assert r.json() == {"acked": 0, "not_held": ["nope-1"]}
        assert w2.post("/v1/inbox/ack", json={"message_ids": "nope"}).status_code == 422


def test_status_visible_to_sender_and_recipient_only(srv: Server, tokens: dict[str, str]) -> None:
    with (
        srv.client(tokens["lead"]) as lead,
        srv.client(tokens["worker-1"]) as w1,
        srv.client(tokens["worker-2"]) as w2,
    ):
        mid = lead.post("/v1/messages", json={"to": "worker-1", "text": "private"}).json()[
            "message_id"
        ]
        assert lead.get(f"/v1/messages/{mid}").status_code == 200
        assert w1.get(f"/v1/messages/{mid}").status_code == 200
        assert w2.get(f"/v1/messages/{mid}").status_code == 404


def test_long_poll_is_woken_by_a_send(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["worker-2"]) as w2:
        w2.post("/v1/inbox/ack", json={"message_ids": ["x"]})
        drained = w2.get("/v1/inbox", params={"limit": 1000}).json()["messages"]
        if drained:
            w2.post("/v1/inbox/ack", json={"message_ids": [m["message_id"] for m in drained]})
    result: dict[str, object] = {}

    def wait() -> None:
        with srv.client(tokens["worker-2"]) as w2:
            result["resp"] = w2.get("/v1/inbox", params={"wait": 60, "limit": 5}).json()

    t = threading.Thread(target=wait)
    t.start()
    with srv.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker-2", "text": "ping"}).json()[
            "message_id"
        ]
    t.join(20)  # far less than the 60 s wait: the commit woke it
    assert not t.is_alive()
    msgs = result["resp"]["messages"]  # type: ignore[index]
    assert [m["message_id"] for m in msgs] == [mid]


def test_sse_inbox_stream_pushes_messages(srv: Server, tokens: dict[str, str]) -> None:
    srv.team("sse", "rx")
    with srv.client() as admin:
        rx = admin.post("/v1/teams/sse/members", json={"name": "rx2"}).json()["token"]
        tx = admin.post("/v1/teams/sse/members", json={"name": "tx"}).json()["token"]
    with (
        httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {rx}"}, timeout=30) as c,
        c.stream("GET", "/v1/inbox/stream") as resp,
    ):
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        assert next(lines) == ": connected"
        with srv.client(tx) as sender:
            mid = sender.post("/v1/messages", json={"to": "rx2", "text": "streamed"}).json()[
                "message_id"
            ]
        data = None
        for line in lines:
            if line.startswith("data: "):
                data = json.loads(line[6:])
                break
    assert data is not None
    assert (data["message_id"], data["text"], data["from"]) == (mid, "streamed", "tx")


def test_sse_inbox_stream_of_a_session_refuses_a_bad_one_and_ends_with_it(srv: Server) -> None:
    tokens = srv.team("sse-s", "rx", "tx")
    with srv.client(tokens["rx"]) as rx:
        # a session that is not the member's: an error answer, not a stream that is cut
        r = rx.get("/v1/inbox/stream", params={"session": "nope"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "unknown_session"
        sid = rx.post("/v1/sessions", json={}).json()["session_id"]
    with (
        httpx.Client(
            base_url=srv.url, headers={"Authorization": f"Bearer {tokens['rx']}"}, timeout=30
        ) as c,
        c.stream("GET", "/v1/inbox/stream", params={"session": sid}) as resp,
    ):
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(lines) == ": connected"
        with srv.client(tokens["rx"]) as rx:
            rx.post(f"/v1/sessions/{sid}/terminate", json={}).raise_for_status()
        with srv.client(tokens["tx"]) as tx:  # wakes the stream's wait
            tx.post("/v1/messages", json={"to": "rx", "text": "after the end"}).raise_for_status()
        rest = list(lines)  # to the stream's end: it ends, cleanly
    events = [line for line in rest if line.startswith("event: ")]
    data = [line for line in rest if line.startswith("data: ")]
    assert events[-1] == "event: error", rest
    assert "terminated" in json.loads(data[-1][6:])["error"]["message"]


def test_the_dashboard_stream_of_a_removed_team_ends_with_an_error(srv: Server) -> None:
    # the dashboard removes teams while its own stream of that team is open
    srv.team("doomed")
    with srv.client() as admin:
        ticket = admin.post("/v1/dashboard/tickets", json={"team": "doomed"}).json()["ticket"]
    with (
        httpx.Client(base_url=srv.url, timeout=30) as c,
        c.stream("GET", "/v1/dashboard/teams/doomed/stream", params={"ticket": ticket}) as resp,
    ):
        lines = resp.iter_lines()
        named = (line for line in lines if line.startswith("event: "))
        assert [next(named), next(named)] == ["event: replay", "event: snapshot"]
        with srv.client() as admin:
            admin.delete("/v1/teams/doomed").raise_for_status()
        rest = list(lines)  # to the stream's end: it ends, cleanly
    events = [line for line in rest if line.startswith("event: ")]
    data = [line for line in rest if line.startswith("data: ")]
    assert events[-1] == "event: error", rest
    assert json.loads(data[-1][6:])["error"]["code"] == "unknown_team"


def test_team_events_stream(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker-1", "text": "watched"}).json()[
            "message_id"
        ]
        with lead.stream("GET", "/v1/teams/alpha/events", params={"after": 0}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["message_id"] == mid:
                    item = json.loads(line[6:])
                    break
    assert (item["event"], item["from"], item["to"], item["summary"]) == (
        "queued",
        "lead",
        "worker-1",
        "watched",
    )
    with srv.client(tokens["beta:outsider"]) as out:
        assert out.get("/v1/teams/alpha/events").status_code == 404


def test_unknown_endpoint_uses_error_format(srv: Server) -> None:
    r = httpx.get(f"{srv.url}/v1/nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_member_delivery_setting_is_checked_and_can_change(
    srv: Server, tokens: dict[str, str]
) -> None:
    with srv.client() as admin:
        bad = admin.post(
            "/v1/teams/alpha/members", json={"name": "typo", "delivery": {"type": "tmx"}}
        )
        assert bad.status_code == 422
        assert "tmx" in bad.json()["error"]["message"]
        names = [m["name"] for m in admin.get("/v1/teams/alpha/members").json()["members"]]
        assert "typo" not in names, "nothing half-written"
        # a webhook names a service the hub has registered, or is refused when set
        bad = admin.patch(
            "/v1/teams/alpha/members/worker-2",
            json={"delivery": {"type": "webhook", "service": "opz"}},
        )
        assert bad.status_code == 422
        assert "did you mean 'ops'?" in bad.json()["error"]["message"]
        r = admin.patch(
            "/v1/teams/alpha/members/worker-2",
            json={"delivery": {"type": "webhook", "service": "ops"}},
        )
        assert r.status_code == 200
        assert r.json()["delivery"] == {"type": "webhook", "service": "ops"}
        assert (
            admin.patch("/v1/teams/alpha/members/nobody", json={"delivery": {}}).status_code == 404
        )
    with srv.client(tokens["lead"]) as lead:
        assert (
            lead.patch("/v1/teams/alpha/members/worker-2", json={"delivery": {}}).status_code == 403
        )


def test_a_long_poll_whose_client_left_leases_nothing(srv: Server) -> None:
    tokens = srv.team("gone", "rx", "tx")
    import socket

    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            f"GET /v1/inbox?wait=30 HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {tokens['rx']}\\r\\n\\r\\n".encode()
        )
        # the request is in; the client goes away before anything arrives
    with srv.client(tokens["tx"]) as tx, srv.client(tokens["rx"]) as rx:
        mid = tx.post("/v1/messages", json={"to": "rx", "text": "after you left"}).json()[
            "message_id"
        ]
        got = rx.get("/v1/inbox", params={"wait": 5}).json()["messages"]
        assert [(m["message_id"], m["attempt"]) for m in got] in ([(mid, 1)], [(mid, 2)])


def test_a_receiver_gives_up_for_good_on_what_it_holds_and_the_sender_is_told(
    srv: Server, tokens: dict[str, str]
) -> None:
    """``POST /v1/inbox/give-up``: only copies the member holds leased die, with its
    reason, and their sender hears of it; no reason is a 422 naming the field."""
    with (
        srv.client(tokens["lead"]) as lead,
        srv.client(tokens["worker-1"]) as w1,
        srv.client(tokens["worker-2"]) as w2,
    ):
        body = {"to": "worker-1", "text": "please do", "message_id": "give-up-1"}
        assert lead.post("/v1/messages", json=body).status_code == 201
        why = {"message_ids": ["give-up-1"], "reason": "its model failed for good"}
        assert w2.post("/v1/inbox/give-up", json=why).json() == {"given_up": 0}, "not its copy"
        assert w1.post("/v1/inbox/give-up", json=why).json() == {"given_up": 0}, "not leased"
        got = w1.get("/v1/inbox", params={"limit": 100}).json()["messages"]
        assert "give-up-1" in [m["message_id"] for m in got]
        r = w1.post("/v1/inbox/give-up", json={"message_ids": ["give-up-1"], "reason": ""})
        assert r.status_code == 422 and "reason" in r.text
        assert w1.post("/v1/inbox/give-up", json=why).json() == {"given_up": 1}
        assert lead.get("/v1/messages/give-up-1").json()["status"] == "dead"
        told = lead.get("/v1/inbox", params={"limit": 100, "wait": 5}).json()["messages"]
        notice = [m for m in told if m["meta"].get("dead_message_id") == "give-up-1"]
        assert len(notice) == 1 and "its model failed for good" in notice[0]["text"], told
