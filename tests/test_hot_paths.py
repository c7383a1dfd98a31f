"""The hottest requests (``POST /v1/messages`` and ``/v1/messages/batch``,
``/v1/inbox/ack`` and ``/v1/inbox/ack/batch``, ``/v1/inbox/receive``, ``GET /v1/inbox``) skip the router and FastAPI's dependency layer: :class:`~backchannel.interfaces.http.HotPaths`
hands them straight to their fast endpoints. The documented FastAPI routes stay for the
OpenAPI document; here a second app keeps only those (its fast routes taken out, and
mounted under a ``root_path`` so that HotPaths lets its requests by), which lets every
request be made both ways and the answers compared: the same status, the same error,
the same fields."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from backchannel.hub import Hub
from backchannel.interfaces.http import HotPaths, create_app
from backchannel.interfaces.routes import hot_routes
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
    documented = create_app(hub, ADMIN, max_body=4096)
    fast = set(hot_routes().values())
    documented.router.routes[:] = [
        r for r in documented.router.routes if getattr(r, "endpoint", None) not in fast
    ]
    hot = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://hub")
    routed = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=documented, root_path="/under"),
        base_url="http://hub/under",
    )
    async with hot, routed:
        yield hot, routed, tokens
    await hub.close()


def _shape(r: httpx.Response, loose: bool = False) -> tuple[int, Any]:
    """The status and the answer with the values that differ per message left out
    (``loose``: of an error, only its code)."""
    body = r.json()
    if "error" in body:
        return r.status_code, body["error"]["code"] if loose else body

    def keep(k: str, v: Any) -> Any:
        if k == "messages":  # each message's fields, by the names on the wire
            return [sorted(m) for m in v]
        if k == "results":  # a batch's items: place, status, fields, error code
            return [
                (x.get("index"), x.get("status"), x.get("outcome"), sorted(x), _code(x)) for x in v
            ]
        exact = ("acked", "not_held", "status", "sent", "failed", "invalid")
        return v if k in exact else type(v).__name__

    return r.status_code, {k: keep(k, v) for k, v in body.items()}


def _code(item: dict[str, Any]) -> str | None:
    error = item.get("error")
    return error.get("code") if isinstance(error, dict) else None


BATCH = [{"to": "b", "text": "one"}, {"to": "bob", "text": "x"}, {"to": "b"}, {"to": "b"}]

REQUESTS: list[tuple[str, str | None, Any, str | None]] = [
    ("/v1/messages", "a", {"to": "b", "text": "hello"}, None),
    ("/v1/messages", "a", {"to": "bob", "text": "hello"}, None),  # 404 with suggestions
    ("/v1/messages", "a", {"to": "b"}, None),  # 422: text missing
    ("/v1/messages", "a", {"to": "b", "text": "x", "extra": 1}, None),  # 422
    # 422: a lone surrogate, not JSON (the fast paths' message names the field: see
    # tests/test_http_input.py)
    ("/v1/messages", "a", b'{"to": "b", "text": "\\ud800"}', None),
    ("/v1/messages", "a", b"[" * 64, None),
    ("/v1/messages", "a", {"to": "b", "text": "x" * 5000}, None),  # 413 over the limit
    ("/v1/messages", None, {"to": "b", "text": "hello"}, "bc_wrong"),  # 401
    ("/v1/messages", None, {"to": "b", "text": "hello"}, ADMIN),  # 403
    ("/v1/inbox/ack", "b", {"message_ids": ["sys_1"]}, None),  # not held
    ("/v1/inbox/ack", "b", {"message_ids": ["no spaces"]}, None),  # 422
    ("/v1/inbox/ack", "b", {"message_ids": []}, None),  # 422
    ("/v1/inbox/receive", "b", {"ack": ["sys_1"], "limit": 5}, None),
    ("/v1/inbox/receive", "b", {"limit": 0}, None),  # 422
    ("/v1/inbox/receive", "b", {"session": "nope"}, None),  # unknown session
    # a batch: each item answered alone (201, 404 with suggestions, 422, 422)
    ("/v1/messages/batch", "a", {"messages": BATCH}, None),
    ("/v1/messages/batch", "a", {"messages": []}, None),  # 422: empty
    ("/v1/messages/batch", "a", {"messages": {"to": "b"}}, None),  # 422: not a list
    ("/v1/messages/batch", "a", {"messages": [{"to": "b", "text": "x"}] * 1001}, None),
    ("/v1/messages/batch", "a", b'{"messages": [{"to": "b", "text": "\\ud800"}]}', None),
    ("/v1/messages/batch", None, {"messages": BATCH}, "bc_wrong"),  # 401
    ("/v1/messages/batch", None, {"messages": BATCH}, ADMIN),  # 403
    ("/v1/inbox/ack/batch", "b", {"message_ids": ["sys_1", "no spaces", 5]}, None),
    ("/v1/inbox/ack/batch", "b", {"message_ids": []}, None),  # 422
    ("/v1/inbox/ack/batch", "b", {"ids": ["sys_1"]}, None),  # 422: the field's name
    ("/v1/inbox/ack/batch", None, {"message_ids": ["sys_1"]}, ADMIN),  # 403
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
    loose = isinstance(body, bytes)
    assert _shape(a, loose) == _shape(b, loose), (a.text, b.text)


QUERIES: list[tuple[str, str | None]] = [
    ("limit=5", None),
    ("", None),
    ("wait=0&limit=1000&lease=30&pinned_only=false", None),
    ("limit=0", None),  # 422
    ("limit=1001", None),
    ("limit=x", None),
    ("wait=-1", None),
    ("wait=3601", None),
    ("wait=abc", None),
    ("wait=nan", None),
    ("wait=inf", None),
    ("lease=0", None),
    ("pinned_only=maybe", None),
    ("session=bad%20id", None),  # 422 invalid_name
    ("session=s-1", None),  # not the member's session
    ("limit=5&limit=0", None),  # the last one counts
    ("unknown=1", None),  # ignored
    ("limit=5", "bc_wrong"),  # 401
    ("limit=0", ADMIN),  # 422 before 403
    ("limit=5", ADMIN),  # 403
]


@pytest.mark.parametrize(("query", "token"), QUERIES)
async def test_the_hot_inbox_answers_as_the_router_does(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient, dict[str, str]],
    query: str,
    token: str | None,
) -> None:
    hot, routed, tokens = both
    headers = {"Authorization": f"Bearer {token or tokens['b']}"}
    answers = []
    for client in (hot, routed):  # one message waiting for each receive
        sent = await client.post(
            "/v1/messages", json={"to": "b", "text": "hi"}, headers={
                "Authorization": f"Bearer {tokens['a']}"}
        )  # fmt: skip
        assert sent.status_code == 201
        answers.append(await client.get(f"/v1/inbox?{query}", headers=headers))
        if answers[-1].status_code == 200:  # the next receive starts from nothing
            await hot.get("/v1/inbox?limit=1000", headers={
                "Authorization": f"Bearer {tokens['b']}"})  # fmt: skip
    a, b = answers
    assert _shape(a) == _shape(b), (a.text, b.text)
    if a.status_code == 200:
        assert len(a.json()["messages"]) == len(b.json()["messages"])


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


def test_fastapi_telemetry_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off, no request looks up OpenTelemetry's global providers (a cost on every
    request); ``BACKCHANNEL_OPENTELEMETRY=1`` gives FastAPI's native spans back."""
    hub = Hub(MemoryStore(), clock=FakeClock(), background=False)
    monkeypatch.delenv("BACKCHANNEL_OPENTELEMETRY", raising=False)
    off = create_app(hub, ADMIN)
    assert not any(off._telemetry[k] for k in ("tracing", "metrics", "logs"))
    monkeypatch.setenv("BACKCHANNEL_OPENTELEMETRY", "1")
    on = create_app(hub, ADMIN)
    assert all(on._telemetry[k] for k in ("tracing", "metrics", "logs"))
    assert create_app(hub, ADMIN, opentelemetry=False)._telemetry["tracing"] is False


@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages",
        "/v1/messages/batch",
        "/v1/inbox/ack",
        "/v1/inbox/ack/batch",
        "/v1/inbox/receive",
        "/v1/hooks/codex",
        "/v1/sessions",
    ],
)
async def test_a_client_that_hangs_up_mid_body_is_no_error(path: str) -> None:
    # the client is gone: nothing to answer, and nothing for the server to log as an
    # exception of the application (uvicorn logs whatever the app raises, with a traceback)
    hub = Hub(MemoryStore(), clock=FakeClock(), background=False)
    await hub.start()
    await hub.create_team("t")
    token = (await hub.add_member("t", "a"))[1]
    app = create_app(hub, ADMIN)
    messages = [
        {"type": "http.request", "body": b'{"message_ids": ["m', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"hub"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"1000"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("hub", 80),
        "state": {},
    }
    try:
        await app(scope, receive, send)
    finally:
        await hub.close()
