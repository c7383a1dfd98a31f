"""The SDK's receivers left early: a loop over ``inbox()`` that stops after the first
message of a batch leaves the rest of the batch to come back at once, not at the end of
their lease; a sync call stopped by a signal (Ctrl-C) leaves no call behind that goes on
leasing messages nobody reads (over HTTP, against a real ``backchannel serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from backchannel import Client, SyncClient, connect, connect_sync
from backchannel.client._transport import HttpTransport
from tests.conftest import Server


class Relay:
    """A TCP relay to the hub that passes a close on: :attr:`requested` is set once a
    client sent a long-poll (``GET /v1/inbox``), :attr:`hung_up` once a client closed
    its connection."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.requested = threading.Event()
        self.hung_up = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                hub = socket.create_connection(self.upstream)
                threading.Thread(target=self._pump, args=(client, hub, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(hub, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if from_client and data.startswith(b"GET /v1/inbox"):
                    self.requested.set()
                dst.sendall(data)
        if from_client:
            self.hung_up.set()
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def _send(srv: Server, token: str, *texts: str) -> list[str]:
    ids = []
    with srv.client(token) as c:
        for text in texts:
            r = c.post("/v1/messages", json={"to": "worker", "text": text})
            assert r.status_code == 201, r.text
            ids.append(r.json()["message_id"])
    return ids


async def test_breaking_out_of_inbox_gives_the_rest_of_its_batch_back(server: Server) -> None:
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    async with connect(server.url, tokens["worker"]) as c:
        async with contextlib.aclosing(c.inbox(wait=5, batch=10)) as stream:
            async for first in stream:
                await first.ack()
                break
        assert first.message_id == sent[0]
        back = await c.receive(limit=10, wait=0)  # no wait: a leased one would be missing
        assert [m.message_id for m in back] == sent[1:]


def test_breaking_out_of_the_sync_inbox_gives_the_rest_of_its_batch_back(
    server: Server,
) -> None:
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    with connect_sync(server.url, tokens["worker"]) as c:
        for first in c.inbox(wait=5, batch=10):
            first.ack()
            break
        assert first.message_id == sent[0]
        back = c.receive(limit=10, wait=0)
        assert [m.message_id for m in back] == sent[1:]


@pytest.mark.parametrize("to", ["the process", "another thread"])
@pytest.mark.parametrize("how", ["receive", "inbox"])
def test_ctrl_c_in_a_sync_receive_ends_its_long_poll(server: Server, how: str, to: str) -> None:
    """Ctrl-C while a sync ``receive`` (or a loop over ``inbox()``) waits: the
    KeyboardInterrupt reached the caller while the long-poll went on in the client's
    thread, which would lease the next message to nobody (until its lease ended); the
    loop's caller got a RuntimeError instead (its iterator was closed while it still
    ran). The poll is now called off and over before the KeyboardInterrupt is raised:
    its connection closes, which the hub takes as the receiver gone.

    The kernel hands a process's SIGINT to any of its threads: taken by another thread
    than the caller's, it did not wake the caller, blocked on the call's result until
    the long-poll's whole wait was over (Ctrl-C did nothing for up to a minute)."""
    tokens = server.team("alpha", "lead", "worker")
    relay = Relay(server.url)
    sent: list[float] = []
    try:
        with connect_sync(relay.url, tokens["worker"]) as c:

            def interrupt() -> None:
                if relay.requested.wait(30):  # the long-poll is on its way to the hub
                    sent.append(time.monotonic())
                    if to == "the process":
                        os.kill(os.getpid(), signal.SIGINT)
                    else:  # taken by this thread, as the kernel may choose
                        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

            threading.Thread(target=interrupt, daemon=True).start()

            def wait() -> object:
                return c.receive(wait=60) if how == "receive" else list(c.inbox(wait=60))

            with pytest.raises(KeyboardInterrupt):
                wait()
            late = time.monotonic() - sent[0]
            assert late < 20, f"Ctrl-C reached the caller {late:.1f} s late, after the poll"
            assert relay.hung_up.wait(30), "the interrupted long-poll is still open"
    finally:
        relay.close()


class HeldAnswers(httpx.AsyncBaseTransport):
    """A transport to the hub that holds the body of each receive's answer (``GET
    /v1/inbox``, ``POST /v1/inbox/receive``) once its head came: :attr:`answered` is
    set then (the hub leased the messages and wrote them), and the body flows once
    :attr:`let_go` is set, as a body still on its way does."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.answered = threading.Event()
        self.let_go = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        if request.url.path not in ("/v1/inbox", "/v1/inbox/receive"):
            return resp
        return httpx.Response(
            resp.status_code, headers=resp.headers, stream=_Held(self, resp.stream)
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Held(httpx.AsyncByteStream):
    def __init__(self, held: HeldAnswers, body: Any) -> None:
        self.held, self.body = held, body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.held.answered.set()
        deadline = time.monotonic() + 30
        while not self.held.let_go.is_set():
            assert time.monotonic() < deadline, "the held answer was never let go"
            await asyncio.sleep(0.005)
        async for chunk in self.body:
            yield chunk

    async def aclose(self) -> None:
        await self.body.aclose()


async def _until(what: threading.Event) -> None:
    deadline = time.monotonic() + 30
    while not what.is_set():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("how", ["receive", "ack_and_receive"])
async def test_a_receive_cancelled_once_the_hub_answered_gives_its_messages_back(
    server: Server, how: str
) -> None:
    """A task cancel that landed after the hub's answer to a receive began to arrive,
    before the caller had its messages: they stayed leased to nobody until the lease
    ended (60 s late, a delivery attempt spent). They are now given back at once."""
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two")
    held = HeldAnswers()
    async with (
        Client.over(HttpTransport(server.url, tokens["worker"], transport=held)) as c,
        connect(server.url, tokens["worker"]) as other,
    ):
        call = c.receive(wait=5) if how == "receive" else c.ack_and_receive([], wait=5)
        task = asyncio.ensure_future(call)
        await _until(held.answered)  # leased, written, on its way
        task.cancel()
        held.let_go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        back = await other.receive(limit=10, wait=0)  # no wait: a leased one would be missing
        assert [m.message_id for m in back] == sent


@pytest.mark.parametrize("how", ["receive", "inbox"])
def test_ctrl_c_once_the_hub_answered_a_sync_receive_gives_its_messages_back(
    server: Server, how: str
) -> None:
    """Ctrl-C in a sync ``receive`` (or a loop over ``inbox()``) once the hub's answer
    began to arrive: the call was called off with the answer unread, and its messages
    stayed leased to nobody until the lease ended. They are now given back at once."""
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two")
    held = HeldAnswers()

    def on_sigint(signum: int, frame: object) -> None:
        held.let_go.set()  # the body comes on as the signal is taken
        raise KeyboardInterrupt

    def interrupt() -> None:
        if held.answered.wait(30):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with (
            SyncClient.over(HttpTransport(server.url, tokens["worker"], transport=held)) as c,
            connect_sync(server.url, tokens["worker"]) as other,
        ):
            threading.Thread(target=interrupt, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                c.receive(wait=5) if how == "receive" else list(c.inbox(wait=5))
            back = other.receive(limit=10, wait=0)
            assert [m.message_id for m in back] == sent
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_event_stream_cut_mid_batch_gives_back_what_it_never_sent(server: Server) -> None:
    """A reader of ``GET /v1/inbox/stream`` that goes away in the middle of a batch (a
    crash, a proxy cutting a stalled connection): the stream had leased the whole batch
    (up to 32) at once, and those it had not written yet stayed leased to nobody until
    their lease ended. They are now given back at once; those written may have been
    read and stay leased (acked by the reader, or back at the lease's end). Never written,
    their lease is no attempt: they come back as attempt 1."""
    tokens = server.team("alpha", "lead", "worker")
    big = "x" * 200_000  # more than the connection's buffers hold, all together
    sent = _send(server, tokens["lead"], *(f"{i} {big}" for i in range(24)))
    host, port = urlsplit(server.url).hostname or "", urlsplit(server.url).port or 80
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that stalls
    reader.connect((host, port))
    reader.sendall(
        f"GET /v1/inbox/stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {tokens['worker']}\r\n\r\n".encode()
    )
    head = b""
    while b"event: message" not in head:  # the first message is on its way
        chunk = reader.recv(4096)
        assert chunk, "the stream ended before its first message"
        head += chunk
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reader.close()  # reset: what the hub had not written is never read
    with connect_sync(server.url, tokens["worker"]) as c:
        back: list[str] = []
        tries: set[int] = set()
        deadline = time.monotonic() + 20
        while len(back) < len(sent) // 2 and time.monotonic() < deadline:
            got = c.receive(limit=32, wait=1)
            back += [m.message_id for m in got]
            tries |= {m.attempt for m in got}
    assert len(back) >= len(sent) // 2, f"only {len(back)} of {len(sent)} came back at once"
    assert set(back) <= set(sent[1:]), "the message the reader was reading is not handed out"
    assert tries == {1}, "a copy the stream never wrote had an attempt spent"


def test_an_event_stream_whose_reader_hung_up_at_once_gives_its_first_batch_back(
    server: Server,
) -> None:
    """A reader of ``GET /v1/inbox/stream`` that hangs up right after asking (it
    crashed, it was killed): the stream leased a batch for it and wrote the first
    message into the connection already gone, where it stayed leased to nobody until
    its lease ended. Nothing is written to a connection that is gone: the whole batch
    comes back at once."""
    tokens = server.team("alpha", "lead", "worker")
    sent = _send(server, tokens["lead"], "one", "two", "three")
    host, port = urlsplit(server.url).hostname or "", urlsplit(server.url).port or 80
    reader = socket.create_connection((host, port))
    reader.sendall(
        f"GET /v1/inbox/stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {tokens['worker']}\r\n\r\n".encode()
    )
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reader.close()
    with connect_sync(server.url, tokens["worker"]) as c:
        back: list[str] = []
        deadline = time.monotonic() + 20
        while len(back) < len(sent) and time.monotonic() < deadline:
            back += [m.message_id for m in c.receive(limit=10, wait=1)]
    assert back == sent, f"{len(sent) - len(back)} stayed leased to nobody"


class SlowToHangUp(httpx.AsyncHTTPTransport):
    """A client's transport whose long-poll, once called off, takes a while to end (a
    loaded machine, a connection slow to close): :attr:`polling` is set once it is sent."""

    def __init__(self, ends_after: float) -> None:
        super().__init__()
        self.ends_after = ends_after
        self.polling = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET" or request.url.path != "/v1/inbox":
            return await super().handle_async_request(request)
        self.polling.set()
        try:
            return await super().handle_async_request(request)
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(self.ends_after))
            raise


def test_ctrl_c_in_an_inbox_loop_whose_poll_ends_slowly_is_a_keyboard_interrupt(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in a loop over the sync ``inbox()`` whose long-poll took longer to end than
    the caller waited for it: the loop's close found the generator still running and
    raised ``RuntimeError: aclose(): asynchronous generator is already running`` in
    place of the ``KeyboardInterrupt`` (seen under a loaded machine). The close waits
    for the step to end."""
    from backchannel.client import _sync

    monkeypatch.setattr(_sync, "CALL_OFF_WITHIN", 0.05)  # the caller gives up waiting first
    tokens = server.team("alpha", "lead", "worker")
    slow = SlowToHangUp(ends_after=1.0)

    def interrupt() -> None:
        if slow.polling.wait(30):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    with SyncClient.over(HttpTransport(server.url, tokens["worker"], transport=slow)) as c:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            for _ in c.inbox(wait=30):
                pass
