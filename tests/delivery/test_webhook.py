"""The webhook adapter against a real HTTP server on 127.0.0.1, driven by the dispatcher."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from backchannel.core.delegation import RetryPolicy
from backchannel.delivery.webhook import DELIVER_PATH, SIGNATURE_HEADER, verify
from backchannel.testing import eventually
from backchannel.types import MessageKind
from tests.delivery.conftest_adapters import (
    SECRET,
    Seen,
    answer,
    dispatching,
    endpoint,
    running_hub,
    state_of,
    wait_state,
)
from tests.peers import Flood


def _hook(service: str) -> dict[str, str]:
    return {"type": "webhook", "service": service}


async def test_delivered_signed_and_acked() -> None:
    with endpoint(answer(200, b'{"ok": true}')) as ep:
        async with running_hub({"bot": ep.url}, tokens={"bot": "svc-token"}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send(
                    "t", "user", "a", "hello\nworld", summary="hi", message_id="m-1", link=False
                )
                st = await wait_state(hub, "t", sent.message_id, "acked")
    assert ep.count() == 1
    req = ep.seen[0]
    assert req.path == DELIVER_PATH
    assert req.headers["authorization"] == "Bearer svc-token"
    assert req.headers["idempotency-key"] == "m-1"
    assert req.headers["x-backchannel-message-id"] == "m-1"
    assert req.headers["content-type"] == "application/json"
    sig = req.headers[SIGNATURE_HEADER.lower()]
    assert verify(SECRET, req.body, sig, now=time.time())
    assert not verify(SECRET, req.body + b" ", sig, now=time.time())
    assert not verify("other", req.body, sig, now=time.time())
    body = req.json()
    assert body["team"] == "t"
    assert body["message_id"] == "m-1"
    assert body["from"] == "user"
    assert body["to"] == "a"
    assert body["text"] == "hello\nworld"
    assert body["summary"] == "hi"
    events = [e.event for e in st.history]
    assert events == ["queued", "leased", "delivered", "acked"]
    assert "HTTP 200" in next(e.detail for e in st.history if e.event == "delivered")


async def test_slow_endpoint_does_not_delay_another_member() -> None:
    def slow(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        ep_slow.release.wait(15)
        return 200, b"", {}

    with endpoint(slow) as ep_slow, endpoint(answer(204)) as ep_fast:
        async with running_hub({"slow": ep_slow.url, "fast": ep_fast.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("slow"))
            await hub.add_member("t", "b", delivery=_hook("fast"))
            async with dispatching(hub):
                to_a = await hub.send("t", "user", "a", "for a", link=False)
                # a's POST has arrived and hangs...
                await eventually(lambda: ep_slow.count() == 1, what="a's POST")
                to_b = await hub.send("t", "user", "b", "for b", link=False)
                # ...and b's message is delivered all the same
                await wait_state(hub, "t", to_b.message_id, "acked", within=5)
                assert await state_of(hub, "t", to_a.message_id) == "leased"
                ep_slow.release.set()
                await wait_state(hub, "t", to_a.message_id, "acked")
    assert ep_fast.count() == 1
    assert ep_slow.count() == 1


async def test_503_then_200_is_delivered_once() -> None:
    def flaky(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        return (503, b"busy", {}) if n == 0 else (200, b"", {})

    with endpoint(flaky) as ep:
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "once", link=False)
                st = await wait_state(hub, "t", sent.message_id, "acked")
    assert ep.count() == 2
    assert [r.headers["x-backchannel-attempt"] for r in ep.seen] == ["1", "2"]
    assert [r.json()["message_id"] for r in ep.seen] == [sent.message_id] * 2
    events = [e.event for e in st.history]
    assert events.count("delivered") == 1
    assert events.count("acked") == 1
    assert "released" in events


async def test_404_is_dead_lettered_without_a_retry_storm() -> None:
    with endpoint(answer(404, b"no such hook")) as ep:
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                first = await hub.send("t", "user", "a", "one", link=False)
                second = await hub.send("t", "user", "a", "two", link=False)
                st1 = await wait_state(hub, "t", first.message_id, "dead")
                await wait_state(hub, "t", second.message_id, "dead")
                # one POST per message: the worker went on to the next without retrying
                assert ep.count() == 2
                notices = await hub.receive("t", "user", limit=10)
    reason = st1.deliveries[0].dead_reason or ""
    assert "HTTP 404" in reason
    assert "no such hook" in reason
    assert st1.deliveries[0].attempts == 1
    assert [n.message.kind for n in notices] == [MessageKind.SYSTEM, MessageKind.SYSTEM]
    assert "HTTP 404" in notices[0].message.text


async def test_garbage_body_with_2xx_is_delivered() -> None:
    garbage = b"\x00\xff<html>not json{{{"
    with endpoint(answer(202, garbage, {"Content-Type": "application/json"})) as ep:
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
    assert ep.count() == 1


async def test_unknown_service_is_dead_lettered_with_the_fix() -> None:
    with endpoint(answer(200)) as ep:
        async with running_hub({"billing": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("biling"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead")
    reason = st.deliveries[0].dead_reason or ""
    assert "unknown callback service 'biling'" in reason
    assert "did you mean 'billing'" in reason
    assert "Fix: register 'biling'" in reason
    assert ep.count() == 0


async def test_5xx_forever_gives_up_after_the_hubs_attempts() -> None:
    with endpoint(answer(500, b"boom")) as ep:
        async with running_hub({"bot": ep.url}, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead")
    assert ep.count() == 3
    reason = st.deliveries[0].dead_reason or ""
    assert reason.startswith("gave up after 3 attempt(s): HTTP 500")


async def test_redirect_is_not_followed() -> None:
    with (
        endpoint(answer(200)) as target,
        endpoint(lambda req, n: (307, b"", {"Location": target.url + DELIVER_PATH})) as ep,
    ):
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead")
    assert target.count() == 0
    assert "redirects are never followed" in (st.deliveries[0].dead_reason or "")


async def test_429_retry_after_is_honoured() -> None:
    def limited(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        return (429, b"", {"Retry-After": "0"}) if n == 0 else (200, b"", {})

    with endpoint(limited) as ep:
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                await wait_state(hub, "t", sent.message_id, "acked")
    assert ep.count() == 2


def test_body_is_the_message_json() -> None:
    # the signature covers exactly the bytes sent
    body = json.dumps({"a": 1}).encode()
    from backchannel.delivery.webhook import sign

    header = sign(SECRET, body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify(SECRET, body, header, now=1_700_000_100)
    assert not verify(SECRET, body, header, now=1_700_001_000)  # too old


@contextmanager
def trickling_endpoint(every: float) -> Iterator[tuple[str, list[float]]]:
    """A raw TCP server that reads the request and answers it one byte every ``every``
    seconds, forever: each read gets a byte well inside httpx's per-read timeout, so
    only a deadline on the whole attempt ends it. Yields the URL and the times the
    requests arrived."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()
    arrived: list[float] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            arrived.append(time.monotonic())
            for byte in itertools.cycle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 64):
                if stop.wait(every):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client gave up

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", arrived
    finally:
        stop.set()
        thread.join(5)
        srv.close()


