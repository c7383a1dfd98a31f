"""The SDK over HTTP when the way to the hub fails: a real ``backchannel serve`` behind a
proxy that cuts a connection after it passed the request on (the hub did it; its answer
is lost), or answers 503 or 429 itself (a hub restarting behind it, a rate limit)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel import Client
from backchannel.errors import InvalidRequest, PeerError
from backchannel.testing.waiting import eventually_blocking
from tests.conftest import BIN, Server, start_server
from tests.peers import Peer, QuietHandler


class Faulty(Peer):
    """An HTTP proxy to the hub. Each fault (``method``, ``path`` (ending in ``/``: any
    path below it), ``what``, and optionally a text the request's body must hold) is used
    once, by the first request
    it matches: ``cut`` passes the request on and closes the connection instead of
    relaying the answer (``half``: after half its body); ``hold`` waits for
    :attr:`release` before passing the request on; ``late`` passes it on, sets
    :attr:`answered` once the hub's answer is in, and relays it after :attr:`release`; ``503``/``429`` answer that status
    with ``Retry-After: 1`` without passing the request on; ``502``/``504`` answer that
    status with a reverse proxy's HTML page (a hub restarting behind it); ``event``
    reads a server-sent event stream until the hub wrote :attr:`written` ``message`` events,
    relays the first and closes both connections (what the hub wrote after it is never
    read); ``stall`` relays the stream's first ``message`` event, then stops forwarding
    (it reads no more from the hub and writes no more to the client) with both
    connections open, until :attr:`release`."""

    def __init__(self, upstream: str) -> None:
        self.faults: list[tuple[str, ...]] = []
        self.seen: list[tuple[str, str, str]] = []  # method, path, what was done
        self.release = threading.Event()  # ends a ``hold`` or a ``late``
        self.answered = threading.Event()  # a ``late`` request's answer came from the hub
        self.written = 1  # the message events an ``event`` cut waits for the hub to write
        lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                path = self.path.split("?")[0]
                with lock:
                    fault = next(
                        (
                            f
                            for f in outer.faults
                            if f[0] == self.command
                            and (f[1] == path or (f[1].endswith("/") and path.startswith(f[1])))
                            and (len(f) < 4 or f[3].encode() in body)
                        ),
                        None,
                    )
                    if fault is not None:
                        outer.faults.remove(fault)
                what = fault[2] if fault else "pass"
                outer.seen.append((self.command, path, what))
                if what == "hold":  # the hub's answer waits for the test to release it
                    outer.release.wait(60)
                if what in ("502", "504"):
                    page = b"<html><body><h1>Bad Gateway</h1></body></html>"
                    self.send_response(int(what))
                    self.send_header("content-type", "text/html")
                    self.send_header("content-length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                if what in ("503", "429"):
                    self.send_response(int(what))
                    self.send_header("Retry-After", "1")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("authorization", "content-type", "last-event-id")
                }
                if what in ("event", "stall"):
                    self._cut_after_first_event(upstream + self.path, headers, what == "stall")
                    return
                r = httpx.request(
                    self.command, upstream + self.path, content=body, headers=headers, timeout=60
                )
                if what == "late":  # the hub did it; its answer waits for the test
                    outer.answered.set()
                    outer.release.wait(60)
                if what == "cut":
                    self.close_connection = True
                    return  # no status line: the client sees the connection closed
                if what == "half":  # the status, the headers and half the body
                    self.close_connection = True
                    self.send_response(r.status_code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(r.content)))
                    self.end_headers()
                    self.wfile.write(r.content[: len(r.content) // 2])
                    self.wfile.flush()
                    return
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() in ("content-type", "retry-after"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def _cut_after_first_event(
                self, url: str, headers: dict[str, str], stall: bool = False
            ) -> None:
                self.close_connection = True
                with httpx.stream(self.command, url, headers=headers, timeout=60) as r:
                    self.send_response(r.status_code)
                    self.send_header("content-type", r.headers.get("content-type", ""))
                    self.end_headers()
                    seen = b""
                    for chunk in r.iter_raw():
                        seen += chunk
                        events = re.findall(rb"event: message\n.*?\n\n", seen, re.S)
                        if len(events) >= (1 if stall else outer.written):
                            first = seen.find(b"event: message")
                            self.wfile.write(seen[:first] + events[0])
                            self.wfile.flush()
                            if stall:  # forwards nothing more, both connections open
                                outer.release.wait(60)
                            return  # both connections close: the rest is never read

            do_GET = do_POST = do_DELETE = do_PATCH = _any

        self.serve(Handler)


def _serving(home: Path, store: str | None = None) -> Iterator[Server]:
    """A hub serving from ``home`` (on ``store``, or its SQLite file) for as long as the
    fixture lasts."""
    s = start_server(home, store)
    try:
        yield s
    finally:
        s.stop()


def _faulty(hub: Server) -> Iterator[Faulty]:
    """A faulty proxy in front of ``hub`` for as long as the fixture lasts."""
    p = Faulty(hub.url)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _serving(tmp_path_factory.mktemp("sdkfaults") / "home")


@pytest.fixture
def proxy(srv: Server) -> Iterator[Faulty]:
    yield from _faulty(srv)


def _inbox(srv: Server, token: str) -> list[dict[str, Any]]:
    with srv.client(token) as c:
        got: list[dict[str, Any]] = c.get("/v1/inbox", params={"limit": 50}).json()["messages"]
        if got:
            ids = [m["message_id"] for m in got]
            c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
        return got


async def test_a_send_whose_answer_is_lost_is_sent_once(srv: Server, proxy: Faulty) -> None:
    # the hub committed the send and the connection broke before its answer came back:
    # the client sends it again under the same message_id, and the hub answers the
    # first result instead of making a second message
    tokens = srv.team("cut-send", "a", "b")
    proxy.faults.append(("POST", "/v1/messages", "cut"))
    async with Client(proxy.url, tokens["a"]) as a:
        sent = await a.send("b", "deploy at noon")
    assert sent.replayed
    assert [w for _, p, w in proxy.seen if p == "/v1/messages"] == ["cut", "pass"]
    got = _inbox(srv, tokens["b"])
    assert [(m["message_id"], m["text"]) for m in got] == [(sent.message_id, "deploy at noon")]


async def test_a_batch_whose_answer_is_lost_is_sent_once(srv: Server, proxy: Faulty) -> None:
    tokens = srv.team("cut-batch", "a", "b")
    proxy.faults.append(("POST", "/v1/messages/batch", "cut"))
    async with Client(proxy.url, tokens["a"]) as a:
        sent = await a.send_batch([{"to": "b", "text": "one"}, {"to": "b", "text": "two"}])
    assert [(r.status, r.sent and r.sent.replayed) for r in sent.results] == [(200, True)] * 2
    assert [m["text"] for m in _inbox(srv, tokens["b"])] == ["one", "two"]


@pytest.mark.parametrize("status", ["503", "429", "502", "504"])
async def test_a_hub_that_says_come_back_later_is_called_again(
    srv: Server, proxy: Faulty, status: str
) -> None:
    tokens = srv.team(f"later-{status}", "a", "b")
    proxy.faults += [("POST", "/v1/messages", status), ("GET", "/v1/inbox", status)]
    async with Client(proxy.url, tokens["a"]) as a, Client(proxy.url, tokens["b"]) as b:
        await a.send("b", "deploy at noon")
        got = await b.receive(wait=5)
        assert [m.text for m in got] == ["deploy at noon"]
        await got[0].ack()
    assert ("POST", "/v1/messages", status) in proxy.seen
    assert ("GET", "/v1/inbox", status) in proxy.seen


async def test_a_call_without_an_id_whose_answer_is_lost_is_not_made_again(
    srv: Server, proxy: Faulty
) -> None:
    # a call that changes something and has no id to be recognised by is not made again
    # (made again, adding a member answers that it exists, and the token the lost answer
    # held is gone): the caller hears the hub may have done it, and the hub did it once
    srv.team("cut-add", "a")
    path = "/v1/teams/cut-add/members"
    proxy.faults.append(("POST", path, "cut"))
    async with Client(proxy.url, srv.admin_token) as admin:
        with pytest.raises(PeerError, match="may have done it"):
            await admin.add_member("cut-add", "b")
        assert [m.name for m in await admin.members("cut-add")] == ["a", "b", "user"]
    assert [w for m, p, w in proxy.seen if (m, p) == ("POST", path)] == ["cut"]


def test_the_sync_client_sends_once_too(srv: Server, proxy: Faulty) -> None:
    from backchannel import SyncClient

    tokens = srv.team("cut-sync", "a", "b")
    proxy.faults.append(("POST", "/v1/messages", "cut"))
    with SyncClient(proxy.url, tokens["a"]) as a:
        sent = a.send("b", "deploy at noon")
    assert sent.replayed
    assert [m["text"] for m in _inbox(srv, tokens["b"])] == ["deploy at noon"]


async def test_a_long_poll_cut_on_the_way_back_is_made_again_and_gets_its_messages_at_once(
    srv: Server, proxy: Faulty
) -> None:
    # a proxy dropped the long-poll's answer, which held a message: the client makes the
    # receive again under its name, and the hub answers what the first one leased, at
    # once and the same attempt (before: nothing until the lease, 60 s, ran out, and one
    # attempt spent)
    tokens = srv.team("cut-poll", "a", "b")
    proxy.faults.append(("GET", "/v1/inbox", "cut"))
    async with Client(proxy.url, tokens["a"]) as a, Client(proxy.url, tokens["b"]) as b:
        sent = await a.send("b", "deploy at noon")
        got = await b.receive(wait=10)
        assert [(m.message_id, m.attempt) for m in got] == [(sent.message_id, 1)]
        await got[0].ack()
        assert await b.receive(wait=0) == []
    assert [w for m, p, w in proxy.seen if p == "/v1/inbox"][:2] == ["cut", "pass"]


@pytest.mark.parametrize("path", ["/v1/inbox", "/v1/inbox/receive"])
async def test_a_long_poll_cut_mid_body_loses_nothing_and_hands_nothing_twice(
    srv: Server, proxy: Faulty, path: str
) -> None:
    # the answer's head and half its messages came through, then the connection broke:
    # the client reads nothing of it, makes the receive again, and gets each message of
    # the lost answer at once, once, the same attempt
    tokens = srv.team(f"half{path.replace('/', '-')}", "a", "b")
    method = "GET" if path == "/v1/inbox" else "POST"
    proxy.faults.append((method, path, "half"))
    async with Client(proxy.url, tokens["a"]) as a, Client(proxy.url, tokens["b"]) as b:
        sent = [(await a.send("b", f"part {i}")).message_id for i in range(3)]
        if method == "GET":
            batch = await b.receive(limit=10, wait=10)
        else:
            batch = (await b.ack_and_receive([], limit=10, wait=10)).messages
        assert [(m.message_id, m.attempt) for m in batch] == [(i, 1) for i in sent]
        await b.ack([m.message_id for m in batch])
        assert await b.receive(wait=0) == []
    assert [w for m, p, w in proxy.seen if p == path][:2] == ["half", "pass"]


async def test_a_named_receive_hands_its_messages_to_that_name_alone(
    srv: Server,
) -> None:
    # the name is the receive's, not the member's: a second receiver of the same member
    # (its own receive, its own name) never gets what a lost answer held, and a receive
    # named as another one was (a client that reuses names) gets those only while they
    # are leased to that name, never a second copy once acked
    tokens = srv.team("cut-two", "a", "b")
    async with Client(srv.url, tokens["a"]) as a, Client(srv.url, tokens["b"]) as b2:
        first = await a.send("b", "one")
        second = await a.send("b", "two")
        held = await b2.receive(limit=1, receive_id="rcv-held")
        assert [m.message_id for m in held] == [first.message_id]
        other = await b2.receive(limit=5)
        assert [m.message_id for m in other] == [second.message_id]
        again = await b2.receive(limit=5, receive_id="rcv-held")
        assert [(m.message_id, m.attempt) for m in again] == [(first.message_id, 1)]
        await b2.ack([first.message_id, second.message_id])
        assert await b2.receive(limit=5, receive_id="rcv-held") == []


async def test_a_call_waits_for_its_answer_no_longer_than_the_clients_timeout(
    srv: Server, proxy: Faulty
) -> None:
    # the client's ``timeout`` was set on its HTTP client and then replaced by 30 s on
    # every call: a caller that asked for 1 s waited 30
    tokens = srv.team("slow", "a")
    proxy.faults.append(("GET", "/v1/inbox/pending", "hold"))
    try:
        async with Client(proxy.url, tokens["a"], timeout=1, retry_within=0) as a:
            with pytest.raises(PeerError, match="cannot reach the hub"):
                await asyncio.wait_for(a.pending(), 15)
    finally:
        proxy.release.set()


@pytest.mark.parametrize("bad", [0, -1, math.nan])
def test_a_timeout_that_is_no_time_is_refused_naming_it(bad: float) -> None:
    with pytest.raises(InvalidRequest, match="timeout must be a number of seconds above 0"):
        Client("http://127.0.0.1:9", "bc_x", timeout=bad)


@pytest.mark.parametrize("bad", [-1, math.nan])
def test_a_retry_time_that_is_no_time_is_refused_naming_it(bad: float) -> None:
    # NaN compared false with every deadline: a hub that was down was called forever
    with pytest.raises(InvalidRequest, match="retry_within must be a number of seconds"):
        Client("http://127.0.0.1:9", "bc_x", retry_within=bad)


async def test_a_receive_asked_to_wait_nan_seconds_is_answered_by_the_hub(
    srv: Server,
) -> None:
    # the client added NaN to its own timeout and raised a bare ValueError before asking
    tokens = srv.team("nan-wait", "a")
    async with Client(srv.url, tokens["a"]) as a:
        with pytest.raises(InvalidRequest, match="wait"):
            await a.receive(wait=math.nan)


# -- calls made again under their id, on every store ---------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres", "memory"])
def any_srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    home = tmp_path_factory.mktemp(f"sdkfaults-{request.param}") / "home"
    store = None
    if request.param == "memory":
        store = "memory://"
    elif request.param == "postgres":
        store = request.getfixturevalue("postgres_server").new_database()
    yield from _serving(home, store)


@pytest.fixture
def any_proxy(any_srv: Server) -> Iterator[Faulty]:
    yield from _faulty(any_srv)


def _events(srv: Server, token: str, session: str) -> list[str]:
    with srv.client(token) as c:
        r = c.get(f"/v1/sessions/{session}/transcript")
        r.raise_for_status()
        return [e["kind"] for e in r.json()["events"]]


async def test_a_turn_start_whose_answer_is_lost_starts_one_turn(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # made twice, turn_start would start a second turn (a retry: the ledger cleared)
    tokens = any_srv.team("cut-start", "a")
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        any_proxy.faults.append(
            ("POST", f"/v1/sessions/{s.session_id}/events", "cut", "turn_start")
        )
        started = await a.turn_start(s.session_id, "go")
        assert (started.turn, started.retried, started.replayed) == (1, False, True)
        assert (await a.session(s.session_id)).turn == 1
    assert _events(any_srv, tokens["a"], s.session_id).count("turn_start") == 1


async def test_an_agent_stop_whose_answer_is_lost_routes_its_closing_text_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # the hub routed the closing text (a block to b, the output across the link the
    # turn's send opened) and the answer was lost: made again, the stop is answered as it
    # was, and b gets each message once
    tokens = any_srv.team("cut-stop", "a", "b")
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        await a.turn_start(s.session_id, "go")
        await a.send("b", "starting", from_session=s.session_id)
        any_proxy.faults.append(
            ("POST", f"/v1/sessions/{s.session_id}/events", "cut", "agent_stop")
        )
        stopped = await a.agent_stop(s.session_id, 'all done <message to="b">ship it</message>')
        assert stopped.replayed and stopped.state == "idle" and len(stopped.sent or []) == 1
    got = _inbox(any_srv, tokens["b"])
    assert [(m["kind"], m["text"]) for m in got if m["from"] == "a"] == [
        ("direct", "starting"),
        ("direct", "ship it"),
        ("link", "[From a] all done"),
    ]
    assert _events(any_srv, tokens["a"], s.session_id).count("agent_stop") == 1


async def test_a_session_opened_whose_answer_is_lost_is_opened_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-open", "a")
    any_proxy.faults.append(("POST", "/v1/sessions", "cut"))
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        assert s.session_id.startswith("a-")
        assert [x.session_id for x in await a.list_sessions("a")] == [s.session_id]


async def test_a_timer_set_whose_answer_is_lost_is_set_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-timer", "a")
    any_proxy.faults.append(("POST", "/v1/timers", "cut"))
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        t = await a.set_timer("anchor", 5, "back to the report", session=s.session_id)
        assert [x.timer_id for x in await a.timers(all=True)] == [t.timer_id]


async def test_a_delegation_whose_answer_is_lost_is_made_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-delegate", "a", "b")
    any_proxy.faults.append(("POST", "/v1/delegations", "cut"))
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        await a.turn_start(s.session_id, "go")
        d = await a.delegate("b", "count the lines", session=s.session_id)
        assert d.replayed is True  # the hub answered the call the lost answer was of
        assert [x.delegation_id for x in await a.delegations()] == [d.delegation_id]
    async with Client(any_srv.url, tokens["b"]) as b:
        assert [x.session_id for x in await b.list_sessions("b")] == [d.callee_session]
        assert await b.pending() == 1  # the task, once


async def test_a_delegation_made_again_under_its_id_is_answered_replayed(
    any_srv: Server,
) -> None:
    """``POST /v1/delegations`` made again under the same ``tool_use_id`` answers the
    delegation the first made, 200 and ``replayed`` (as a send made again does), and the
    SDK says so; the first answer is 201, not replayed."""
    tokens = any_srv.team("again-delegate", "a", "b")
    async with Client(any_srv.url, tokens["a"]) as a:
        s = await a.open_session()
        await a.turn_start(s.session_id, "go")
        body = {"to": "b", "task": "count", "session": s.session_id, "tool_use_id": "tu_1"}
        with any_srv.client(tokens["a"]) as http:
            first = http.post("/v1/delegations", json=body)
            again = http.post("/v1/delegations", json=body)
        assert (first.status_code, first.json()["replayed"]) == (201, False), first.text
        assert (again.status_code, again.json()["replayed"]) == (200, True), again.text
        assert again.json()["delegation_id"] == first.json()["delegation_id"]
        d = await a.delegate("b", "count", session=s.session_id, tool_use_id="tu_1")
        assert (d.delegation_id, d.replayed) == (first.json()["delegation_id"], True)
        other = await a.delegate("b", "count", session=s.session_id, tool_use_id="tu_2")
        assert other.replayed is False
        listed = await a.delegations()
        assert {x.delegation_id for x in listed} == {d.delegation_id, other.delegation_id}
        assert not any(x.replayed for x in listed)  # a listing is no answer to a call


async def test_a_terminate_whose_answer_is_lost_is_made_again(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # ending a session is idempotent on the hub: made again, it answers the ended session
    tokens = any_srv.team("cut-terminate", "a")
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        any_proxy.faults.append(("POST", f"/v1/sessions/{s.session_id}/terminate", "cut"))
        done = await a.terminate_session(s.session_id, "finished")
        assert done.state == "terminated"
    path = f"/v1/sessions/{s.session_id}/terminate"
    assert [w for _, p, w in any_proxy.seen if p == path] == ["cut", "pass"]
    assert _events(any_srv, tokens["a"], s.session_id).count("session") == 2  # open, end


async def test_a_timer_cancel_whose_answer_is_lost_answers_the_cancelled_timer(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-cancel", "a")
    async with Client(any_proxy.url, tokens["a"]) as a:
        s = await a.open_session()
        t = await a.set_timer("anchor", 5, "back to the report", session=s.session_id)
        any_proxy.faults.append(("DELETE", f"/v1/timers/{t.timer_id}", "cut"))
        cancelled = await a.cancel_timer(t.timer_id)
        assert (cancelled.timer_id, cancelled.state) == (t.timer_id, "cancelled")
        assert await a.timers() == []
    assert [w for _, p, w in any_proxy.seen if p == f"/v1/timers/{t.timer_id}"] == [
        "cut",
        "pass",
    ]


async def test_a_reaction_whose_answer_is_lost_counts_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-react", "a", "b")
    async with Client(any_proxy.url, tokens["a"]) as a:
        sent = await a.send("b", "deploy at noon")
        path = f"/v1/messages/{sent.message_id}/reactions"
        any_proxy.faults.append(("POST", path, "cut"))
        await a.react(sent.message_id, "👍")
        report = await a.status(sent.message_id)
    assert [w for _, p, w in any_proxy.seen if p == path] == ["cut", "pass"]
    reactions = [(h.to, h.detail) for h in report.history if h.event == "reaction"]
    assert reactions == [("a", "👍")]


async def test_a_budget_extension_whose_answer_is_lost_extends_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("cut-extend", "a", "b")
    async with Client(any_proxy.url, tokens["user"]) as user:
        any_proxy.faults.append(("POST", "/v1/teams/cut-extend/budgets/extend", "cut"))
        budget = await user.extend_budget("pair:a|b", 3)
        assert budget.replayed and budget.granted == 3
        assert [b.granted for b in await user.budgets()] == [3]
    path = "/v1/teams/cut-extend/budgets/extend"
    assert [w for _, p, w in any_proxy.seen if p == path] == ["cut", "pass"]
    # each side and the human were told once
    for who in ("a", "b", "user"):
        told = [m for m in _inbox(any_srv, tokens[who]) if "extended" in m["text"]]
        assert len(told) == 1, (who, told)


async def test_a_token_rotation_whose_answer_is_lost_is_made_again(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # the token the lost answer held reached no one: a second rotation makes it useless
    # too, and the token this answer holds is the member's one
    tokens = any_srv.team("cut-rotate-again", "a")
    path = "/v1/teams/cut-rotate-again/members/a/token"
    any_proxy.faults.append(("POST", path, "cut"))
    async with Client(any_proxy.url, any_srv.admin_token) as admin:
        rotated = await admin.rotate_token("cut-rotate-again", "a")
    assert [w for _, p, w in any_proxy.seen if p == path] == ["cut", "pass"]
    async with Client(any_srv.url, rotated.token) as a:
        assert (await a.me()).name == "a"
    with any_srv.client(tokens["a"]) as old:
        assert old.get("/v1/me").status_code == 401


async def test_a_member_update_whose_answer_is_lost_is_made_again(
    any_srv: Server, any_proxy: Faulty
) -> None:
    any_srv.team("cut-update", "a")
    path = "/v1/teams/cut-update/members/a"
    any_proxy.faults.append(("PATCH", path, "cut"))
    async with Client(any_proxy.url, any_srv.admin_token) as admin:
        got = await admin.update_member("cut-update", "a", settings={"max_timers": 5})
        assert got.settings == {"max_timers": 5}
    assert [w for _, p, w in any_proxy.seen if p == path] == ["cut", "pass"]


# -- a send whose answer stays lost: the caller hears how to make its retry safe ----------


async def test_a_send_whose_answer_stays_lost_names_the_id_to_send_it_again_with(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # the hub stored the send, and every try of the client's within its retry time lost
    # its answer: the caller, who gave no id, hears the one the client picked, and the
    # same send made again with it is stored once
    tokens = any_srv.team("stays-lost", "a", "b")
    any_proxy.faults += [("POST", "/v1/messages", "cut")] * 8
    async with Client(any_proxy.url, tokens["a"], retry_within=0.5) as a:
        with pytest.raises(PeerError) as caught:
            await a.send("b", "deploy at noon")
        mid = caught.value.details.get("message_id")
        assert mid and f"message_id={mid!r}" in caught.value.message, caught.value.message
        any_proxy.faults.clear()
        sent = await a.send("b", "deploy at noon", message_id=mid)
    assert sent.replayed
    got = _inbox(any_srv, tokens["b"])
    assert [(m["message_id"], m["text"]) for m in got] == [(mid, "deploy at noon")]


async def test_a_batch_whose_answer_stays_lost_names_the_ids_to_send_it_again_with(
    any_srv: Server, any_proxy: Faulty
) -> None:
    tokens = any_srv.team("stays-lost-batch", "a", "b")
    any_proxy.faults += [("POST", "/v1/messages/batch", "cut")] * 8
    items = [{"to": "b", "text": "one"}, {"to": "b", "text": "two", "message_id": "mine-2"}]
    async with Client(any_proxy.url, tokens["a"], retry_within=0.5) as a:
        with pytest.raises(PeerError) as caught:
            await a.send_batch(items)
        ids = caught.value.details.get("message_ids")
        assert ids and ids[1] == "mine-2" and "message_ids" in caught.value.message
        any_proxy.faults.clear()
        again = [{**item, "message_id": i} for item, i in zip(items, ids, strict=True)]
        sent = await a.send_batch(again)
    assert [r.sent and r.sent.replayed for r in sent.results] == [True, True]
    assert [m["text"] for m in _inbox(any_srv, tokens["b"])] == ["one", "two"]


def test_the_cli_send_whose_answer_stays_lost_says_how_to_send_it_once(
    any_srv: Server, any_proxy: Faulty
) -> None:
    # `backchannel send` tries for a second; its answer lost past that, it prints the
    # command that sends it again as the same message
    tokens = any_srv.team("stays-lost-cli", "a", "b")
    any_proxy.faults += [("POST", "/v1/messages", "cut")] * 8
    env = {**os.environ, "BACKCHANNEL_TOKEN": tokens["a"], "COLUMNS": "1000"}
    cmd = [str(BIN), "send", "b", "deploy at noon", "--url", any_proxy.url]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode != 0
    said = " ".join(first.stderr.split())
    m = re.search(r"--id (\S+)", said)
    assert m, said
    any_proxy.faults.clear()
    again = subprocess.run(
        [*cmd, "--id", m.group(1)], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == m.group(1)
    got = _inbox(any_srv, tokens["b"])
    assert [(g["message_id"], g["text"]) for g in got] == [(m.group(1), "deploy at noon")]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_receive_made_again_on_another_hub_gets_what_the_first_leased(
    tmp_path: Path, new_postgres_url: Any
) -> None:
    # two hubs on one PostgreSQL behind a load balancer: the answer of the first receive
    # (on hub A) was lost, and the client's retry under the same name reached hub B,
    # which answers what A leased, at once and the same attempt
    url = new_postgres_url()
    hub_a = start_server(tmp_path / "a", url)
    try:
        hub_b = start_server(tmp_path / "b", url)
        try:
            tokens = hub_a.team("two-hubs", "a", "b")
            with hub_a.client(tokens["a"]) as a:
                r = a.post("/v1/messages", json={"to": "b", "text": "deploy at noon"})
                r.raise_for_status()
                sent = r.json()["message_id"]
            params = {"receive_id": "rcv-across-hubs", "limit": 5}
            with hub_a.client(tokens["b"]) as on_a:  # its answer is what the proxy lost
                first = on_a.get("/v1/inbox", params=params).json()["messages"]
            assert [m["message_id"] for m in first] == [sent]
            with hub_b.client(tokens["b"]) as on_b:
                again = on_b.get("/v1/inbox", params=params).json()["messages"]
                other = on_b.get("/v1/inbox", params={"limit": 5}).json()["messages"]
            assert [(m["message_id"], m["attempt"]) for m in again] == [(sent, 1)]
            assert other == []
        finally:
            hub_b.stop()
    finally:
        hub_a.stop()


# -- the inbox event stream, cut by a proxy after the hub wrote to it ----------------


def _stream(
    url: str, token: str, want: int, params: dict[str, str], last: str | None = None
) -> list[tuple[str, int]]:
    """The ``(message_id, attempt)`` of the ``message`` events ``GET /v1/inbox/stream``
    sends, read until ``want`` came, the connection ended, or 10 s passed with none."""
    headers = {"Authorization": f"Bearer {token}"}
    if last is not None:
        headers["Last-Event-ID"] = last
    got: list[tuple[str, int]] = []
    with (
        httpx.Client(timeout=10) as c,
        c.stream("GET", url + "/v1/inbox/stream", params=params, headers=headers) as r,
    ):
        r.raise_for_status()
        try:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    m = json.loads(line[6:])
                    got.append((m["message_id"], m["attempt"]))
                    if len(got) == want:
                        break
        except (httpx.RemoteProtocolError, httpx.ReadTimeout):
            pass  # cut, or nothing more within the deadline
    return got


@pytest.mark.parametrize("resume", [True, False])
def test_an_event_stream_cut_after_the_hub_wrote_resumes_under_its_name_at_once(
    srv: Server, proxy: Faulty, resume: bool
) -> None:
    # the hub wrote three messages to the stream and a proxy passed on only the first
    # before cutting it: the reader opens the stream again under the same receive_id and
    # gets the two it never read at once, the same attempt (before: they stayed leased
    # to nobody for the whole lease, 60 s, and came back as attempt 2); told the last
    # event it saw (Last-Event-ID), it is not sent that one again, and otherwise it is
    tokens = srv.team(f"cut-stream-{resume}", "a", "b")
    with srv.client(tokens["a"]) as a:
        sent = [a.post("/v1/messages", json={"to": "b", "text": f"part {i}"}) for i in range(3)]
    ids = [r.json()["message_id"] for r in sent]
    proxy.written = 3
    proxy.faults.append(("GET", "/v1/inbox/stream", "event"))
    name = {"receive_id": f"rcv-stream-{resume}"}
    assert _stream(proxy.url, tokens["b"], 3, name) == [(ids[0], 1)]
    last = ids[0] if resume else None
    want = ids[1:] if resume else ids
    again = _stream(srv.url, tokens["b"], len(want), name, last)
    assert again == [(i, 1) for i in want]
    with srv.client(tokens["b"]) as b:
        assert b.post("/v1/inbox/ack", json={"message_ids": ids}).json()["acked"] == 3
        assert b.get("/v1/inbox/pending").json()["pending"] == 0


def test_a_stream_resumed_after_a_message_leased_out_of_send_order_skips_nothing(
    srv: Server, proxy: Faulty
) -> None:
    # the stream sent "second" (the first, "first", was leased by another receive), then
    # "first" once that receive gave it back; a proxy passed on only "second" and cut the
    # stream. Opened again after "second" (Last-Event-ID), the stream sends "first":
    # before, what counted as after the last event id was the send order of what the
    # name held ("first" came before "second"), so "first" was skipped and waited out
    # its lease
    tokens = srv.team("resume-order", "a", "b")
    with srv.client(tokens["a"]) as a:
        sent = [a.post("/v1/messages", json={"to": "b", "text": t}) for t in ("first", "second")]
    first, second = (r.json()["message_id"] for r in sent)
    with srv.client(tokens["b"]) as b:
        taken = b.get("/v1/inbox", params={"limit": 1}).json()["messages"]
        assert [m["message_id"] for m in taken] == [first]
        proxy.written = 2
        proxy.faults.append(("GET", "/v1/inbox/stream", "event"))
        name = {"receive_id": "rcv-resume-order"}
        out: list[list[tuple[str, int]]] = []
        reading = threading.Thread(
            target=lambda: out.append(_stream(proxy.url, tokens["b"], 2, name)), daemon=True
        )
        reading.start()
        eventually_blocking(
            lambda: _state(b, second) == "leased", what="the stream to lease 'second'"
        )
        assert b.post("/v1/inbox/release", json={"message_ids": [first]}).json()["released"] == 1
        reading.join(30)
        assert out == [[(second, 1)]]
        again = _stream(srv.url, tokens["b"], 1, name, second)
        assert again == [(first, 2)]
        assert b.post("/v1/inbox/ack", json={"message_ids": [first, second]}).json()["acked"] == 2


def test_a_stream_through_a_proxy_that_stopped_forwarding_holds_only_its_window(
    srv: Server, proxy: Faulty
) -> None:
    # a proxy passed on the stream's first event and then stopped forwarding, both
    # connections open: the hub sees nothing wrong. Before, the stream leased every
    # message the member got, and another receiver of the member got none for the whole
    # lease; now it holds its window (limit, 4 here) and the others, and those sent
    # later, go to the other receiver at once
    tokens = srv.team("stalled-proxy", "a", "b")
    with srv.client(tokens["a"]) as a:
        ids = [
            a.post("/v1/messages", json={"to": "b", "text": f"part {i}"}).json()["message_id"]
            for i in range(6)
        ]
    proxy.faults.append(("GET", "/v1/inbox/stream", "stall"))
    try:
        params = {"receive_id": "rcv-stalled", "limit": "4"}
        assert _stream(proxy.url, tokens["b"], 1, params) == [(ids[0], 1)]
        with srv.client(tokens["a"]) as a:
            r = a.post("/v1/messages", json={"to": "b", "text": "later"})
            ids.append(r.json()["message_id"])
        with srv.client(tokens["b"]) as b:
            got = b.get("/v1/inbox", params={"limit": 50}).json()["messages"]
            assert [m["message_id"] for m in got] == ids[4:]
    finally:
        proxy.release.set()


def _state(client: httpx.Client, message_id: str) -> str:
    """The delivery state of the member's copy of ``message_id``."""
    r = client.get(f"/v1/messages/{message_id}")
    r.raise_for_status()
    return str(r.json()["deliveries"][0]["state"])
