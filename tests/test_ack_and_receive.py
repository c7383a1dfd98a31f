"""A receive that acks first: the member's finished messages are acked in the same store
transaction as the first lease attempt, committed before any wait; ids not held fail
nothing. The hub, the HTTP route ``POST /v1/inbox/receive`` and the SDK (in-process and
over HTTP) say the same."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from backchannel import Client, connect_sync
from backchannel.client import HttpTransport
from backchannel.errors import InvalidRequest, UnknownSession
from backchannel.hub import AckResult, Hub, HubMiddleware
from backchannel.interfaces.http import create_app
from backchannel.models import MAX_BATCH
from backchannel.stores.base import Tx
from backchannel.stores.memory import MemoryStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock
from backchannel.types import DeliveryState

T = TypeVar("T")
ADMIN = "admin-token"


class CountingStore(MemoryStore):
    """The memory store, counting its write transactions."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        self.transactions += 1
        return await super().transact(fn)


@dataclass
class AckLog(HubMiddleware):
    """Every committed ack, and an event set by the next one."""

    acks: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    next_ack: asyncio.Event = field(default_factory=asyncio.Event)

    def after_ack(self, hub: Hub, team: str, member: str, message_ids: Sequence[str]) -> None:
        self.acks.append((team, member, tuple(message_ids)))
        self.next_ack.set()


@dataclass
class Rig:
    hub: Hub
    store: CountingStore
    log: AckLog
    http: httpx.AsyncClient
    tokens: dict[str, str]

    def auth(self, member: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[member]}"}

    def over_http(self, member: str) -> Client:
        transport = httpx.ASGITransport(app=self.http._transport.app)  # type: ignore[attr-defined]
        return Client.over(HttpTransport("http://hub", self.tokens[member], transport=transport))

    def in_process(self, member: str) -> Client:
        return Client.local(self.hub, self.tokens[member])

    async def send(self, n: int, to: str = "b") -> list[str]:
        return [(await self.hub.send("t", "a", to, f"m{i}")).message_id for i in range(n)]

    async def state(self, message_id: str) -> DeliveryState:
        return (await self.hub.message_status("t", message_id)).state


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    store, log = CountingStore(), AckLog()
    hub = Hub(store, clock=FakeClock(), background=False, middleware=[log])
    await hub.start()
    app = create_app(hub, ADMIN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://hub"
    ) as http:
        admin = Client.local(hub)
        await admin.start()
        team = await admin.create_team("t")
        tokens = {"user": team.user_token}
        for name in ("a", "b", "c"):
            tokens[name] = (await admin.add_member("t", name)).token
        yield Rig(hub, store, log, http, tokens)
    await hub.close()


# -- the hub ------------------------------------------------------------------------------


async def test_the_ack_and_the_lease_are_one_store_transaction(rig: Rig) -> None:
    m0, m1, m2 = await rig.send(3)
    first = await rig.hub.receive("t", "b", limit=1)
    assert [g.message.message_id for g in first] == [m0]
    assert first.acked == AckResult((), ())
    before = rig.store.transactions
    got = await rig.hub.receive("t", "b", limit=10, ack=[m0])
    assert rig.store.transactions == before + 1
    assert [g.message.message_id for g in got] == [m1, m2]
    assert got.acked == AckResult((m0,), ())
    assert await rig.state(m0) is DeliveryState.ACKED
    # the ack's after-commit effects are those of a plain ack, once
    assert rig.log.acks == [("t", "b", (m0,))]
    # a plain receive is one transaction, as before
    before = rig.store.transactions
    assert await rig.hub.receive("t", "b") == []
    assert rig.store.transactions == before + 1


