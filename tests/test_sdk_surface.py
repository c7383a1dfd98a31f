"""The SDK's two clients offer the same calls, every operation of the API v1 has one,
and nothing outside the client package reaches into a client."""

from __future__ import annotations

import inspect
import re

from backchannel import Client, SyncClient
from backchannel.hub import Hub
from backchannel.interfaces.http import create_app
from backchannel.stores.memory import MemoryStore
from tests.conftest import ROOT

#: Each operation of the API v1 (but the dashboard's, whose page is its one client) and
#: the client call that performs it.
OPERATIONS = {
    "GET /v1/me": "me",
    "POST /v1/teams": "create_team",
    "GET /v1/teams": "teams",
    "POST /v1/teams/{team}/members": "add_member",
    "GET /v1/teams/{team}/members": "members",
    "PATCH /v1/teams/{team}/members/{name}": "update_member",
    "DELETE /v1/teams/{team}/members/{name}": "remove_member",
    "POST /v1/teams/{team}/members/{name}/token": "rotate_token",
    "DELETE /v1/teams/{team}": "remove_team",
    "GET /v1/teams/{team}/budgets": "budgets",
    "POST /v1/teams/{team}/budgets/extend": "extend_budget",
    "GET /v1/teams/{team}/events": "team_events",
    "POST /v1/messages": "send",
    "POST /v1/messages/batch": "send_batch",
    "GET /v1/messages/{message_id}": "status",
    "POST /v1/messages/{message_id}/reactions": "react",
    "GET /v1/inbox": "receive",
    "POST /v1/inbox/receive": "ack_and_receive",
    "GET /v1/inbox/pending": "pending",
    "POST /v1/inbox/ack": "ack",
    "POST /v1/inbox/ack/batch": "ack_batch",
    "POST /v1/inbox/release": "release",
    "POST /v1/inbox/give-up": "give_up",
    "GET /v1/inbox/stream": "inbox",
    "GET /v1/links": "links",
    "GET /v1/links/{link_id}": "link",
    "POST /v1/delegations": "delegate",
    "GET /v1/delegations": "delegations",
    "GET /v1/delegations/{delegation_id}": "delegation",
    "POST /v1/chat": "chat",
    "POST /v1/tools/response": "tool_response",
    "POST /v1/timers": "set_timer",
    "GET /v1/timers": "timers",
    "GET /v1/timers/{timer_id}": "timer",
    "DELETE /v1/timers/{timer_id}": "cancel_timer",
    "POST /v1/sessions": "open_session",
    "GET /v1/sessions": "list_sessions",
    "GET /v1/sessions/{session_id}": "session",
    "POST /v1/sessions/alive": "runtime_alive",
    "POST /v1/sessions/{session_id}/events": "report_event",
    "POST /v1/sessions/{session_id}/terminate": "terminate_session",
    "GET /v1/sessions/{session_id}/transcript": "session_data",
    "POST /v1/hooks/{runtime}": "hook",
}


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(getattr(cls, name))
        for name in dir(cls)
        if not name.startswith("_") and callable(getattr(cls, name))
    }


def test_sync_and_async_clients_have_the_same_calls() -> None:
    sync, aio = _public(SyncClient), _public(Client)
    assert sorted(sync) == sorted(aio)
    for name, signature in aio.items():
        ours = [(p.name, p.kind, p.default) for p in signature.parameters.values()]
        theirs = [(p.name, p.kind, p.default) for p in sync[name].parameters.values()]
        assert ours == theirs, name


def test_every_v1_operation_has_a_client_call() -> None:
    doc = create_app(Hub(MemoryStore()), "admin-token").openapi()
    ops = {
        f"{method.upper()} {path}"
        for path, methods in doc["paths"].items()
        if path.startswith("/v1/") and not path.startswith("/v1/dashboard/")
        for method in methods
    }
    assert ops == set(OPERATIONS)
    for call in OPERATIONS.values():
        assert callable(getattr(Client, call, None)), call


def test_nothing_outside_the_client_reaches_into_a_client() -> None:
    src = ROOT / "src" / "backchannel"
    client_dir = src / "client"
    reaching = re.compile(r"\b_call\(|\bHttpClient\b|\bLocalClient\b|\bclient\.hub\b|\bc\.hub\b")
    offenders = [
        f"{path.relative_to(src)}:{n}: {line.strip()}"
        for path in sorted(src.rglob("*.py"))
        if client_dir not in path.parents
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reaching.search(line) or re.search(r"isinstance\([^)]*, *(Client|SyncClient)\b", line)
    ]
    assert offenders == [], "\n".join(offenders)
