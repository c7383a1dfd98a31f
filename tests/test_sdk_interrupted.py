"""The SDK's receivers left early: a loop over ``inbox()`` that stops after the first
message of a batch leaves the rest of the batch to come back at once, not at the end of
their lease; a sync call stopped by a signal (Ctrl-C) leaves no call behind that goes on
leasing messages nobody reads (over HTTP, against a real ``backchannel serve``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from backchannel import connect, connect_sync
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
