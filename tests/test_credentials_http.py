"""Token rotation, member and team removal and quotas over a real socket against
`backchannel serve`, and the same through the `backchannel` command."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server, start_server
from tests.helpers_credentials import delivery_state, revoke
from tests.test_cli import run


def test_rotate_remove_and_quotas_over_http(server: Server) -> None:
    tokens = server.team("crew", "lead", "worker")
    with server.client(tokens["lead"]) as lead:
        r = lead.post("/v1/teams/crew/members/worker/token")
        assert r.status_code == 403  # members cannot rotate tokens
        assert lead.post("/v1/messages", json={"to": "worker", "text": "job 1"}).status_code == 201
    with server.client() as admin:
        r = admin.post("/v1/teams/crew/members/worker/token")
        assert r.status_code == 200, r.text
        new = r.json()["token"]
        assert admin.post("/v1/teams/crew/members/ghost/token").status_code == 404
    with server.client(tokens["worker"]) as old:
        r = old.get("/v1/inbox")
        assert r.status_code == 401  # at once: no grace from the token cache
    with server.client(new) as worker:
        assert [m["text"] for m in worker.get("/v1/inbox").json()["messages"]] == ["job 1"]

    with server.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker", "text": "job 2"}).json()["message_id"]
    with server.client() as admin:
        r = admin.delete("/v1/teams/crew/members/worker", params={"reason": "retired"})
        assert r.status_code == 200, r.text
        assert r.json()["dead_letters"] == 2  # job 2 queued, job 1 leased and not acked
        assert admin.delete("/v1/teams/crew/members/worker").status_code == 404
        assert admin.delete("/v1/teams/crew/members/user").status_code == 422
    with server.client(new) as worker:
        assert worker.get("/v1/inbox").status_code == 401
    with server.client(tokens["lead"]) as lead:
        status = lead.get(f"/v1/messages/{mid}").json()
        assert status["status"] == "dead"
        assert "was removed from team 'crew' (retired)" in status["deliveries"][0]["dead_reason"]
        notices = lead.get("/v1/inbox", params={"limit": 10}).json()["messages"]
        assert any(n["kind"] == "system" and mid in n["text"] for n in notices)
        r = lead.post("/v1/messages", json={"to": "worker", "text": "still there?"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_recipient"

    # quotas answer 429 with the limit, the count and the setting to raise
    with server.client() as admin:
        r = admin.post("/v1/teams", json={"name": "q", "settings": {"max_queued": 2}})
        user = r.json()["user_token"]
        admin.post("/v1/teams/q/members", json={"name": "slow"})
    with server.client(user) as u:
        for i in range(2):
            assert u.post("/v1/messages", json={"to": "slow", "text": f"{i}"}).status_code == 201
        r = u.post("/v1/messages", json={"to": "slow", "text": "over"})
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert (error["limit"], error["count"], error["setting"]) == (2, 2, "max_queued")

    with server.client() as admin:
        r = admin.delete("/v1/teams/q")
        assert r.status_code == 200 and r.json()["dropped"] == 2
        assert admin.delete("/v1/teams/q").status_code == 404
    with server.client(user) as u:
        assert u.get("/v1/inbox").status_code == 401


@pytest.mark.slow
def _rotate(server: Server, team: str, name: str) -> str:
    with server.client() as admin:
        r = admin.post(f"/v1/teams/{team}/members/{name}/token")
        assert r.status_code == 200, r.text
        return str(r.json()["token"])


def test_a_long_poll_of_a_rotated_token_hands_over_nothing(server: Server) -> None:
    # a token is checked when its request comes; a long-poll that waits past a rotation
    # must not lease what arrives later to the holder of the old token
    tokens = server.team("crew", "lead", "worker")
    with server.client(tokens["lead"]) as lead:
        first = lead.post("/v1/messages", json={"to": "worker", "text": "one"}).json()
    with server.client(tokens["worker"]) as old:
        assert [m["message_id"] for m in old.get("/v1/inbox").json()["messages"]] == [
            first["message_id"]
        ]
    answer: dict[str, httpx.Response] = {}

    def poll() -> None:
        with server.client(tokens["worker"]) as old:
            body = {"ack": [first["message_id"]], "wait": 30}
            answer["r"] = old.post("/v1/inbox/receive", json=body)

    waiter = threading.Thread(target=poll)
    waiter.start()
    # the ack commits before the wait: once it shows, the poll is waiting
    eventually_blocking(
        lambda: delivery_state(server, tokens["lead"], first["message_id"]) == "acked",
        what="the long-poll waits",
    )
    new = _rotate(server, "crew", "worker")
    with server.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker", "text": "two"}).json()["message_id"]
    waiter.join(20)
    assert not waiter.is_alive()
    r = answer["r"]
    assert r.status_code == 401, r.text
    assert "rotated" in r.json()["error"]["message"]
    assert delivery_state(server, tokens["lead"], mid) == "queued"
    with server.client(new) as worker:
        assert [m["text"] for m in worker.get("/v1/inbox").json()["messages"]] == ["two"]


@pytest.mark.parametrize("how", ["rotate", "remove member", "remove team"])
def test_an_idle_long_poll_of_a_revoked_token_ends_at_once(server: Server, how: str) -> None:
    # a long-poll may wait an hour: one whose token stops working must end then with a
    # 401 that says why, not wait out its hour and answer 200 to the old token
    tokens = server.team("crew", "lead", "worker")
    answer: dict[str, httpx.Response] = {}

    with server.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker", "text": "one"}).json()["message_id"]
    with server.client(tokens["worker"]) as worker:
        assert len(worker.get("/v1/inbox").json()["messages"]) == 1

    def poll() -> None:
        with server.client(tokens["worker"]) as old:
            answer["r"] = old.post("/v1/inbox/receive", json={"ack": [mid], "wait": 600})

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    # the ack commits before the wait: once it shows, the poll is waiting
    eventually_blocking(
        lambda: delivery_state(server, tokens["lead"], mid) == "acked", what="the long-poll waits"
    )
    revoke(server, how)
    waiter.join(20)
    assert not waiter.is_alive(), "the long-poll still waits"
    r = answer["r"]
    assert r.status_code == 401, r.text
    assert "rotated or its member removed" in r.json()["error"]["message"]


@contextlib.contextmanager
def _stream(server: Server, token: str, path: str, timeout: float = 30) -> Iterator[Iterator[str]]:
    """The lines of an event stream of ``path`` opened with ``token``, once connected,
    each read waiting ``timeout`` seconds at the most."""
    auth = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=server.url, headers=auth, timeout=timeout) as c,
        c.stream("GET", path) as resp,
    ):
        lines = resp.iter_lines()
        assert next(lines) == ": connected"
        yield lines


def test_an_inbox_stream_of_a_rotated_token_ends_and_hands_over_nothing(server: Server) -> None:
    tokens = server.team("crew", "lead", "worker")
    with _stream(server, tokens["worker"], "/v1/inbox/stream") as lines:
        new = _rotate(server, "crew", "worker")
        with server.client(tokens["lead"]) as lead:
            mid = lead.post("/v1/messages", json={"to": "worker", "text": "secret"}).json()[
                "message_id"
            ]
        event = next(line for line in lines if line.startswith("event: "))
        data = next(line for line in lines if line.startswith("data: "))
        assert (event, "rotated" in data) == ("event: error", True), data
        assert list(lines) == [""]  # and the stream ends
    assert delivery_state(server, tokens["lead"], mid) == "queued"
    with server.client(new) as worker:
        assert [m["text"] for m in worker.get("/v1/inbox").json()["messages"]] == ["secret"]


def test_a_team_events_stream_of_a_rotated_token_ends(server: Server) -> None:
    tokens = server.team("crew", "lead", "worker")
    with _stream(server, tokens["lead"], "/v1/teams/crew/events") as lines:
        _rotate(server, "crew", "lead")
        with server.client(tokens["user"]) as user:
            user.post("/v1/messages", json={"to": "worker", "text": "secret plans"})
        event = next(line for line in lines if line.startswith("event: "))
        data = next(line for line in lines if line.startswith("data: "))
        assert (event, "rotated" in data) == ("event: error", True), data
        assert list(lines) == [""]  # and the stream ends


@pytest.mark.parametrize("path", ["/v1/inbox/stream", "/v1/teams/crew/events"])
@pytest.mark.parametrize("how", ["rotate", "remove member"])
def test_a_quiet_stream_of_a_revoked_token_ends_at_once(
    server: Server, path: str, how: str
) -> None:
    # with no traffic to wake it, a stream looked at its token only at its next
    # keep-alive, 15 s on: read with a 5 s timeout, it must end before that
    tokens = server.team("crew", "lead", "worker")
    with _stream(server, tokens["worker"], path, timeout=5) as lines:
        revoke(server, how)
        rest = [line for line in lines if line]  # the stream ends, or the read times out
    assert rest[0] == "event: error" and "rotated" in rest[1], rest


def test_the_command_rotates_and_removes(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home")
    try:
        env = {"BACKCHANNEL_HOME": str(srv.home)}
        tokens = srv.team("ops", "a", "b")
        rotated = run("member", "rotate-token", "ops", "b", env=env)
        assert rotated.returncode == 0, rotated.stderr
        new = rotated.stdout.strip()
        assert new.startswith("bc_") and new != tokens["b"]
        assert (
            httpx.get(f"{srv.url}/v1/me", headers={"Authorization": f"Bearer {new}"}).json()["name"]
            == "b"
        )
        removed = run("member", "remove", "ops", "b", "--reason", "gone", env=env)
        assert removed.returncode == 0, removed.stderr
        assert json.loads(removed.stdout)["name"] == "b"
        again = run("member", "remove", "ops", "b", env=env)
        assert again.returncode == 1 and "unknown member 'b'" in again.stderr
        refused = run("team", "remove", "ops", env=env)
        assert refused.returncode == 1 and "--yes" in refused.stderr
        gone = run("team", "remove", "ops", "--yes", env=env)
        assert gone.returncode == 0, gone.stderr
        assert "ops" not in run("team", "list", env=env).stdout.split()
    finally:
        srv.stop()


@pytest.mark.slow
def test_the_command_works_on_the_data_directory(tmp_path: Path) -> None:
    env = {"BACKCHANNEL_HOME": str(tmp_path / "home")}
    assert run("init", env=env).returncode == 0
    assert run("team", "create", "solo", env=env).returncode == 0
    assert run("member", "add", "solo", "a", env=env).returncode == 0
    r = run("member", "rotate-token", "solo", "a", env=env)
    assert r.returncode == 0 and r.stdout.strip().startswith("bc_"), r.stderr
    r = run("member", "remove", "solo", "a", env=env)
    assert r.returncode == 0, r.stderr
    assert run("team", "remove", "solo", "--yes", env=env).returncode == 0


def test_credentials_sent_the_wrong_way_are_refused_with_the_way_out(server: Server) -> None:
    # every refusal names what was wrong with the credentials and how to send them
    tokens = server.team("crew", "lead", "worker")
    with server.client() as admin:
        assert admin.delete("/v1/teams/crew/members/worker").status_code == 200
    lead = tokens["lead"]

    def me(headers: list[tuple[str, str]], **params: str) -> httpx.Response:
        return httpx.get(f"{server.url}/v1/me", headers=headers, params=params, timeout=10)

    # the forms a client may fairly send are taken: any case of the scheme, padding
    for value in (f"Bearer {lead}", f"bearer {lead}", f"BEARER  {lead}"):
        r = me([("Authorization", value)])
        assert (r.status_code, r.json().get("name")) == (200, "lead"), (value, r.text)

    def refused(r: httpx.Response, *words: str) -> None:
        assert r.status_code == 401, r.text
        message = r.json()["error"]["message"]
        assert all(w in message for w in words), message
        assert lead not in r.text and server.admin_token not in r.text  # never echoed

    # two Authorization headers: which one counts is not guessed (a proxy may have
    # checked the other), even for two that agree
    for second in (server.admin_token, lead):
        r = me([("Authorization", f"Bearer {lead}"), ("Authorization", f"Bearer {second}")])
        refused(r, "one Authorization header", "2")
    a2a = httpx.get(
        f"{server.url}/a2a/crew/lead/.well-known/agent-card.json",
        headers=[("Authorization", f"Bearer {lead}"), ("Authorization", f"Bearer {lead}")],
        timeout=10,
    )
    refused(a2a, "one Authorization header")
    # a token in the query string is not taken (it would be written to logs)
    for name in ("token", "access_token"):
        refused(me([], **{name: lead}), "query string", "Authorization: Bearer")
    # the scheme left out, or another scheme
    refused(me([("Authorization", lead)]), "'Bearer '")
    refused(me([("Authorization", "Basic dXNlcjpwYXNz")]), "'Basic'", "Bearer")
    # a removed member's token says what may have happened and what to do
    r = me([("Authorization", f"Bearer {tokens['worker']}")])
    refused(r, "rotated", "removed", "rotate-token")
    # the same rule where other tokens are taken: the admin's for the metrics, a
    # callee hub's one-time reply token for its answer
    twice = [("Authorization", f"Bearer {server.admin_token}")] * 2
    r = httpx.get(f"{server.url}/metrics", headers=twice, timeout=10)
    refused(r, "one Authorization header", "admin token")
    r = httpx.post(
        f"{server.url}/api/tools/response",
        headers=[("Authorization", "Bearer reply-token")] * 2,
        json={"result": "done"},
        timeout=10,
    )
    refused(r, "one Authorization header", "reply token")
