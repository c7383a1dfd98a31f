"""The API v1, one router per resource; :func:`include_routes` adds them all."""

from __future__ import annotations

from fastapi import FastAPI
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


def include_routes(app: FastAPI) -> None:
    for module in ROUTERS:
        app.include_router(module.router)
    # the fast paths answer first (see routes.messages); the routes above document them
    app.router.routes.insert(0, Route("/v1/messages", messages.fast_send, methods=["POST"]))
    app.router.routes.insert(0, Route("/v1/inbox/ack", inbox.fast_ack, methods=["POST"]))
    app.router.routes.insert(0, Route("/v1/inbox/receive", inbox.fast_receive, methods=["POST"]))
