"""Replayed callbacks and tasks, over real sockets: an answer to a delegation (a signed,
one-time reply token on ``/api/tools/response``) or a task (``/api/chat``) sent again,
byte for byte, right away, twice at once, after it was taken, after its token expired,
to another hub, with one field changed: refused with a clear error or answered as the
first time, and the caller's model (or the callee's) gets it once."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.hub import Hub
from backchannel.stores.base import Store
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import eventually
from backchannel.types import DelegationState, MessageKind
from tests.helpers_hubs import chat_bodies
from tests.peers import Peer, QuietHandler
from tests.test_delegation import FAST

pytestmark = pytest.mark.timeout(120)

SECRET = "replay-secret-0123456789"


class _OffsetClock:
    """The wall clock, ``offset`` seconds ahead: moved on to expire a token."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


class HubB(Peer):
    """The callee's hub as hub A reaches it: takes each ``/api/chat`` (202) and keeps
    its body, where the reply token hub A signed travels."""

    def __init__(self) -> None:
        self.chats: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        peer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with peer.lock:
                    peer.chats.append({"path": self.path, **json.loads(body)})
                self.send_response(202)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.serve(Handler)


@dataclass
class Running:
    hub: Hub
    url: str
    clock: _OffsetClock
    tokens: dict[str, str] = field(default_factory=dict)


@asynccontextmanager
async def serving(
    path: Path, services: Mapping[str, Service], *, secret: str = SECRET, name: str = "hub-a"
) -> AsyncIterator[Running]:
    """A hub on SQLite at ``path``, served by uvicorn on a real socket, whose callback
    registry holds ``services``."""
    import uvicorn

    from backchannel.interfaces.http import create_app

    clock = _OffsetClock()
    cfg = CallbackConfig(secret=secret, service_name=name, services=services, retry=FAST)
    hub = Hub(SqliteStore(path), clock=clock, callbacks=cfg)
    config = uvicorn.Config(create_app(hub, "admin"), host="127.0.0.1", port=0, log_level="error")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the hub to listen")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        yield Running(hub, url, clock)
    finally:
        server.should_exit = True
        await task
        await hub.close()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "content-type": "application/json"}


async def _inbox(http: httpx.AsyncClient, url: str, token: str, session: str) -> list[Any]:
    r = await http.get(
        f"{url}/v1/inbox", params={"session": session, "limit": 50}, headers=_auth(token)
    )
    assert r.status_code == 200, r.text
    got: list[Any] = r.json()["messages"]
    if got:
        ids = [m["message_id"] for m in got]
        await http.post(f"{url}/v1/inbox/ack", json={"message_ids": ids}, headers=_auth(token))
    return got


async def _delegate_out(
    http: httpx.AsyncClient, a: Running, hub_b: HubB, member: str, session: str, tuid: str
) -> dict[str, Any]:
    """``member`` of hub A delegates to worker@hub-b in a turn of ``session`` that then
    ends: the task goes to hub B. Returns the /api/chat body hub B got (its token)."""
    token = a.tokens[member]
    r = await http.post(f"{a.url}/v1/sessions", json={"session_id": session}, headers=_auth(token))
    assert r.status_code in (200, 201), r.text
    events = f"{a.url}/v1/sessions/{session}/events"
    await http.post(events, json={"kind": "turn_start"}, headers=_auth(token))
    r = await http.post(
        f"{a.url}/v1/delegations",
        json={"to": "worker@hub-b", "task": f"task of {member}", "tool_use_id": tuid},
        headers=_auth(token),
    )
    assert r.status_code == 201, r.text
    await http.post(events, json={"kind": "agent_stop", "text": ""}, headers=_auth(token))

    def sent() -> dict[str, Any] | None:
        with hub_b.lock:
            mine = (
                c for c in hub_b.chats if (c["session_id"], c["tool_use_id"]) == (session, tuid)
            )
            return next(mine, None)

    found: dict[str, Any] = await eventually(sent, what=f"hub B to get the task {tuid}")
    return found


async def _delegation(http: httpx.AsyncClient, a: Running, member: str) -> dict[str, Any]:
    r = await http.get(f"{a.url}/v1/delegations", headers=_auth(a.tokens[member]))
    [d] = r.json()["delegations"]
    return dict(d)