async def test_ids_not_held_are_reported_and_fail_nothing(rig: Rig) -> None:
    m0, m1 = await rig.send(2)
    [c0] = await rig.send(1, to="c")
    await rig.hub.receive("t", "b", limit=1)
    got = await rig.hub.receive("t", "b", ack=[m0, c0, "nope", m1, m0])
    # m1 was queued when the ack ran: not held, then leased by the same receive
    assert got.acked == AckResult((m0,), (c0, "nope", m1))
    assert [g.message.message_id for g in got] == [m1]
    assert await rig.state(c0) is DeliveryState.QUEUED
    only_unknown = await rig.hub.receive("t", "b", ack=["gone-1"])
    assert only_unknown == [] and only_unknown.acked == AckResult((), ("gone-1",))
    assert rig.log.acks == [("t", "b", (m0,))]


async def test_too_many_ids_or_a_failed_receive_ack_nothing(rig: Rig) -> None:
    [m0] = await rig.send(1)
    await rig.hub.receive("t", "b")
    with pytest.raises(InvalidRequest, match="at most 1000") as exc:
        await rig.hub.receive("t", "b", ack=[m0] * 1001)
    assert exc.value.details["field"] == "ack"
    with pytest.raises(UnknownSession):
        await rig.hub.receive("t", "b", session="not-mine", ack=[m0])
    assert await rig.state(m0) is DeliveryState.LEASED
    assert rig.log.acks == []


async def test_a_waiting_receive_committed_its_ack_before_the_wait(rig: Rig) -> None:
    [m0] = await rig.send(1)
    await rig.hub.receive("t", "b")
    waiting = asyncio.create_task(rig.hub.receive("t", "b", wait=60, ack=[m0]))
    await asyncio.wait_for(rig.log.next_ack.wait(), 5)
    # the sender sees the ack while the receive still waits for a message
    assert (await rig.hub.message_status("t", m0, viewer="a")).state is DeliveryState.ACKED
    assert not waiting.done()
    [m1] = await rig.send(1)
    got = await asyncio.wait_for(waiting, 5)  # woken by the send, far below 60 s
    assert [g.message.message_id for g in got] == [m1]
    assert got.acked == AckResult((m0,), ())
    assert rig.log.acks == [("t", "b", (m0,))]  # the lease after the wake acked nothing


# -- HTTP ----------------------------------------------------------------------------------


