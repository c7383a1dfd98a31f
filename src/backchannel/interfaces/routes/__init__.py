"""The API v1, one router per resource; :func:`include_routes` adds them all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from starlette.routing import Route

from backchannel.interfaces.routes import (
    delegations,
    federation,
    inbox,
    links,
    messages,
    meta,
    sessions,
    teams,
    timers,
)

ROUTERS = (meta, teams, messages, inbox, links, delegations, federation, timers, sessions)


def hot_routes() -> dict[tuple[str, str], Callable[[Request], Awaitable[Response]]]:
    """The fast endpoints by method and path (see routes.messages)."""
    return {
        ("POST", "/v1/messages"): messages.fast_send,
        ("POST", "/v1/messages/batch"): messages.fast_send_batch,
        ("POST", "/v1/inbox/ack"): inbox.fast_ack,
        ("POST", "/v1/inbox/ack/batch"): inbox.fast_ack_batch,
        ("POST", "/v1/inbox/receive"): inbox.fast_receive,
        ("GET", "/v1/inbox"): inbox.fast_inbox,
    }


def include_routes(app: FastAPI) -> None:
    for module in ROUTERS:
        app.include_router(module.router)
    # the fast paths answer first (see routes.messages); the routes above document them
    for (method, path), endpoint in hot_routes().items():
        app.router.routes.insert(0, Route(path, endpoint, methods=[method]))
