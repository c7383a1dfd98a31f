"""The hottest requests (``POST /v1/messages``, ``/v1/inbox/ack``, ``/v1/inbox/receive``)
skip the router: :class:`~backchannel.interfaces.http.HotPaths` hands them straight to
their fast endpoints. The router keeps the same endpoints for any other spelling of the
path (an app mounted under a ``root_path``), which lets every request here be made both
ways and the answers compared: the same status, the same error, the same fields."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.interfaces.http import HotPaths, create_app
from backchannel.stores.memory import MemoryStore
from backchannel.testing import FakeClock

ADMIN = "admin-token"


@pytest.fixture
async def both() -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, dict[str, str]]]:
    hub = Hub(MemoryStore(), clock=FakeClock(), background=False)
    await hub.start()
    await hub.create_team("t")
    tokens = {name: (await hub.add_member("t", name))[1] for name in ("a", "b")}
    app = create_app(hub, ADMIN, max_body=4096)
    hot = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://hub")
    routed = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, root_path="/under"),
        base_url="http://hub/under",
    )
    async with hot, routed:
        yield hot, routed, tokens
    await hub.close()


def _shape(r: httpx.Response) -> tuple[int, Any]:
    """The status and the answer with the values that differ per message left out."""
    body = r.json()
    if "error" in body:
        return r.status_code, body
    return r.status_code, {k: (v if k in ("acked", "not_held", "status") else type(v).__name__)
                           for k, v in body.items()}  # fmt: skip


REQUESTS: list[tuple[str, str, Any, str | None]] = [
    ("/v1/messages", "a", {"to": "b", "text": "hello"}, None),
    ("/v1/messages", "a", {"to": "bob", "text": "hello"}, None),  # 404 with suggestions
    ("/v1/messages", "a", {"to": "b"}, None),  # 422: text missing
    ("/v1/messages", "a", {"to": "b", "text": "x", "extra": 1}, None),  # 422
    ("/v1/messages", "a", b'{"to": "b", "text": "\\ud800"}', None),  # 422: lone surrogate
    ("/v1/messages", "a", b"[" * 64, None),  # 422: not JSON
    ("/v1/messages", "a", {"to": "b", "text": "x" * 5000}, None),  # 413 over the limit
    ("/v1/messages", None, {"to": "b", "text": "hello"}, "bc_wrong"),  # 401
    ("/v1/messages", None, {"to": "b", "text": "hello"}, ADMIN),  # 403
    ("/v1/inbox/ack", "b", {"message_ids": ["sys_1"]}, None),  # not held
    ("/v1/inbox/ack", "b", {"message_ids": ["no spaces"]}, None),  # 422
    ("/v1/inbox/ack", "b", {"message_ids": []}, None),  # 422
    ("/v1/inbox/receive", "b", {"ack": ["sys_1"], "limit": 5}, None),
    ("/v1/inbox/receive", "b", {"limit": 0}, None),  # 422
    ("/v1/inbox/receive", "b", {"session": "nope"}, None),  # unknown session
]


@pytest.mark.parametrize(("path", "member", "body", "token"), REQUESTS)
async def test_the_hot_path_answers_as_the_router_does(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, dict[str, str]],
    path: str,
    member: str | None,
    body: Any,
    token: str | None,
) -> None:
    hot, routed, tokens = both
    headers = {
        "Authorization": f"Bearer {token or tokens[member or 'a']}",
        "Content-Type": "application/json",
    }
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    a = await hot.post(path, content=raw, headers=headers)
    b = await routed.post(path, content=raw, headers=headers)
    assert _shape(a) == _shape(b), (a.text, b.text)


async def test_the_hot_paths_are_in_the_app_and_take_only_their_routes(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, dict[str, str]],
) -> None:
    hot, _, tokens = both
    app = hot._transport.app  # type: ignore[attr-defined]
    assert any(m.cls is HotPaths for m in app.user_middleware)
    # another method on a hot path is the router's: 405 naming what the path takes
    r = await hot.get("/v1/messages", headers={"Authorization": f"Bearer {tokens['a']}"})
    assert r.status_code == 405
    assert "POST" in r.headers["allow"]
