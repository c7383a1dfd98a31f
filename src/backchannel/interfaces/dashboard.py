"""The live web dashboard, served at ``/`` by ``backchannel serve``.

The page (``static/index.html``, ``style.css``, the entry module ``app.js`` and the
modules it imports from ``static/js/``) ships inside the package and needs no build step
and no network. Assets are served from a list made when the dashboard is mounted (every
``.js`` and ``.css`` file under ``static/``), never by opening a path a request names;
each with its type, ``nosniff`` and ``no-cache`` (the browser asks again, with the
ETag, so a page never mixes modules of two versions). It signs in with a member or
admin token kept in the tab's ``sessionStorage`` and calls the read endpoints below with
``Authorization: Bearer``. Every endpoint is team-scoped and open to the admin and to
the members of that team; another team answers 404, like the rest of the API. A member
(but the team's human) is shown what the API shows it: the delegations it made or was
asked and the messages it sent or got (:func:`narrowed_to`).

``EventSource`` cannot send an ``Authorization`` header, and a long-lived token must
never sit in a URL (it ends up in logs, history and ``Referer``). So the page first
trades its bearer token for a *ticket* (``POST /v1/dashboard/tickets``): a signed
statement "this principal may watch this team until T", valid for
:data:`TICKET_SECONDS`, which the stream endpoint takes as a query parameter. A ticket
is checked when a stream opens; it carries a prefix of the member's token hash, so a
member whose token changed cannot use an old one. An open stream checks again before
everything it sends, and every second while it has nothing to send: a member whose
token is rotated, or who is removed, meanwhile gets an ``error`` event and the stream
ends, as ``/v1/teams/{team}/events`` does. The signing key is derived from the admin
token, so every hub process sharing a data directory accepts tickets issued by the
others.

Links, timers, delegations and session transcripts come from the hub's own records
(``list_links``, ``list_timers``, ``list_delegations``, ``get_session_data``), in the
same JSON as the rest of the API. The snapshot keeps every open link, pending timer and
pending delegation, plus the latest :data:`FINISHED_SHOWN` closed links and finished
delegations (a tally counts them all), so a long-lived team does not grow it forever;
each panel (budgets too) carries its first :data:`SNAPSHOT_PAGE` records, and the
latest dead letters come from the store (``dead_letters``) with a count of the rest.

Opening the page costs what it shows: the stream replays the team's traffic after the
cursor the page gives (``after``), or, when it asks for its ``last`` N events (the
timeline's bound), after the cursor where those begin if that is later
(``feed_start``, from an index: it does not read the team's history), and says first
where its replay starts (``replay``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from backchannel.errors import (
    BackchannelError,
    Forbidden,
    InvalidRequest,
    Unauthorized,
    UnknownMember,
    UnknownTeam,
    token_revoked,
)
from backchannel.hub import FeedItem, Hub
from backchannel.interfaces.http import Auth, EventStream, Principal
from backchannel.interfaces.routes.stream import check_cursor, resume_after, skipped
from backchannel.interfaces.wire import (
    MAX_INT,
    SENT,
    SSE_EVENT,
    TO_PATTERN,
    MessageId,
    SessionId,
    StrictRoute,
    TeamName,
)
from backchannel.models import (
    Budget,
    BudgetPage,
    DashboardMembers,
    DelegationPage,
    ExtendIn,
    LinkPage,
    MessageView,
    SessionView,
    Snapshot,
    Ticket,
    TimerPage,
)
from backchannel.types import (
    MESSAGE_ID_PATTERN,
    NAME_PATTERN,
    USER,
    DelegationState,
    Member,
    Session,
    SessionState,
)

log = logging.getLogger("backchannel.dashboard")

__all__ = ["ASSET_TYPES", "STATIC_DIR", "TICKET_SECONDS", "mount_dashboard", "static_assets"]

#: Where the page's assets live inside the installed package.
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: How long a stream ticket may be used to open a stream.
TICKET_SECONDS = 60.0
#: How often an open stream looks for changed members, links, timers and delegations.
SNAPSHOT_SECONDS = 1.0
#: How soon after traffic it looks again (most changes come with a message).
SNAPSHOT_AFTER_TRAFFIC = 0.2
KEEPALIVE_SECONDS = 15.0

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    # frame-ancestors says it to browsers that read CSP level 2; this, to those that do not
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

#: The types of the files the page may load, by suffix; nothing else under
#: :data:`STATIC_DIR` is served (``index.html`` is the page at ``/``).
ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_ASSET_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}

#: Closed links and finished delegations kept in a snapshot (the latest ones).
FINISHED_SHOWN = 50
#: Links, timers and delegations in a snapshot or one page of a panel (a snapshot of a
#: team with thousands of timers stays small: the page reads the rest on demand).
SNAPSHOT_PAGE = 50
#: The most records one page request may ask for.
MAX_PAGE = 500
#: The most history events a stream may be asked to replay (``last``); the page asks
#: for the bound of its timeline.
MAX_BACKLOG = 10_000
#: Sessions shown per member in a snapshot (its latest).
SESSIONS_SHOWN = 20
#: How much of a session's transcript the session view shows (its last characters).
TRANSCRIPT_CHARS = 50_000


# -- bodies -------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TicketIn(_Body):
    team: str = Field(pattern=NAME_PATTERN, description="the team whose stream the ticket opens")


class ComposeIn(_Body):
    to: str = Field(
        pattern=TO_PATTERN, description="a member name, or '*' for every member but user"
    )
    text: str
    summary: str | None = None
    message_id: str | None = Field(
        None, pattern=MESSAGE_ID_PATTERN, description="your id for idempotent retries"
    )


PageOffset = Annotated[int, Query(ge=0, le=1_000_000)]
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]


# -- tickets ------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _ticket_key(admin_token: str) -> bytes:
    return hashlib.sha256(b"backchannel dashboard ticket v1\0" + admin_token.encode()).digest()


def issue_ticket(key: bytes, team: str, member: Member | None, now: float) -> tuple[str, float]:
    """A signed ticket letting ``member`` (``None``: the admin) watch ``team``."""
    expires = now + TICKET_SECONDS
    payload = {
        "team": team,
        "member": member.name if member else None,
        "th": member.token_hash[:16] if member else None,
        "exp": expires,
    }
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    sig = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    return f"{body}.{sig}", expires


def _bad_ticket() -> Unauthorized:
    return Unauthorized(
        "the stream ticket is invalid or expired; get a new one with "
        "POST /v1/dashboard/tickets (it is valid for a minute)"
    )


class Watcher:
    """Whom a stream's ticket spoke for when it opened, checked again as the stream
    goes on, as a bearer token is (:meth:`Hub.member_of_token`, the cache bearer tokens
    use): a token rotated or a member removed by this process counts at once, by
    another process once the store tells this one of the change (the cache is then
    forgotten; :data:`TOKEN_CACHE_SECONDS` old at the latest), so a replay of a long
    history is not a store read an event."""

    def __init__(self, hub: Hub, team: str, who: Principal) -> None:
        self.hub, self.team, self.who = hub, team, who

    async def revoked(self) -> Unauthorized | None:
        """Why the member may no longer watch the team, or ``None``."""
        me = self.who.member
        if me is None or await self.hub.member_of_token(me.token_hash) is not None:
            return None
        return token_revoked("the dashboard watched", "sign in again with the member's new token")


async def check_ticket(hub: Hub, key: bytes, ticket: str, team: str) -> Principal:
    """Who the ticket speaks for, if it is genuine, unexpired and for ``team``."""
    body, _, sig = ticket.partition(".")
    expected = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not sig or not hmac.compare_digest(sig.encode(), expected.encode()):
        raise _bad_ticket()
    try:
        payload = json.loads(_unb64(body))
        t_team, name, th, exp = payload["team"], payload["member"], payload["th"], payload["exp"]
    except (ValueError, KeyError, TypeError):
        raise _bad_ticket() from None
    if not isinstance(exp, (int, float)) or exp < hub.clock.now():
        raise _bad_ticket()
    if t_team != team:
        raise UnknownTeam(f"unknown team {team!r}", team=team)
    if name is None:
        return Principal(None)
    try:
        member = await hub.get_member(team, str(name))
    except UnknownMember:
        raise _bad_ticket() from None
    if not hmac.compare_digest(member.token_hash[:16], str(th)):
        raise _bad_ticket()
    return Principal(member)


# -- views of hub data --------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Plain JSON for a message's metadata (enums by value, anything odd as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


async def links_view(
    hub: Hub, team: str, offset: int = 0, limit: int = SNAPSHOT_PAGE
) -> tuple[list[dict[str, Any]], int]:
    """A page of the open links, then the latest closed ones; and how many of those
    were left out of the page."""
    # the open links and the latest closed ones, read as such: never every link the team
    # ever closed (a long-lived team has tens of thousands), only counted
    opened, closed, closed_total = await hub.links_overview(team, FINISHED_SHOWN)
    kept = opened[::-1] + closed
    hidden = closed_total - len(closed)
    page = kept[offset : offset + limit]
    return [x.to_json() for x in page], hidden + len(kept) - len(page)


async def timers_view(
    hub: Hub, team: str, offset: int = 0, limit: int = SNAPSHOT_PAGE
) -> tuple[list[dict[str, Any]], int]:
    """A page of the pending timers, soonest first, with ``due_in`` by the hub's clock;
    and how many there are in all."""
    now = hub.clock.now()
    # the page alone, in due order from the store's index, and a count: never every
    # pending timer of the team (up to max_timers for each member)
    page, total = await hub.timers_due(team, offset, limit)
    return [t.to_json(now) for t in page], total


def narrowed_to(who: Principal) -> str | None:
    """The member whose share of the team ``who`` sees: a member but the team's human
    sees the delegations it made or was asked and the messages it sent or got, as
    ``GET /v1/delegations`` and ``GET /v1/messages/{id}`` let it; ``None`` (all of the
    team's) for the admin and the team's human (see docs/decisions.md, "The dashboard
    shows a member what the API does")."""
    me = who.member
    return None if me is None or me.name == USER else me.name


async def delegations_view(
    hub: Hub,
    team: str,
    offset: int = 0,
    limit: int = SNAPSHOT_PAGE,
    *,
    viewer: str | None = None,
) -> tuple[list[dict[str, Any]], int, dict[str, int]]:
    """A page of the pending delegations, then the latest finished ones, each newest
    first; how many of those were left out of the page; and how many there are in each
    state, all counted. With ``viewer``, only those it made or was asked
    (:func:`narrowed_to`). Read bounded: the pending ones and the latest
    :data:`FINISHED_SHOWN` finished ones, the rest counted (a team keeps a week of
    delegations by default, tens of thousands for a busy one)."""
    pending, finished, counts = await hub.delegations_overview(team, FINISHED_SHOWN, member=viewer)
    kept = pending[::-1] + finished
    tally = {state.value: counts.get(state.value, 0) for state in DelegationState}
    hidden = sum(tally.values()) - tally[DelegationState.PENDING.value] - len(finished)
    page = kept[offset : offset + limit]
    return [x.to_json() for x in page], hidden + len(kept) - len(page), tally


async def budgets_view(
    hub: Hub, team: str, offset: int = 0, limit: int = SNAPSHOT_PAGE
) -> tuple[list[dict[str, Any]], int]:
    """A page of the budgets that need a human (spent, or already extended), the most
    recently updated first; and how many were left out of the page. Spent chain budgets
    are kept for good, so a long-lived team's list grows without bound: the page is read
    from an index in its order and the rest counted there
    (:meth:`~backchannel.hub.Hub.budgets_for_human`)."""
    page, total = await hub.budgets_for_human(team, offset=offset, limit=limit)
    return page, total - len(page)


def _session_json(s: Session) -> dict[str, Any]:
    last = s.last_output.strip()
    return {
        "session_id": s.session_id,
        "member": s.member,
        "state": s.state.value,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "turn": s.turn,
        "turn_started_at": s.turn_started_at,
        "last_stop_at": s.last_stop_at,
        "last_output": last[:300] + ("…" if len(last) > 300 else ""),
    }


def _member_state(live: list[Session], total: int) -> str:
    """A member's state: its liveliest session's; a terminated session cannot make it
    active, idle or exited, so its live sessions say all but whether it has any."""
    states = {s.state for s in live}
    for state in (SessionState.ACTIVE, SessionState.IDLE, SessionState.EXITED):
        if state in states:
            return state.value
    return SessionState.TERMINATED.value if total else "no session"


async def members_view(hub: Hub, team: str) -> list[dict[str, Any]]:
    """Each member with its state (from its sessions), kind and last session activity.
    Its sessions are read bounded (its live ones and its latest :data:`SESSIONS_SHOWN`,
    and a count of all): a member that opened ten thousand costs what one with twenty
    does (:meth:`Hub.member_sessions`)."""
    members = await hub.list_members(team)
    sessions = await hub.member_sessions(team, SESSIONS_SHOWN)
    presence = await hub.member_states(team)  # Claude Code teammates, from inbox traffic
    circuits = hub.push_circuits
    await circuits.refresh(0)  # whichever hub found a target down
    out = []
    for m in members:
        mine = sessions.get(m.name)
        live, latest, total = mine if mine is not None else ([], [], 0)
        seen = presence.get(m.name)
        last = max((s.updated_at for s in (*live, *latest)), default=None)
        state = _member_state(live, total)
        if seen is not None and state != SessionState.ACTIVE.value:
            state = seen["state"]  # a running turn wins; else what the inbox traffic says
            last = max(last or 0.0, seen["last_activity"])
        out.append(
            {
                "name": m.name,
                "kind": m.kind.value,
                "created_at": m.created_at,
                "state": state,
                "last_activity": last,
                "sessions": [_session_json(s) for s in reversed(latest)],  # oldest first
                "sessions_total": total,
                **({"presence": seen} if seen is not None else {}),
                # its push target is down, as a hub found it (delivery/circuit.py)
                **({"push_circuit": c.to_json()} if (c := circuits.get(team, m.name)) else {}),
            }
        )
    return out


async def snapshot(hub: Hub, team: str, *, viewer: str | None = None) -> dict[str, Any]:
    """Everything but the timeline, as the page shows it, bounded: the first
    :data:`SNAPSHOT_PAGE` links, timers and delegations (the rest are read page by page
    from their own endpoints), the latest :data:`SNAPSHOT_PAGE` dead letters (from the
    store, not the traffic the page was sent: that is only the latest events) and each
    member's latest :data:`SESSIONS_SHOWN` sessions.
    ``now`` is the hub's clock (the page sets its own by it); ``hidden`` counts the
    records of each panel left out; ``delegation_tally`` counts every delegation by
    state. With ``viewer``, the delegations are those it made or was asked."""
    links, links_hidden = await links_view(hub, team)
    delegations, delegations_hidden, tally = await delegations_view(hub, team, viewer=viewer)
    timers, timers_total = await timers_view(hub, team)
    budgets, budgets_hidden = await budgets_view(hub, team)
    dead, dead_total = await hub.dead_letters(team, SNAPSHOT_PAGE)
    return {
        "now": hub.clock.now(),
        "members": await members_view(hub, team),
        "links": links,
        "timers": timers,
        "delegations": delegations,
        "delegation_tally": tally,
        "budgets": budgets,  # the budgets that need a human: spent, or already extended
        "dead": [d.to_json() for d in dead],  # the latest dead letters, latest first
        "hidden": {
            "links": links_hidden,
            "delegations": delegations_hidden,
            "timers": timers_total - len(timers),
            "budgets": budgets_hidden,
            "dead": dead_total - len(dead),
        },
    }


def snapshot_key(snap: Mapping[str, Any]) -> str:
    """What decides whether a snapshot changed: all of it but the clock (``now`` and
    the timers' ``due_in``), which changes every time it is read."""
    timers = [{k: v for k, v in t.items() if k != "due_in"} for t in snap.get("timers", [])]
    return json.dumps({**snap, "now": None, "timers": timers}, sort_keys=True)


# -- the router -----------------------------------------------------------------------


def _sse(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


def build_router(hub: Hub, key: bytes) -> APIRouter:
    router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"], route_class=StrictRoute)

    async def need_team(who: Principal, team: str) -> None:
        who.need_team(team)
        await hub.get_team(team)

    @router.post(
        "/tickets", status_code=201, response_model=None, responses={201: {"model": Ticket}}
    )
    async def ticket(body: TicketIn, who: Auth) -> dict[str, Any]:
        """A short-lived ticket for the team's dashboard stream (EventSource sends no
        Authorization header; the long-lived token must not go in a URL)."""
        await need_team(who, body.team)
        token, expires = issue_ticket(key, body.team, who.member, hub.clock.now())
        return {"ticket": token, "expires_at": expires}

    @router.get(
        "/teams/{team}/members", response_model=None, responses={200: {"model": DashboardMembers}}
    )
    async def members(team: TeamName, who: Auth) -> dict[str, Any]:
        await need_team(who, team)
        return {"members": await members_view(hub, team)}

    @router.get("/teams/{team}/snapshot", response_model=None, responses={200: {"model": Snapshot}})
    async def team_snapshot(team: TeamName, who: Auth) -> dict[str, Any]:
        """Members, links, timers and delegations in one answer."""
        await need_team(who, team)
        return await snapshot(hub, team, viewer=narrowed_to(who))

    @router.get("/teams/{team}/links", response_model=None, responses={200: {"model": LinkPage}})
    async def links(
        team: TeamName, who: Auth, offset: PageOffset = 0, limit: PageLimit = SNAPSHOT_PAGE
    ) -> dict[str, Any]:
        """A page of links: open ones first, then the latest closed ones."""
        await need_team(who, team)
        page, hidden = await links_view(hub, team, offset, limit)
        return {"links": page, "offset": offset, "hidden": hidden}

    @router.get("/teams/{team}/timers", response_model=None, responses={200: {"model": TimerPage}})
    async def timers(
        team: TeamName, who: Auth, offset: PageOffset = 0, limit: PageLimit = SNAPSHOT_PAGE
    ) -> dict[str, Any]:
        """A page of pending timers, soonest first, and how many there are."""
        await need_team(who, team)
        page, total = await timers_view(hub, team, offset, limit)
        return {"timers": page, "offset": offset, "total": total}

    @router.get(
        "/teams/{team}/delegations", response_model=None, responses={200: {"model": DelegationPage}}
    )
    async def delegations(
        team: TeamName, who: Auth, offset: PageOffset = 0, limit: PageLimit = SNAPSHOT_PAGE
    ) -> dict[str, Any]:
        """A page of delegations: pending ones first, then the latest finished ones."""
        await need_team(who, team)
        page, hidden, _ = await delegations_view(hub, team, offset, limit, viewer=narrowed_to(who))
        return {"delegations": page, "offset": offset, "hidden": hidden}

    @router.get(
        "/teams/{team}/budgets", response_model=None, responses={200: {"model": BudgetPage}}
    )
    async def budgets(
        team: TeamName, who: Auth, offset: PageOffset = 0, limit: PageLimit = SNAPSHOT_PAGE
    ) -> dict[str, Any]:
        """A page of the budgets that need a human (spent or extended), newest first."""
        await need_team(who, team)
        page, hidden = await budgets_view(hub, team, offset, limit)
        return {"budgets": page, "offset": offset, "hidden": hidden}

    @router.get(
        "/teams/{team}/messages/{message_id}",
        response_model=None,
        responses={200: {"model": MessageView}},
    )
    async def message(team: TeamName, message_id: MessageId, who: Auth) -> dict[str, Any]:
        """The full message, each copy's state and the delivery history: for a member
        (but the team's human) one it sent or got, as ``GET /v1/messages/{id}``."""
        await need_team(who, team)
        status = await hub.message_status(team, message_id, viewer=narrowed_to(who))
        return {
            **status.to_json(),
            "sender_session": status.message.sender_session,
            "meta": jsonable(status.message.meta),
        }

    @router.get(
        "/teams/{team}/sessions/{session_id}",
        response_model=None,
        responses={200: {"model": SessionView}},
    )
    async def session(
        team: TeamName,
        session_id: SessionId,
        who: Auth,
        tail_chars: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    ) -> dict[str, Any]:
        """A session and the end of its transcript: the last ``tail_chars`` characters
        (:data:`TRANSCRIPT_CHARS` by default), with a note when earlier events are cut."""
        await need_team(who, team)
        s = await hub.get_session(team, session_id)
        tail = tail_chars or TRANSCRIPT_CHARS
        data = await hub.get_session_data(team, session_id, tail_chars=tail)
        note = None
        if data["truncated"]:
            note = (
                f"Earlier events are cut: this view keeps the last {tail:,} characters of "
                f"the transcript (GET /v1/sessions/{session_id}/transcript pages through "
                "all of it)."
            )
        return {"session": _session_json(s), "transcript": data["events"], "note": note}

    @router.post(
        "/teams/{team}/budgets/extend", response_model=None, responses={200: {"model": Budget}}
    )
    async def extend_budget(team: TeamName, body: ExtendIn, who: Auth) -> dict[str, Any]:
        """Extend a spent conversation budget: the admin or the team's own ``user``."""
        await need_team(who, team)
        by_whom = "admin" if who.member is None else who.member.name
        return await hub.extend_budget(
            team, body.key, body.by, by_whom=by_whom, request_id=body.request_id
        )

    @router.post("/teams/{team}/messages", status_code=201, responses=SENT)
    async def compose(team: TeamName, body: ComposeIn, who: Auth) -> JSONResponse:
        """Send as ``user``: allowed for the admin and for the team's own ``user``."""
        await need_team(who, team)
        if who.member is not None and who.member.name != USER:
            raise Forbidden(
                f"the composer sends as {USER!r}; sign in with the admin token or the "
                f"team's {USER!r} token (you are {who.member.name!r})"
            )
        if not body.text.strip():
            raise InvalidRequest("write something to send", field="text")
        result = await hub.send(
            team, USER, body.to, body.text, summary=body.summary, message_id=body.message_id
        )
        return JSONResponse(result.to_json(), status_code=200 if result.replayed else 201)

    @router.get("/teams/{team}/stream", response_class=EventStream, responses=SSE_EVENT)
    async def stream(
        team: TeamName,
        request: Request,
        ticket: Annotated[str, Query(description="from POST /v1/dashboard/tickets")],
        after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        last: Annotated[
            int | None,
            Query(
                ge=0,
                le=MAX_BACKLOG,
                description="replay no more than the team's latest `last` events",
            ),
        ] = None,
    ) -> StreamingResponse:
        """Server-sent events: ``replay`` (the cursor the replay starts after, sent
        first), ``snapshot`` (members, links, timers, delegations, dead letters; sent at
        once and whenever they change), ``traffic`` (the team's delivery events, id =
        cursor) and ``live`` (the replay has caught up). The replay starts after
        ``after``, or where the team's latest ``last`` events begin if that is later:
        a page that keeps only so many is sent only those, however long the history."""
        who = await check_ticket(hub, key, ticket, team)
        await hub.get_team(team)
        after = await check_cursor(hub, team, request, resume_after(request, after))
        if last is not None:
            after = max(after, await hub.feed_start(team, last))
        return StreamingResponse(
            _stream(hub, team, who, after, request),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )

    return router


async def _stream(
    hub: Hub, team: str, who: Principal, after: int, request: Request
) -> AsyncIterator[str]:
    """The stream's loop. The snapshot is read again every :data:`SNAPSHOT_SECONDS`,
    and :data:`SNAPSHOT_AFTER_TRAFFIC` after traffic (a crossing, a task, an answer, a
    timer firing are all messages), so what traffic changes shows at once. Before it
    sends a traffic event, and at every look at the snapshot, it checks that ``who``
    may still watch; a rotation or a removal ends the stream at once (by another hub
    process on the same store, once this one hears of it), however quiet the team."""
    loop = asyncio.get_running_loop()
    watcher = Watcher(hub, team, who)
    feed: AsyncGenerator[FeedItem, None] = hub.watch(team, after)
    pending: asyncio.Future[FeedItem] | None = None
    gone = asyncio.Event()  # set when the member's token is revoked, here or elsewhere
    revocation = asyncio.ensure_future(gone.wait())
    watching = (
        hub.watch_revocation(who.member.token_hash, gone, team)
        if who.member is not None
        else contextlib.nullcontext()
    )
    shown = ""
    checked = sent = loop.time()
    traffic = False  # traffic since the last look at the snapshot
    live = False
    try:
        yield ": connected\n\n"
        if (gap := await skipped(hub, team, after)) is not None:
            yield gap
        yield _sse("replay", {"after": after})
        with watching:
            while True:
                now = loop.time()
                look_at = checked + (SNAPSHOT_AFTER_TRAFFIC if traffic else SNAPSHOT_SECONDS)
                if now >= look_at or not shown:
                    checked, traffic = now, False
                    look_at = now + SNAPSHOT_SECONDS
                    # asked at every look, not only before a send: a quiet team would keep
                    # a rotated token's stream open for as long as nothing changes
                    if (error := await watcher.revoked()) is not None:
                        raise error
                    snap = await snapshot(hub, team, viewer=narrowed_to(who))
                    key = snapshot_key(snap)
                    if key != shown:
                        shown = key
                        sent = now
                        yield _sse("snapshot", snap)
                if await request.is_disconnected():
                    return
                if pending is None:
                    pending = asyncio.ensure_future(anext(feed))
                # asyncio.wait does not cancel the pending read: the feed survives quiet spells
                wait = 0.25 if not live else max(0.01, look_at - loop.time())
                waits: set[asyncio.Future[Any]] = {pending, revocation}
                done, _ = await asyncio.wait(
                    waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if gone.is_set():  # rotated or removed, by this process or another
                    raise await watcher.revoked() or token_revoked(
                        "the dashboard watched", "sign in again with the member's new token"
                    )
                if pending in done:
                    item = pending.result()
                    pending = None
                    if (error := await watcher.revoked()) is not None:
                        raise error
                    sent = loop.time()
                    traffic = True
                    yield _sse("traffic", item.to_json(), item.cursor)
                elif not live:
                    live = True
                    yield _sse("live", {})
                elif loop.time() - sent >= KEEPALIVE_SECONDS:
                    sent = loop.time()
                    yield ": keep-alive\n\n"
    except BackchannelError as exc:  # the team or the member's token went: say so and end
        yield _sse("error", exc.to_json())
    finally:
        revocation.cancel()
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await pending
        with contextlib.suppress(Exception):
            await feed.aclose()


# -- mounting -------------------------------------------------------------------------


def static_assets(root: Path = STATIC_DIR) -> dict[str, tuple[Path, str]]:
    """The page's assets by their path under ``/static/`` (``js/team.js``): every file
    under ``root`` with a suffix in :data:`ASSET_TYPES`, and the type it is served with."""
    return {
        path.relative_to(root).as_posix(): (path, ASSET_TYPES[path.suffix])
        for path in sorted(root.rglob("*"))
        if path.suffix in ASSET_TYPES and path.is_file()
    }


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard's page, static assets and read endpoints to ``app``."""
    hub: Hub = app.state.hub
    key = _ticket_key(app.state.admin_token)
    app.include_router(build_router(hub, key))
    assets = static_assets()

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    @app.api_route("/static/{name:path}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(name: str, request: Request) -> Response:
        """One of :func:`static_assets`, looked up by name: a path the list does not hold
        (a directory, ``../``, any other file) is 404 and never touches the disk."""
        found = assets.get(name)
        if found is None:
            raise HTTPException(404)
        path, media_type = found
        try:
            stat = path.stat()
        except OSError:  # removed since the hub started
            raise HTTPException(404) from None
        response = FileResponse(
            path, media_type=media_type, headers=_ASSET_HEADERS, stat_result=stat
        )
        etag = response.headers["etag"]
        if etag in (tag.strip() for tag in request.headers.get("if-none-match", "").split(",")):
            return Response(status_code=304, headers={**_ASSET_HEADERS, "ETag": etag})
        return response