async def test_a_replayed_answer_reaches_the_callers_model_once(tmp_path: Path) -> None:
    """Hub B's answer to lead's delegation, captured and sent again byte for byte: twice
    at once, again after it was taken, with its result changed, with a body naming
    another team's delegation, to another hub, and once the token's time is over. lead
    gets the answer in one tool result; boss's delegation (team ``others``) stays
    pending; each refusal says why."""
    hub_b = HubB()
    svc = Service("hub-b", hub_b.url, teams=frozenset({"leads", "others"}))
    try:
        async with (
            serving(tmp_path / "a.db", {"hub-b": svc}) as a,
            httpx.AsyncClient(timeout=30) as http,
        ):
            for team, member in (("leads", "lead"), ("others", "boss")):
                await a.hub.create_team(team, settings={"anchor_policy": "off"})
                a.tokens[member] = (await a.hub.add_member(team, member))[1]
            chat = await _delegate_out(http, a, hub_b, "lead", "lead-s", "tu_x")
            other = await _delegate_out(http, a, hub_b, "boss", "boss-s", "tu_x")
            assert chat["path"] == "/api/chat"
            token = chat["reply"]["bearerToken"]
            answer = json.dumps({"result": "3 TODOs: a, b, c"}).encode()
            url = f"{a.url}/api/tools/response"

            # (e) the same answer twice at once: one is taken, the other acknowledged
            both = await asyncio.gather(
                http.post(url, content=answer, headers=_auth(token)),
                http.post(url, content=answer, headers=_auth(token)),
            )
            assert [r.status_code for r in both] == [200, 200], [r.text for r in both]
            assert {r.json()["state"] for r in both} == {"answered"}
            got = await eventually(
                lambda: _inbox(http, a.url, a.tokens["lead"], "lead-s"),
                what="lead's tool result",
            )
            assert [(m["kind"], m["text"]) for m in got] == [
                ("tool_result", "Result of delegate(to='worker@hub-b') [tu_x]:\n3 TODOs: a, b, c")
            ]

            # (a) again after it was taken: acknowledged, nothing delivered again
            again = await http.post(url, content=answer, headers=_auth(token))
            assert (again.status_code, again.json()["state"]) == (200, "answered")
            # (c) one field changed, the token kept: the first answer stands
            changed = json.dumps({"result": "4 TODOs"}).encode()
            r = await http.post(url, content=changed, headers=_auth(token))
            assert r.status_code == 409, r.text
            assert "already answered with a different result" in r.json()["error"]["message"]
            # (d) the body names boss's delegation (another team's): the token decides
            naming = {
                "result": "3 TODOs: a, b, c",
                "team": "others",
                "delegation_id": (await _delegation(http, a, "boss"))["delegation_id"],
                "session_id": "boss-s",
            }
            r = await http.post(url, json=naming, headers=_auth(token))
            assert (r.status_code, r.json()["delegation_id"]) == (
                200,
                (await _delegation(http, a, "lead"))["delegation_id"],
            )
            # a token of lead's whose claims are made boss's, the signature kept: forged
            raw_b64, sig = token.split(".")
            claims = json.loads(base64.urlsafe_b64decode(raw_b64 + "=" * (-len(raw_b64) % 4)))
            theirs = other["reply"]["bearerToken"].split(".")[0]
            boss_claims = json.loads(base64.urlsafe_b64decode(theirs + "=" * (-len(theirs) % 4)))
            claims["tool_id"] = boss_claims["tool_id"]
            raw = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
            forged = base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + sig
            r = await http.post(url, content=answer, headers=_auth(forged))
            assert r.status_code == 401, r.text
            assert "signature does not match" in r.json()["error"]["message"]

            # (b) to another hub: one with its own secret, and one that shares this one's
            for secret in ("another-secret-0123456789", SECRET):
                async with serving(tmp_path / f"c-{len(secret)}.db", {}, secret=secret) as c:
                    await c.hub.create_team("leads", settings={"anchor_policy": "off"})
                    await c.hub.add_member("leads", "lead")
                    r = await http.post(
                        f"{c.url}/api/tools/response", content=answer, headers=_auth(token)
                    )
                    assert r.status_code == 401, r.text
                    said = r.json()["error"]["message"]
                    assert "signature does not match" in said or "matches no delegation" in said

            # past the token's time (the deadline and the grace after it): expired
            a.clock.offset += 300 + rules.TOKEN_GRACE + 1
            r = await http.post(url, content=answer, headers=_auth(token))
            assert r.status_code == 401, r.text
            assert "expired" in r.json()["error"]["message"]

            assert await _inbox(http, a.url, a.tokens["lead"], "lead-s") == []
            assert await _inbox(http, a.url, a.tokens["boss"], "boss-s") == []
            mine, theirs_d = (
                await _delegation(http, a, "lead"),
                await _delegation(http, a, "boss"),
            )
            assert (mine["state"], mine["result"]) == ("answered", "3 TODOs: a, b, c")
            assert theirs_d["state"] in ("pending", "timed_out")
            assert theirs_d["result"] is None
    finally:
        hub_b.close()