async def test_http_acks_then_receives(rig: Rig) -> None:
    m0, m1 = await rig.send(2)
    r = await rig.http.get("/v1/inbox", params={"limit": 1}, headers=rig.auth("b"))
    assert [m["message_id"] for m in r.json()["messages"]] == [m0]
    r = await rig.http.post(
        "/v1/inbox/receive", json={"ack": [m0, "nope"], "limit": 5}, headers=rig.auth("b")
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [m["message_id"] for m in body["messages"]] == [m1]
    assert body["messages"][0]["from"] == "a"
    assert (body["acked"], body["not_held"]) == (1, ["nope"])
    assert await rig.state(m0) is DeliveryState.ACKED
    # no ids, an integer wait and the other parameters of GET /v1/inbox
    r = await rig.http.post(
        "/v1/inbox/receive",
        json={"limit": 1, "wait": 0, "lease": 5, "pinned_only": False},
        headers=rig.auth("b"),
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"messages": [], "acked": 0, "not_held": []}


@pytest.mark.parametrize(
    "body",
    [
        {"ack": ["bad id!"]},
        {"ack": [""]},
        {"ack": "m-1"},
        {"ack": [5]},
        {"ack": [f"m-{i}" for i in range(MAX_BATCH + 1)]},
        {"limit": 0},
        {"limit": 1001},
        {"wait": 3601},
        {"wait": -1},
        {"lease": 0},
        {"session": "bad session"},
        {"pinned_only": 1},
        {"acks": []},
        {"receive_id": ""},
        {"receive_id": "no spaces"},
        {"receive_id": "x" * 129},
        {"receive_id": 7},
    ],
)
async def test_http_refuses_bad_input_with_422(rig: Rig, body: dict[str, Any]) -> None:
    r = await rig.http.post("/v1/inbox/receive", json=body, headers=rig.auth("b"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"]


@pytest.mark.parametrize("bad", ["", "no spaces", "-leading", "x" * 129])
async def test_a_bad_receive_name_is_refused_naming_it(rig: Rig, bad: str) -> None:
    r = await rig.http.get("/v1/inbox", params={"receive_id": bad}, headers=rig.auth("b"))
    assert r.status_code == 422, r.text
    assert "receive_id" in r.text
    with pytest.raises(InvalidRequest, match="receive_id") as caught:
        await rig.hub.receive("t", "b", receive_id=bad)
    assert "the same when that receive is made again" in str(caught.value)


async def test_a_named_receive_made_again_is_answered_what_it_leased(rig: Rig) -> None:
    # the first answer was lost on the way: the same name gets the same messages, the
    # same attempt, nothing else leased and no transaction's reactions run twice; a new
    # name gets the rest; once acked, the old name gets nothing of them again
    sent = await rig.send(4)
    first = await rig.hub.receive("t", "b", limit=2, receive_id="rcv-1")
    again = await rig.hub.receive("t", "b", limit=2, receive_id="rcv-1")
    assert [(m.message.message_id, m.attempt) for m in again] == [(i, 1) for i in sent[:2]]
    assert [m.message.message_id for m in first] == sent[:2]
    rest = await rig.hub.receive("t", "b", limit=5, receive_id="rcv-2")
    assert [m.message.message_id for m in rest] == sent[2:]
    later = await rig.hub.receive("t", "b", limit=5, ack=sent[:2], receive_id="rcv-1")
    assert later.acked.acked == tuple(sent[:2]) and list(later) == []
    assert [await rig.state(i) for i in sent] == [DeliveryState.ACKED] * 2 + [
        DeliveryState.LEASED
    ] * 2


async def test_a_named_receive_handed_its_message_by_a_send_holds_it_by_name(
    rig: Rig,
) -> None:
    # the receive waited on an empty inbox and the send leased its message for it in the
    # send's own transaction: that lease is the named receive's too
    waiting = asyncio.ensure_future(rig.hub.receive("t", "b", wait=5, receive_id="rcv-w"))
    for _ in range(500):  # until the receive waits (5 s at most)
        if rig.hub.env.takers:
            break
        await asyncio.sleep(0.01)
    assert rig.hub.env.takers, "the receive never waited"
    [sent] = await rig.send(1)
    assert [m.message.message_id for m in await waiting] == [sent]
    again = await rig.hub.receive("t", "b", receive_id="rcv-w")
    assert [(m.message.message_id, m.attempt) for m in again] == [(sent, 1)]


async def test_http_needs_a_member_token(rig: Rig) -> None:
    r = await rig.http.post(
        "/v1/inbox/receive", json={}, headers={"Authorization": "Bearer bc_nope"}
    )
    assert r.status_code == 401
    r = await rig.http.post(
        "/v1/inbox/receive", json={}, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert r.status_code == 403


def _receive_scope(raw: bytes, token: str) -> dict[str, Any]:
    """The ASGI scope of ``POST /v1/inbox/receive`` with body ``raw``, as ``token``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/inbox/receive",
        "raw_path": b"/v1/inbox/receive",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"hub"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("hub", 80),
    }


async def test_http_long_poll_whose_client_leaves_keeps_its_ack_and_leases_nothing(
    rig: Rig,
) -> None:
    [m0] = await rig.send(1)
    await rig.hub.receive("t", "b")
    app = rig.http._transport.app  # type: ignore[attr-defined]
    raw = json.dumps({"ack": [m0], "wait": 60}).encode()
    left = asyncio.Event()
    events = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = _receive_scope(raw, rig.tokens["b"])
    call = asyncio.create_task(app(scope, receive, send))
    await asyncio.wait_for(rig.log.next_ack.wait(), 5)
    assert await rig.state(m0) is DeliveryState.ACKED
    assert not call.done()
    left.set()
    await asyncio.wait_for(call, 5)  # the wait ended with the client, far below 60 s
    assert sent[0]["status"] == 200
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert answer == {"messages": [], "acked": 1, "not_held": []}
    [m1] = await rig.send(1)
    assert await rig.state(m1) is DeliveryState.QUEUED  # nothing leased for nobody


# -- the SDK --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["in_process", "over_http"])
async def test_sdk_acks_then_receives(rig: Rig, where: str) -> None:
    m0, m1, m2 = await rig.send(3)
    async with getattr(rig, where)("b") as cb:
        [first] = await cb.receive(limit=1)
        got = await cb.ack_and_receive([first.message_id, "nope"], limit=1)
        assert [m.message_id for m in got.messages] == [m1]
        assert (got.acked, got.not_held) == (1, ["nope"])
        # the messages it hands out ack themselves as receive's do
        await got.messages[0].ack()
        assert await rig.state(m1) is DeliveryState.ACKED
        last = await cb.ack_and_receive([], wait=1)
        assert [m.message_id for m in last.messages] == [m2]
        assert (last.acked, last.not_held) == (0, [])
        done = await cb.ack_and_receive([m.message_id for m in last.messages])
        assert (done.messages, done.acked) == ([], 1)
        assert await cb.pending() == 0
    assert await rig.state(m0) is DeliveryState.ACKED


def test_sync_client_acks_then_receives(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 's.db'}"
    with connect_sync(url) as admin:
        admin.create_team("s")
        a = admin.add_member("s", "a")["token"]
        b = admin.add_member("s", "b")["token"]
    with connect_sync(url, a) as ca, connect_sync(url, b) as cb:
        ca.send("b", "one", message_id="s-1")
        ca.send("b", "two", message_id="s-2")
        [one] = cb.receive(limit=1)
        got = cb.ack_and_receive([one.message_id], wait=5)
        assert [m.text for m in got.messages] == ["two"]
        assert got.acked == 1
        got.messages[0].ack()
        assert cb.pending() == 0


@pytest.mark.parametrize("wait", [0, 30])
async def test_http_receive_whose_client_left_as_it_leased_gives_the_messages_back(
    rig: Rig, wait: int
) -> None:
    """The client is gone by the time the lease comes back: what was leased is released
    at once (not held for the lease's length), whether a watch ran (a wait) or not."""
    [m0] = await rig.send(1)
    app = rig.http._transport.app  # type: ignore[attr-defined]
    raw = json.dumps({"wait": wait}).encode()
    events = [{"type": "http.disconnect"}, {"type": "http.request", "body": raw}]

    async def receive() -> dict[str, Any]:
        return events.pop() if events else {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = _receive_scope(raw, rig.tokens["b"])
    await asyncio.wait_for(app(scope, receive, send), 5)
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert answer["messages"] == []
    assert await rig.state(m0) is DeliveryState.QUEUED  # given back, not leased


class GatedStore(SqliteStore):
    """SQLite, with the next write transaction (once :meth:`arm` is called) held in the
    writer thread after its function ran and before it commits, until :attr:`go`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.armed = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def arm(self) -> None:
        self.armed = True

    def transact(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        if not self.armed:
            return super().transact(fn)
        self.armed = False

        def held(tx: Tx) -> T:
            out = fn(tx)
            self.entered.set()
            self.go.wait(10)
            return out

        # told how it ended, as the function it wraps asks (tell_finished)
        held.finished = getattr(fn, "finished", None)  # type: ignore[attr-defined]
        return super().transact(held)


async def test_a_named_receive_cancelled_as_it_leased_and_made_again_gets_its_message_once(
    tmp_path: Path,
) -> None:
    """A named receive is cancelled (its client timed out) while its lease commits, and
    the client makes it again under the same name at once: the receive made again is
    answered with the message the first one leased. The hub's give-back of the cancelled
    receive's lease must not put that message back in the queue behind the client's
    back: acked, it is gone, and no later receive gets it again."""
    store = GatedStore(tmp_path / "gated.db")
    hub = Hub(store, clock=FakeClock(), background=False)
    await hub.start()
    try:
        admin = Client.local(hub)
        await admin.start()
        await admin.create_team("t")
        for name in ("a", "b"):
            await admin.add_member("t", name)
        m0 = (await hub.send("t", "a", "b", "m0")).message_id
        store.arm()
        first = asyncio.create_task(hub.receive("t", "b", receive_id="rcv-1", wait=0))
        assert await asyncio.to_thread(store.entered.wait, 10), "the lease never ran"
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        again = asyncio.create_task(hub.receive("t", "b", receive_id="rcv-1", wait=0))
        await asyncio.sleep(0)  # made again before the first one's lease commits
        store.go.set()
        got = await asyncio.wait_for(again, 10)
        assert [m.message.message_id for m in got] == [m0]
        done = await hub.receive("t", "b", ack=[m0], receive_id="rcv-2", wait=0)
        assert done.acked.acked == (m0,), done.acked
        assert list(done) == []
        later = await hub.receive("t", "b", receive_id="rcv-3", wait=0)
        assert [m.message.message_id for m in later] == []
        assert (await hub.message_status("t", m0)).state is DeliveryState.ACKED
    finally:
        await hub.close()


class GiveBackGatedStore(GatedStore):
    """:class:`GatedStore` whose write transactions, once :meth:`hold_rest` is called,
    are handed to the writer only when :attr:`later` is set (the give-back a cancelled
    receive leaves behind waits in :attr:`waiting` meanwhile)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.holding = False
        self.later = asyncio.Event()
        self.waiting = asyncio.Event()
        self.done: list[asyncio.Future[Any]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def hold_rest(self) -> None:
        self.holding = True

    def transact(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        if not self.holding or self.armed:
            return super().transact(fn)
        out: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        async def run() -> None:
            self.waiting.set()
            await self.later.wait()
            try:
                out.set_result(await SqliteStore.transact(self, fn))
            except BaseException as e:
                out.set_exception(e)

        self.done.append(out)
        self.tasks.add(asyncio.ensure_future(run()))
        return out


async def test_a_named_receive_cancelled_as_it_leased_and_made_again_on_another_hub_gets_its_message_once(
    tmp_path: Path,
) -> None:
    """Two hubs on one SQLite file. A named receive on the first is cancelled while its
    lease commits; its client makes it again at once under the same name, and the second
    hub answers it with the message the first one leased. The first hub's give-back of
    that lease, which runs after, names the lease it gives back: the copy, answered again
    since, is under another lease and stays with the client, whose ack is taken, and no
    other receive gets the message."""
    path = tmp_path / "two.db"
    clock = FakeClock()
    store = GiveBackGatedStore(path)
    first_hub = Hub(store, clock=clock, background=False)
    other_hub = Hub(SqliteStore(path), clock=clock, background=False)
    await first_hub.start()
    await other_hub.start()
    try:
        admin = Client.local(first_hub)
        await admin.start()
        await admin.create_team("t")
        for name in ("a", "b"):
            await admin.add_member("t", name)
        m0 = (await first_hub.send("t", "a", "b", "m0")).message_id
        store.arm()
        first = asyncio.create_task(first_hub.receive("t", "b", receive_id="rcv-1", wait=0))
        assert await asyncio.to_thread(store.entered.wait, 10), "the lease never ran"
        store.hold_rest()
        first.cancel()
        store.go.set()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await asyncio.wait_for(store.waiting.wait(), 10)  # the give-back is on its way
        again = await other_hub.receive("t", "b", receive_id="rcv-1", wait=0)
        assert [(m.message.message_id, m.attempt) for m in again] == [(m0, 1)]
        store.later.set()
        for done in list(store.done):
            await asyncio.wait_for(done, 10)
        assert (await other_hub.message_status("t", m0)).state is DeliveryState.LEASED
        assert list(await other_hub.receive("t", "b", receive_id="rcv-2", wait=0)) == []
        acked = await other_hub.receive("t", "b", ack=[m0], receive_id="rcv-3", wait=0)
        assert acked.acked.acked == (m0,), acked.acked
        assert (await other_hub.message_status("t", m0)).state is DeliveryState.ACKED
    finally:
        await other_hub.close()
        await first_hub.close()
