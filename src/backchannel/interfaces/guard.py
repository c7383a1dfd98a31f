"""Connection limits that uvicorn lacks, as its own HTTP protocol class.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but never a
connection that is sending a request slowly, and its ``limit_concurrency`` counts a
connection only once its request head is in, answering 503 without ``Retry-After``.
So a few hundred half-sent requests could hold every file descriptor the process may
open, and ``/healthz`` stopped answering. This protocol adds:

- a deadline for a request's head (``header_timeout``, from the connection or from the
  request's first byte) and for its body (``body_timeout``, from the end of the head);
  a request that misses one is answered ``408`` and its connection closed;
- a cap on open connections (``max_connections``): a connection over it is answered
  ``503`` with ``Retry-After`` (both with the API's error model) and closed, and it
  gets at most :data:`BUSY_GRACE` seconds to send its request head;
- a way for a response to cut its connection (the scope's ``extensions`` name
  :data:`ABORT`, a function): uvicorn's close waits until the peer has taken what is
  buffered for it, so a connection to a peer that reads nothing stayed open for as long
  as the peer kept it.
"""

from __future__ import annotations

import asyncio
import json
import resource
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ABORT", "ConnectionLimits", "guarded_protocol"]

#: The scope extension a response calls to cut its connection at once (what is buffered
#: for the peer is dropped).
ABORT = "backchannel.abort"

#: Seconds a connection over the cap may take to send the request head it is refused.
BUSY_GRACE = 1.0
#: File descriptors kept out of the connection cap for the store, logs and the refusals.
_FD_RESERVE = 64
#: Seconds past its time a connection's timer may fire before it is taken for one the
#: process slept through (stopped with SIGSTOP or Ctrl-Z, then continued): the peer
#: may have sent its request in time, and it waits unread in the socket.
SLEPT_THROUGH = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1000
    retry_after: int = 1

    def within_open_files(self) -> ConnectionLimits:
        """These limits with the cap lowered to half the file descriptors this process
        may open (after raising its soft limit to the hard one), so that connections
        over the cap can still be accepted and answered 503."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            except (ValueError, OSError):
                pass
        if soft == resource.RLIM_INFINITY:
            return self
        room = max(1, (soft - _FD_RESERVE) // 2)
        if self.max_connections <= room:
            return self
        return ConnectionLimits(self.header_timeout, self.body_timeout, room, self.retry_after)


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class to pass to ``uvicorn.Config(http=...)``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})


def _timed_out(message: str) -> bytes:
    body = json.dumps({"error": {"code": "request_timeout", "message": message}}).encode()
    return (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines and a connection cap."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: Literal["head", "body"] = "head"

    # -- the deadline ------------------------------------------------------------------
    def _arm(self, seconds: float, phase: Literal["head", "body"]) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _slept_through(self, timer: asyncio.TimerHandle | None) -> bool:
        """Whether ``timer`` fired later than :data:`SLEPT_THROUGH` past its time: the
        hub's process did not run (stopped and continued), and the event loop runs due
        timers before it reads the sockets (uvloop). Closing now would answer a request
        sent while the process was stopped with a reset, or a ``408``, unread."""
        return timer is not None and self.loop.time() - timer.when() > SLEPT_THROUGH

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn closes a kept-alive connection idle for ``timeout_keep_alive``; one
        whose timer the process slept through is given that time again from now, so a
        request that came meanwhile is read first (and cancels it)."""
        if self._slept_through(self.timeout_keep_alive_task):
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
            return
        super().timeout_keep_alive_handler()

    def _expired(self) -> None:
        if self._slept_through(self._deadline):  # the peer gets its time again, from now
            limit = (
                self.limits.header_timeout if self._phase == "head" else self.limits.body_timeout
            )
            self._arm(limit, self._phase)
            return
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._phase == "head" and cycle is not None and not cycle.response_complete:
            # a pipelined request is dawdling behind one being answered: finish that
            # one, then close instead of waiting for the rest
            cycle.keep_alive = False
            return
        if self._phase == "body" and (self.pipeline or (cycle and cycle.response_started)):
            self.transport.close()
            return
        if cycle is not None and not cycle.response_complete:
            # the app is waiting for the body: it reads a disconnect and answers nobody
            cycle.disconnected = True
            cycle.message_event.set()
        limit = self.limits.header_timeout if self._phase == "head" else self.limits.body_timeout
        what = "head (request line and headers)" if self._phase == "head" else "body"
        message = (
            f"the request's {what} did not arrive within {limit:g} s; "
            "send the whole request at once"
        )
        self.transport.write(_timed_out(message))
        self.transport.close()

    # -- connection and parser events ----------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = self._busy
            self._arm(min(self.limits.header_timeout, BUSY_GRACE), "head")
        else:
            self._arm(self.limits.header_timeout, "head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a later request on a kept-alive connection
            self._arm(self.limits.header_timeout, "head")

    def on_headers_complete(self) -> None:
        # a response that must end its connection at once (a stream whose reader took
        # nothing for its write bound) finds how in its scope
        scope = cast("dict[str, Any]", self.scope)
        scope.setdefault("extensions", {})[ABORT] = self.transport.abort
        super().on_headers_complete()
        self._arm(self.limits.body_timeout, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    async def _busy(self, scope: Any, receive: Any, send: Any) -> None:
        limits = self.limits
        body = json.dumps(
            {
                "error": {
                    "code": "busy",
                    "message": (
                        f"the hub has {limits.max_connections} connections open, its limit; "
                        f"retry in {limits.retry_after} s"
                    ),
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(limits.retry_after).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