async def test_trickling_endpoint_is_cut_off_at_the_attempt_timeout() -> None:
    # an answer dribbled out a byte at a time never trips a per-read timeout; the
    # attempt as a whole must still end at the policy's timeout, so the copy is
    # retried and given up (the sender told) instead of holding the member forever
    retry = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=30.0, timeout=1.0)
    with trickling_endpoint(every=0.1) as (url, arrived):
        async with running_hub({"bot": url}, retry=retry, max_attempts=2) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead", within=15)
                notices = await hub.receive("t", "user", limit=10)
    assert len(arrived) == 2
    # the retry came one timeout (plus the short backoff) after the first POST
    assert arrived[1] - arrived[0] < 3 * retry.timeout
    reason = st.deliveries[0].dead_reason or ""
    assert reason.startswith("gave up after 2 attempt(s): POST to service 'bot'")
    assert "timed out" in reason
    assert [n.message.kind for n in notices] == [MessageKind.SYSTEM]


@contextmanager
def flooding(status: int, **kw: Any) -> Iterator[Flood]:
    srv = Flood(status, **kw)
    try:
        yield srv
    finally:
        srv.close()


async def test_a_2xx_with_an_endless_body_is_delivered_once() -> None:
    # the service took the message; reading the body it sends after would time out the
    # attempt and deliver the message again, and again, to a service that has it
    retry = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=30.0, timeout=1.0)
    with flooding(200, endless=True) as srv:
        async with running_hub({"bot": srv.url}, retry=retry, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "acked", within=15)
    assert len(srv.requests) == 1
    assert [e.event for e in st.history].count("delivered") == 1