async def test_a_task_sent_again_without_ids_runs_once(tmp_path: Path) -> None:
    """Another hub's task without ``session_id`` or ``tool_use_id`` (the protocol lets
    a caller leave them out), sent again byte for byte, and twice at once: its one-time
    reply token makes it the same request, so worker's model gets the task once and its
    answer goes back once."""
    hub_a = HubB()  # the caller's hub, where the answer would go
    try:
        services = {"hub-a": Service("hub-a", hub_a.url)}
        async with (
            serving(tmp_path / "b.db", services, name="hub-b") as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await b.hub.create_team("workers", settings={"anchor_policy": "off"})
            worker = (await b.hub.add_member("workers", "worker"))[1]
            caller = (await b.hub.add_member("workers", "hub-a"))[1]
            body = json.dumps(
                {
                    "agent": "worker",
                    "message": "count the files",
                    "reply": {"callbackService": "hub-a", "bearerToken": "tok.en-1"},
                }
            ).encode()
            url = f"{b.url}/api/chat"
            first = await http.post(url, content=body, headers=_auth(caller))
            assert first.status_code == 202, first.text
            more = await asyncio.gather(
                *(http.post(url, content=body, headers=_auth(caller)) for _ in range(3))
            )
            assert [r.status_code for r in more] == [202] * 3, [r.text for r in more]
            ids = {r.json()["delegation_id"] for r in (first, *more)}
            assert len(ids) == 1, f"one request, {len(ids)} delegations"
            # another task with a token of its own is another request
            other = body.replace(b"tok.en-1", b"tok.en-2")
            r = await http.post(url, content=other, headers=_auth(caller))
            assert r.status_code == 202 and r.json()["delegation_id"] not in ids
            sessions = (
                await http.get(
                    f"{b.url}/v1/sessions", params={"member": "worker"}, headers=_auth(worker)
                )
            ).json()["sessions"]
            tasks = []
            for s in sessions:
                tasks += await _inbox(http, b.url, worker, s["session_id"])
            assert sorted(m["text"] for m in tasks if m["kind"] == "delegation") == [
                "count the files",
                "count the files",
            ], tasks
    finally:
        hub_a.close()


def _refused_as_unregistered(r: httpx.Response, named: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["service"]) == ("unknown_callback_service", named)
    assert "Known services: hub-a" in error["message"]


async def test_a_callback_address_not_in_the_registry_is_never_called(tmp_path: Path) -> None:
    """A task whose reply names an address instead of a registered service, or a
    delegation to ``agent@address``: refused naming the registry, and nothing is ever
    sent to the address."""
    listener = HubB()
    hub_a = HubB()
    try:
        services = {"hub-a": Service("hub-a", hub_a.url)}
        async with (
            serving(tmp_path / "b.db", services, name="hub-b") as b,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await b.hub.create_team("workers", settings={"anchor_policy": "off"})
            await b.hub.add_member("workers", "worker")
            caller = (await b.hub.add_member("workers", "hub-a"))[1]
            lead = (await b.hub.add_member("workers", "lead"))[1]
            hostport = listener.url.removeprefix("http://")
            for named in (listener.url, hostport, f"{listener.url}/api/tools/response"):
                r = await http.post(
                    f"{b.url}/api/chat",
                    json={
                        "agent": "worker",
                        "message": "x",
                        "session_id": "s",
                        "tool_use_id": "t",
                        "reply": {"callbackService": named, "bearerToken": "tok"},
                    },
                    headers=_auth(caller),
                )
                _refused_as_unregistered(r, named)
            await http.post(f"{b.url}/v1/sessions", json={"session_id": "l"}, headers=_auth(lead))
            await http.post(
                f"{b.url}/v1/sessions/l/events", json={"kind": "turn_start"}, headers=_auth(lead)
            )
            for to in (f"worker@{hostport}", f"worker@{listener.url}"):
                r = await http.post(
                    f"{b.url}/v1/delegations", json={"to": to, "task": "x"}, headers=_auth(lead)
                )
                _refused_as_unregistered(r, to.partition("@")[2])
            await http.post(
                f"{b.url}/v1/sessions/l/events",
                json={"kind": "agent_stop", "text": ""},
                headers=_auth(lead),
            )
            await b.hub.maintain()
            assert listener.chats == [] and hub_a.chats == []
    finally:
        listener.close()
        hub_a.close()


async def test_one_answer_sent_many_times_at_once_is_taken_once_on_every_store(
    make_store: Callable[[], Store],
) -> None:
    """Eight copies of one answer at once, on each store (PostgreSQL's writers of one
    team wait for each other; a copy that waited must see the answer the first one
    wrote, not the delegation it read before): one is taken, the others are
    acknowledged as repeats, none is a conflict, and lead gets one tool result."""
    services = {"hub-b": Service("hub-b", "http://127.0.0.1:9")}
    cfg = CallbackConfig(secret=SECRET, services=services, retry=FAST)
    async with Hub(make_store(), background=False, callbacks=cfg) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "lead")
        await hub.open_session("t", "lead", "lead-s")
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate("t", "lead", "lead-s", "worker@hub-b", "count", tool_use_id="tu_1")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")
        [body] = (await chat_bodies(hub)).values()
        token = body["reply"]["bearerToken"]
        got = await asyncio.gather(
            *(hub.accept_tool_response(token, "12 files") for _ in range(8)),
            return_exceptions=True,
        )
        assert [(x.state, x.result) for x in got] == [  # type: ignore[union-attr]
            (DelegationState.ANSWERED, "12 files")
        ] * 8, got
        results = await hub.receive("t", "lead", session="lead-s", limit=10)
        assert [
            (m.message.kind, m.message.meta["results"][0]["delegation_id"]) for m in results
        ] == [(MessageKind.TOOL_RESULT, d.delegation_id)]
