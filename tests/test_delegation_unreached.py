"""A task for another hub that never reached it is told apart from one its hub refused.

A connection refused, a name that does not resolve, a TLS failure or no answer within
the retry policy's timeout mean the callee's hub never saw the task: the caller hears
that the hub could not be reached, with the cause and the way out. A hub that answered
with a refusal (an HTTP error, an A2A agent's rejection) is quoted as refusing it."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backchannel.callbacks import CallbackConfig, Service
from backchannel.core import delegation as rules
from backchannel.hub import Hub
from backchannel.testing import MemoryStore, eventually
from backchannel.types import Delegation, DelegationState, MessageKind
from tests.test_delegation import SECRET, Scripted, scripted  # noqa: F401

#: Gives up within a second: a connection refused is retried, then dead.
QUICK = rules.RetryPolicy(start=0.05, factor=2, cap=0.1, budget=0.4, timeout=0.5)


@pytest.fixture
def refusing_port() -> int:
    """A local port nothing listens on: a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


async def _failed_delegation(service: Service, to: str) -> tuple[Delegation, dict[str, Any]]:
    """Delegate ``to`` through ``service`` and wait for the delegation to fail: the
    delegation as read back and the caller's tool result for it."""
    cfg = CallbackConfig(secret=SECRET, services={service.name: service}, retry=QUICK)
    async with Hub(MemoryStore(), callbacks=cfg) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "lead")
        await hub.open_session("t", "lead", "lead-s")
        await hub.report_event("t", "lead", "lead-s", "turn_start")
        d = await hub.delegate("t", "lead", "lead-s", to, "count", tool_use_id="tu_u")
        await hub.report_event("t", "lead", "lead-s", "agent_stop", "")

        async def result() -> dict[str, Any] | None:
            got = await hub.receive("t", "lead", session="lead-s", limit=10)
            for g in got:
                if g.message.kind is MessageKind.TOOL_RESULT:
                    [r] = g.message.meta["results"]
                    return {**r, "text": g.message.text}
            return None

        r = await eventually(result, what="the caller's tool result", within=20)
        return await hub.get_delegation("t", d.delegation_id), r


async def test_a_refused_connection_is_told_as_an_unreachable_hub(refusing_port: int) -> None:
    url = f"http://127.0.0.1:{refusing_port}"
    d, r = await _failed_delegation(Service("hub-b", url), "worker@hub-b")
    assert d.state is DelegationState.FAILED
    assert d.error is not None
    assert "refused the task" not in d.error, d.error
    assert d.error.startswith("the callee's hub could not be reached"), d.error
    assert "ConnectError" in d.error, d.error  # the cause
    assert "'hub-b'" in d.error and "callback registry" in d.error, d.error  # the way out
    assert r["reason"] == "unreachable", r
    assert "ERROR (unreachable): the callee's hub could not be reached" in r["text"], r


async def test_no_answer_within_the_timeout_is_told_as_an_unreachable_hub(
    silent_port: int,
) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    d, r = await _failed_delegation(Service("hub-b", url), "worker@hub-b")
    assert d.error is not None
    assert d.error.startswith("the callee's hub could not be reached"), d.error
    assert "no complete answer within 0.5 s" in d.error, d.error
    assert r["reason"] == "unreachable", r


async def test_an_a2a_agent_whose_address_refuses_connections_is_unreachable(
    refusing_port: int,
) -> None:
    pytest.importorskip("a2a.client")
    url = f"http://127.0.0.1:{refusing_port}/a2a/{{agent}}"
    d, r = await _failed_delegation(Service("agents", url, kind="a2a"), "helper@agents")
    assert d.error is not None
    assert d.error.startswith("the callee's hub could not be reached"), d.error
    assert "'agents'" in d.error, d.error
    assert r["reason"] == "unreachable", r


async def test_a_hub_that_answers_with_an_error_is_quoted_as_refusing(
    scripted: Callable[..., Scripted],  # noqa: F811
) -> None:
    srv = scripted(lambda path, body, n: (403, 0))
    srv.body = json.dumps({"error": {"code": "forbidden", "message": "not this team"}}).encode()
    d, r = await _failed_delegation(Service("hub-b", srv.url), "worker@hub-b")
    assert d.error is not None
    assert d.error.startswith("the callee's hub refused the task: HTTP 403"), d.error
    assert "not this team" in d.error, d.error  # its answer, quoted
    assert "could not be reached" not in d.error, d.error
    assert r["reason"] == "failed", r


async def test_a_hub_that_keeps_failing_is_not_quoted_as_refusing(
    scripted: Callable[..., Scripted],  # noqa: F811
) -> None:
    """Every try answered 503 until the retry budget ran out: the callee's hub failed
    (and may take the task later), it did not refuse it."""
    srv = scripted(lambda path, body, n: (503, 0))
    srv.body = json.dumps({"error": {"code": "unavailable", "message": "store down"}}).encode()
    d, r = await _failed_delegation(Service("hub-b", srv.url), "worker@hub-b")
    assert d.error is not None
    assert d.error.startswith("the other side kept failing: gave up after"), d.error
    assert "HTTP 503" in d.error and "store down" in d.error, d.error  # its last answer
    assert "refused" not in d.error, d.error
    assert r["reason"] == "failed", r