async def test_a_refusal_with_an_endless_body_is_dead_lettered_with_its_start() -> None:
    retry = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=30.0, timeout=1.0)
    with flooding(404, endless=True) as srv:
        async with running_hub({"bot": srv.url}, retry=retry, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead", within=15)
    assert len(srv.requests) == 1
    reason = st.deliveries[0].dead_reason or ""
    assert reason.startswith("HTTP 404 from service 'bot'") and "xxxx" in reason
    assert len(reason) < 1000


async def test_a_refusal_that_echoes_the_token_does_not_put_it_in_the_dead_letter() -> None:
    # the reason goes to the sender, a member of the team, who never holds the token
    def echo(req: Seen, n: int) -> tuple[int, bytes, dict[str, str]]:
        return 400, f"bad request: {req.headers['authorization']}".encode(), {}

    with endpoint(echo) as ep:
        async with running_hub({"bot": ep.url}, tokens={"bot": "svc-t0ken-42"}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            async with dispatching(hub):
                sent = await hub.send("t", "user", "a", "x", link=False)
                st = await wait_state(hub, "t", sent.message_id, "dead")
                notices = await hub.receive("t", "user", limit=10)
    reason = st.deliveries[0].dead_reason or ""
    assert reason.startswith("HTTP 400 from service 'bot'") and "bad request: Bearer" in reason
    assert "svc-t0ken-42" not in reason
    assert notices and all("svc-t0ken-42" not in n.message.text for n in notices)


async def test_messages_behind_a_retried_one_keep_their_own_tries() -> None:
    # the head fails twice and gets through on its third try; the message behind it
    # fails once: it must be tried again, not given up because the leases taken (and
    # released untried) while the head was retried were counted as its attempts
    failing = {0, 1, 3}
    with endpoint(lambda req, n: (503 if n in failing else 200, b"", {})) as ep:
        async with running_hub({"bot": ep.url}, max_attempts=3) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            ids = [
                (await hub.send("t", "user", "a", f"m{i}", link=False)).message_id for i in range(4)
            ]
            async with dispatching(hub):
                for mid in ids:
                    await wait_state(hub, "t", mid, "acked")
    tries = [sum(s.headers["x-backchannel-message-id"] == mid for s in ep.seen) for mid in ids]
    assert tries == [3, 2, 1, 1]


class _Spy:
    """A transaction's ``Tx`` that notes the names of the methods called on it."""

    def __init__(self, tx: Any, calls: set[str]) -> None:
        self._tx, self._calls = tx, calls

    def __getattr__(self, name: str) -> Any:
        self._calls.add(name)
        return getattr(self._tx, name)


async def test_each_push_is_recorded_delivered_and_acked_in_one_transaction() -> None:
    # a team's writers take turns on the store (PostgreSQL's team lock, SQLite's one
    # writer): a second commit for each push halved a busy team's push rate
    with endpoint(answer(200, b"{}")) as ep:
        async with running_hub({"bot": ep.url}) as hub:
            await hub.add_member("t", "a", delivery=_hook("bot"))
            mids = [
                (await hub.send("t", "user", "a", f"m{i}", link=False)).message_id for i in range(5)
            ]
            transactions: list[set[str]] = []
            store = hub.store
            real = store.transact

            def transact(fn: Any) -> Any:
                def noted(tx: Any) -> Any:
                    calls: set[str] = set()
                    transactions.append(calls)
                    return fn(_Spy(tx, calls))

                return real(noted)

            store.transact = transact  # type: ignore[method-assign]
            async with dispatching(hub):
                for mid in mids:
                    await wait_state(hub, "t", mid, "acked")
    assert ep.count() == len(mids)
    records = [calls for calls in transactions if calls & {"transition", "ack"}]
    assert len(records) == len(mids), records
    assert all({"transition", "ack"} <= calls for calls in records), records
