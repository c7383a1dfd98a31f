"""Delegation between hubs: ``/v1/chat`` (another hub asks one of this team's agents
for a task) and ``/v1/tools/response`` (a callee hub answers). Both are served under
``/api`` as well, where other hubs of the same protocol call them."""

from __future__ import annotations

from fastapi import APIRouter, Request

from backchannel.interfaces.routes.deps import AsMember, bearer_token, hub_of
from backchannel.interfaces.wire import StrictRoute
from backchannel.member import answer_delegation
from backchannel.models import ChatAccepted, ChatIn, ToolResponseAccepted, ToolResponseIn

router = APIRouter(route_class=StrictRoute, tags=["delegation"])


async def chat(body: ChatIn, api: AsMember) -> ChatAccepted:
    """Another hub asks one of this team's agents to do a task; the answer goes to
    the caller's registered callback service with its bearer token."""
    return await api.chat(
        body.agent,
        body.message,
        reply_service=body.reply.callbackService,
        reply_token=body.reply.bearerToken,
        session_id=body.session_id,
        tool_use_id=body.tool_use_id,
        timeout_s=body.timeout_s,
        chain=body.chain.model_dump() if body.chain else None,
    )


async def tool_response(body: ToolResponseIn, request: Request) -> ToolResponseAccepted:
    """A callee hub answers a delegation; ``Authorization: Bearer`` carries the
    one-time reply token this hub issued."""
    token = bearer_token(
        request.headers.getlist("authorization"),
        request.query_params.keys(),
        how="send the reply token as 'Authorization: Bearer <token>'",
    )
    chain = body.chain.model_dump() if body.chain else None
    return await answer_delegation(hub_of(request), token, body.result, chain)


for prefix in ("/api", "/v1"):
    router.add_api_route(f"{prefix}/chat", chat, methods=["POST"], status_code=202)
    router.add_api_route(f"{prefix}/tools/response", tool_response, methods=["POST"])
