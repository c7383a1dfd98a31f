"""The asynchronous client: every operation of the API v1, typed."""

from __future__ import annotations

import collections
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from backchannel.client._transport import (
    RETRY_WITHIN,
    Call,
    HttpTransport,
    LocalTransport,
    Scope,
    Stream,
    Transport,
    _seconds,
    hook_result,
)
from backchannel.core.ids import new_message_id, new_receive_id, new_request_id, new_session_id
from backchannel.core.pages import MAX_PAGE
from backchannel.core.timers import MAX_TIMER_PAGE
from backchannel.errors import BackchannelError, InvalidRequest, PeerError
from backchannel.member import answer_delegation
from backchannel.models import (
    Acked,
    AckedBatch,
    Alive,
    Budget,
    BudgetList,
    ChatAccepted,
    Delegation,
    DelegationList,
    EventAnswer,
    GivenUp,
    HookResult,
    Inbox,
    InboxAcked,
    Link,
    LinkList,
    Me,
    MemberCreated,
    MemberInfo,
    MemberList,
    MemberUpdated,
    MessageIn,
    MessageReport,
    Pending,
    Reaction,
    Received,
    Released,
    Removal,
    Sent,
    SentBatch,
    SessionInfo,
    SessionList,
    TeamCreated,
    TeamList,
    TeamRef,
    Timer,
    TimerList,
    TokenRotated,
    ToolResponseAccepted,
    Traffic,
    Transcript,
)

if TYPE_CHECKING:
    from backchannel.hub import Hub

#: What a URL that is not ``http(s)://`` opens in this process (a store URL).
LOCAL_SCHEMES = ("sqlite:", "postgresql:", "postgres:", "memory:")


def _q(part: str) -> str:
    return quote(part, safe="")


def _given(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Client:
    """A client of one hub, acting as the member whose token it holds (or, without a
    token, as the administrator of a hub in this process).

    ``Client("http://127.0.0.1:8765", token=...)`` talks to a running hub over HTTP;
    ``Client("sqlite:///path/hub.db", token=...)`` (or ``postgresql://...``,
    ``memory://``) runs a hub on that store inside this process, closed with the client;
    :meth:`Client.local` uses a hub this process already runs. The calls and what they
    return are the same either way. Use it with ``async with``.
    """

    _transport: Transport

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry_within: float = RETRY_WITHIN,
        **hub_options: Any,
    ) -> None:
        from backchannel.config import hub_http_url

        transport: Transport
        if (http := hub_http_url(url)) is not None:
            transport = HttpTransport(http, token, timeout=timeout, retry_within=retry_within)
        elif url.startswith(LOCAL_SCHEMES):
            from backchannel.config import open_store
            from backchannel.delivery.adapters import register_checks
            from backchannel.hub import Hub

            hub = Hub(open_store(url), **hub_options)
            # the stock adapters' check of delivery settings, as `serve` has it: a `serve`
            # later started on this store pushes with them
            register_checks(hub.delivery_checks)
            transport = LocalTransport(hub, token, own_hub=True)
        else:
            raise InvalidRequest(
                f"cannot tell where {url!r} is: use http(s)://HOST:PORT for a running hub, "
                "or sqlite:///PATH, postgresql://... or memory:// for a hub in this process"
            )
        self._transport = transport

    @classmethod
    def local(cls, hub: Hub, token: str | None = None) -> Client:
        """A client of ``hub``, which this process runs (not closed with the client).
        Without a token it acts as the administrator."""
        return cls.over(LocalTransport(hub, token, own_hub=False))

    @classmethod
    def over(cls, transport: Transport) -> Client:
        """A client whose calls ``transport`` carries."""
        client = cls.__new__(cls)
        client._transport = transport
        return client

    @property
    def hub_url(self) -> str | None:
        """The hub's URL when this client reaches it over HTTP; None for a hub in this
        process."""
        url = getattr(self._transport, "url", None)
        return url if isinstance(url, str) else None

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        await self._transport.start()

    async def close(self) -> None:
        await self._transport.close()

    async def _do(self, call: Call[Any]) -> Any:
        return await self._transport.call(call)

    async def _pages(
        self,
        page: Callable[[str | None, int], Call[Any]],
        items: Callable[[Any], Sequence[Any]],
        after: str | None,
        limit: int | None,
    ) -> AsyncIterator[Any]:
        """The pages ``page(after, n)`` asks for, each at most
        :data:`~backchannel.core.pages.MAX_PAGE` long, from ``after`` on until ``limit``
        items (``items`` of a page; all when None) were given: each page's ``next_after``
        is where the next one starts, and ``None`` ends them."""
        given = 0
        while limit is None or given < limit:
            got = await self._do(
                page(after, MAX_PAGE if limit is None else min(limit - given, MAX_PAGE))
            )
            given += len(items(got))
            yield got
            if got.next_after is None:
                break
            after = got.next_after

    # -- who -------------------------------------------------------------------------
    async def me(self) -> Me:
        """Who this client acts as: the administrator, or a member of a team."""

        async def local(s: Scope) -> Me:
            from backchannel.member import AdminApi

            return AdminApi.me() if s.is_admin else s.member.me()

        got: Me = await self._do(Call("GET", "/v1/me", local, Me))
        return got

    async def _team(self, team: str | None) -> str:
        if team is not None:
            return team
        me = await self.me()
        if me.team is None:
            raise InvalidRequest("name the team: the administrator belongs to none")
        return me.team

    # -- teams and members (administrator) -------------------------------------------
    async def create_team(
        self, name: str, settings: Mapping[str, Any] | None = None
    ) -> TeamCreated:
        """Create a team; the answer carries ``user_token``, shown only once."""
        body = _given(name=name, settings=dict(settings) if settings else None)
        call = Call(
            "POST", "/v1/teams", lambda s: s.admin.create_team(name, settings), TeamCreated, body
        )
        got: TeamCreated = await self._do(call)
        return got

    async def teams(self, *, after: str | None = None, limit: int | None = None) -> list[TeamRef]:
        """The teams (administrator), or your own, by name: at most ``limit`` after the
        name ``after`` (every one when ``limit`` is None, read from the hub a bounded page
        at a time)."""
        out: list[TeamRef] = []
        async for page in self.team_pages(after=after, limit=limit):
            out.extend(page.teams)
        return out

    async def team_pages(
        self, *, after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[TeamList]:
        """The pages of the teams, each at most :data:`~backchannel.core.pages.MAX_PAGE`
        long, until ``limit`` teams (all when None) were given; each page's
        ``next_after`` says where the next one starts."""
        _check_page(after, limit, "team", cursor="a team name")

        def page(after: str | None, n: int) -> Call[TeamList]:
            return Call(
                "GET",
                "/v1/teams",
                functools.partial(_teams, after, n),
                TeamList,
                params={"limit": n, **_given(after=after)},
            )

        async for got in self._pages(page, lambda got: got.teams, after, limit):
            yield got

    async def add_member(
        self,
        team: str,
        name: str,
        kind: str = "llm",
        delivery: Mapping[str, Any] | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberCreated:
        """Add a member; the answer carries its ``token``, shown only once."""
        body = _given(
            name=name,
            kind=kind,
            delivery=dict(delivery) if delivery else None,
            settings=dict(settings) if settings else None,
        )
        call = Call(
            "POST",
            f"/v1/teams/{_q(team)}/members",
            lambda s: s.admin.add_member(team, name, kind, delivery=delivery, settings=settings),
            MemberCreated,
            body,
        )
        got: MemberCreated = await self._do(call)
        return got

    async def update_member(
        self,
        team: str,
        name: str,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberUpdated:
        """Change a member's delivery setting or settings (what is not given stays).
        Each given is set whole, so a change whose answer was lost on the way is made
        again."""
        body = _given(
            delivery=None if delivery is None else dict(delivery),
            settings=None if settings is None else dict(settings),
        )
        call = Call(
            "PATCH",
            f"/v1/teams/{_q(team)}/members/{_q(name)}",
            lambda s: s.admin.update_member(team, name, delivery=delivery, settings=settings),
            MemberUpdated,
            body,
            repeatable=True,
        )
        got: MemberUpdated = await self._do(call)
        return got

    async def members(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[MemberInfo]:
        """The members of ``team`` (a member: of its own team, the default), by name: at
        most ``limit`` after the name ``after`` (every one when ``limit`` is None, read
        from the hub a bounded page at a time)."""
        out: list[MemberInfo] = []
        async for page in self.member_pages(team, after=after, limit=limit):
            out.extend(page.members)
        return out

    async def member_pages(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[MemberList]:
        """The pages of ``team``'s members, each at most
        :data:`~backchannel.core.pages.MAX_PAGE` long, until ``limit`` members (all when
        None) were given; each page's ``next_after`` says where the next one starts."""
        _check_page(after, limit, "member", cursor="a member name")
        name = await self._team(team)

        def page(after: str | None, n: int) -> Call[MemberList]:
            return Call(
                "GET",
                f"/v1/teams/{_q(name)}/members",
                functools.partial(_team_members, name, after, n),
                MemberList,
                params={"limit": n, **_given(after=after)},
            )

        async for got in self._pages(page, lambda got: got.members, after, limit):
            yield got

    async def rotate_token(self, team: str, name: str) -> TokenRotated:
        """Give a member a new token (in the answer only); the old one fails at once.
        A rotation whose answer was lost on the way is made again: the token that answer
        held reached no one, and the second rotation ends it too."""
        call = Call(
            "POST",
            f"/v1/teams/{_q(team)}/members/{_q(name)}/token",
            lambda s: s.admin.rotate_token(team, name),
            TokenRotated,
            repeatable=True,
        )
        got: TokenRotated = await self._do(call)
        return got

    async def remove_member(self, team: str, name: str, *, reason: str = "") -> Removal:
        """Remove a member: what waits for it becomes dead letters (senders told)."""
        call = Call(
            "DELETE",
            f"/v1/teams/{_q(team)}/members/{_q(name)}",
            lambda s: s.admin.remove_member(team, name, reason=reason),
            Removal,
            params={"reason": reason} if reason else None,
        )
        got: Removal = await self._do(call)
        return got

    async def remove_team(self, team: str) -> Removal:
        """Remove a team and everything stored for it."""
        call = Call("DELETE", f"/v1/teams/{_q(team)}", lambda s: s.admin.remove_team(team), Removal)
        got: Removal = await self._do(call)
        return got

    async def budgets(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[Budget]:
        """The conversation budgets used in ``team`` (yours by default), by key: at most
        ``limit`` after the key ``after`` (every one when ``limit`` is None, read from the
        hub a bounded page at a time)."""
        out: list[Budget] = []
        async for page in self.budget_pages(team, after=after, limit=limit):
            out.extend(page.budgets)
        return out

    async def budget_pages(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[BudgetList]:
        """The pages of ``team``'s used budgets, each at most
        :data:`~backchannel.core.pages.MAX_PAGE` long, until ``limit`` budgets (all when
        None) were given; each page's ``next_after`` says where the next one starts."""
        _check_page(after, limit, "budget", cursor="a budget key")
        name = await self._team(team)

        def page(after: str | None, n: int) -> Call[BudgetList]:
            return Call(
                "GET",
                f"/v1/teams/{_q(name)}/budgets",
                functools.partial(_team_budgets, name, after, n),
                BudgetList,
                params={"limit": n, **_given(after=after)},
            )

        async for got in self._pages(page, lambda got: got.budgets, after, limit):
            yield got

    async def extend_budget(
        self, key: str, by: int, *, team: str | None = None, request_id: str | None = None
    ) -> Budget:
        """Let exactly ``by`` more exchanges (``pair:a|b``) or hops (``chain:<id>``)
        through: the team's human or the administrator only. Idempotent on
        ``request_id``: the same id again answers the budget, ``replayed``, and extends
        nothing. Without one the client picks it, so that an extension whose answer was
        lost on the way is made again without extending twice."""
        name = await self._team(team)
        if request_id is None:
            request_id = new_request_id()

        async def local(s: Scope) -> Budget:
            s.need_team(name)
            if s.is_admin:
                return await s.admin.extend_budget(name, key, by, request_id=request_id)
            return await s.member.extend_budget(key, by, request_id=request_id)

        call = Call(
            "POST",
            f"/v1/teams/{_q(name)}/budgets/extend",
            local,
            Budget,
            {"key": key, "by": by, "request_id": request_id},
            repeatable=True,
        )
        got: Budget = await self._do(call)
        return got

    def team_events(
        self,
        team: str | None = None,
        *,
        after: int = 0,
        reconnect_within: float | None = None,
    ) -> AsyncIterator[Traffic]:
        """The team's live traffic (sends, leases, acks, dead letters) from cursor
        ``after`` on; it never ends by itself. With ``reconnect_within`` (seconds), a
        connection to the hub that fails is opened again where it stopped (each event
        once), and the stream gives up, naming the cursor to go on from, only after
        failing that long (see :meth:`HttpTransport.stream`)."""
        if reconnect_within is not None and (
            not _seconds(reconnect_within, infinite=True) or reconnect_within < 0
        ):
            raise InvalidRequest(
                "reconnect_within is how long (seconds from 0) the stream is opened again "
                f"while the way to the hub fails, or None; not {reconnect_within!r}",
                field="reconnect_within",
            )

        async def run() -> AsyncIterator[Traffic]:
            name = await self._team(team)

            def local(s: Scope) -> AsyncIterator[Traffic]:
                s.need_team(name)
                if s.is_admin:
                    return s.admin.events(name, after=after)
                return s.member.events(after=after)

            stream = Stream(
                f"/v1/teams/{_q(name)}/events",
                local,
                Traffic,
                {"after": after},
                reconnect_within=reconnect_within,
            )
            async for item in self._transport.stream(stream):
                yield item

        return run()

    # -- messages ----------------------------------------------------------------------
    async def send(
        self,
        to: str,
        text: str,
        *,
        summary: str | None = None,
        message_id: str | None = None,
        session: str | None = None,
        from_session: str | None = None,
        link: bool = True,
        close_link: bool = False,
        link_budget: int | None = None,
    ) -> Sent:
        """Send as your member (from ``from_session``'s turn, if given). A send from a
        turn opens a link to the recipient unless ``link=False``. Idempotent on
        ``message_id``: the same id again answers the first result, ``replayed``. Without
        one the client picks it, so that a send whose answer was lost on the way is made
        again as the same message, never a second one; if no try's answer comes back,
        the :class:`.PeerError` names that id (``details["message_id"]``) to send it
        again with."""
        given = message_id is not None
        if message_id is None:
            message_id = new_message_id()
        body = {
            "to": to,
            "text": text,
            "link": link,
            "close_link": close_link,
            **_given(
                summary=summary,
                message_id=message_id,
                session=session,
                from_session=from_session,
                link_budget=link_budget,
            ),
        }

        def local(s: Scope) -> Any:
            return s.member.send(
                to,
                text,
                summary=summary,
                message_id=message_id,
                session=session,
                from_session=from_session,
                link=link,
                close_link=close_link,
                link_budget=link_budget,
            )

        call = Call("POST", "/v1/messages", local, Sent, body, repeatable=True)
        if given:
            got: Sent = await self._do(call)
            return got
        try:
            got = await self._do(call)
        except PeerError as exc:  # the caller does not know the id that makes a retry safe
            raise PeerError(
                f"{exc.message}. To send it again safely, send it with "
                f"message_id={message_id!r} (the id this client gave it): the hub stores "
                "a message once under its id, however many tries reach it",
                **{**exc.details, "message_id": message_id},
            ) from exc
        return got

    async def send_batch(self, messages: Sequence[MessageIn | Mapping[str, Any]]) -> SentBatch:
        """Send many messages in one request (each a :class:`MessageIn` or its JSON).
        Each is answered on its own; a bad one loses none of the others. An item without
        a ``message_id`` gets one from the client, as in :meth:`send` (if no try's answer
        comes back, the :class:`.PeerError` lists every item's id in
        ``details["message_ids"]``)."""
        items = [
            m.model_dump(exclude_defaults=True) if isinstance(m, MessageIn) else dict(m)
            for m in messages
        ]
        picked = False
        for item in items:
            if item.get("message_id") is None:
                item["message_id"] = new_message_id()
                picked = True
        call = Call(
            "POST",
            "/v1/messages/batch",
            lambda s: s.member.send_batch(items),
            SentBatch,
            {"messages": items},
            repeatable=True,
        )
        try:
            got: SentBatch = await self._do(call)
        except PeerError as exc:
            if not picked:
                raise
            ids = [item["message_id"] for item in items]
            raise PeerError(
                f"{exc.message}. To send the batch again safely, give its items the "
                "ids this client gave them, details['message_ids'] of this error in order: "
                "the hub stores a message once under its id, however many tries reach it",
                **{**exc.details, "message_ids": ids},
            ) from exc
        return got

    async def status(self, message_id: str) -> MessageReport:
        """Delivery state and history of a message you sent or received."""
        call = Call(
            "GET",
            f"/v1/messages/{_q(message_id)}",
            lambda s: s.member.status(message_id),
            MessageReport,
        )
        got: MessageReport = await self._do(call)
        return got

    async def react(self, message_id: str, emoji: str) -> Reaction:
        """React to a message you sent or received (not a send: it crosses no link). A
        reaction is there once: made again, it changes nothing, so one whose answer was
        lost on the way is made again."""
        call = Call(
            "POST",
            f"/v1/messages/{_q(message_id)}/reactions",
            lambda s: s.member.react(message_id, emoji),
            Reaction,
            {"emoji": emoji},
            repeatable=True,
        )
        got: Reaction = await self._do(call)
        return got

    # -- inbox -------------------------------------------------------------------------
    async def receive(
        self,
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
        receive_id: str | None = None,
    ) -> list[Received]:
        """Lease up to ``limit`` messages, waiting up to ``wait`` s for the first (for
        ``lease`` seconds; with ``pinned_only``, only those pinned to ``session``).
        Ack each (:meth:`ack`, or ``await msg.ack()``) once handled.

        The receive is named (``receive_id``, a new one unless given): made again
        after its answer was lost on the way, it gets the messages the hub leased for
        it, not others while those wait out their lease."""
        rid = new_receive_id() if receive_id is None else receive_id
        params = {
            "limit": limit,
            "wait": wait,
            "pinned_only": pinned_only,
            "receive_id": rid,
            **_given(session=session, lease=lease),
        }

        async def local(s: Scope) -> Inbox:
            got = await s.member.receive(
                limit=limit,
                wait=wait,
                session=session,
                lease=lease,
                pinned_only=pinned_only,
                receive_id=rid,
            )
            return Inbox(messages=got)

        async def given_back(got: Inbox) -> None:
            await self._given_back(got.messages)

        inbox: Inbox = await self._do(
            Call("GET", "/v1/inbox", local, Inbox, params=params, wait=wait, given_back=given_back)
        )
        return [m.bind(self) for m in inbox.messages]

    async def ack_and_receive(
        self,
        ack: Sequence[str],
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
        receive_id: str | None = None,
    ) -> InboxAcked:
        """Ack ``ack`` (messages you received and are done with), then :meth:`receive`,
        in one request and one store transaction: a receiver loop passes the ids of its
        last batch with each call. ``acked`` and ``not_held`` say what the ack did (ids
        not held fail nothing); ``messages`` are what was leased (the receive named as
        :meth:`receive` names it)."""
        ids = list(ack)
        rid = new_receive_id() if receive_id is None else receive_id
        body = {
            "ack": ids,
            "limit": limit,
            "wait": wait,
            "pinned_only": pinned_only,
            "receive_id": rid,
            **_given(session=session, lease=lease),
        }

        async def local(s: Scope) -> InboxAcked:
            return await s.member.ack_and_receive(
                ids,
                limit=limit,
                wait=wait,
                session=session,
                lease=lease,
                pinned_only=pinned_only,
                receive_id=rid,
            )

        async def given_back(got: InboxAcked) -> None:
            await self._given_back(got.messages)

        got: InboxAcked = await self._do(
            Call(
                "POST",
                "/v1/inbox/receive",
                local,
                InboxAcked,
                body,
                wait=wait,
                repeatable=True,
                given_back=given_back,
            )
        )
        for m in got.messages:
            m.bind(self)
        return got

    async def inbox(
        self, *, session: str | None = None, wait: float = 30.0, batch: int = 32
    ) -> AsyncIterator[Received]:
        """Yield messages as they arrive (pushed: a waiting receiver wakes on commit).
        A loop that stops early (``break``, an exception) gives the messages of the
        batch it was not handed back at once when the iterator is closed (``async with
        contextlib.aclosing(...)``, or by the event loop once the iterator is dropped),
        instead of leaving them leased until their lease ends."""
        while True:
            rest = collections.deque(await self.receive(limit=batch, wait=wait, session=session))
            try:
                while rest:
                    yield rest.popleft()
            finally:
                if rest:
                    with contextlib.suppress(BackchannelError):  # they come back at lease end
                        await self.release([m.message_id for m in rest])

    async def _given_back(self, got: Sequence[Received]) -> None:
        """Release ``got``, leased for a caller that never took them (it was cancelled
        or interrupted once the hub had answered)."""
        if got:
            await self.release([m.message_id for m in got])

    async def pending(self) -> int:
        """How many of your messages are not acked yet."""
        call = Call("GET", "/v1/inbox/pending", lambda s: s.member.pending(), Pending)
        got: Pending = await self._do(call)
        return got.pending

    async def ack(self, message_ids: Sequence[str]) -> Acked:
        """Ack messages you hold; ``not_held`` names those you did not."""
        ids = list(message_ids)
        call = Call(
            "POST",
            "/v1/inbox/ack",
            lambda s: s.member.ack(ids),
            Acked,
            {"message_ids": ids},
            repeatable=True,
        )
        got: Acked = await self._do(call)
        return got

    async def ack_batch(self, message_ids: Sequence[str]) -> AckedBatch:
        """Ack many ids, each answered on its own (``acked``, ``not_held``, ``invalid``)."""
        ids = list(message_ids)
        call = Call(
            "POST",
            "/v1/inbox/ack/batch",
            lambda s: s.member.ack_batch(ids),
            AckedBatch,
            {"message_ids": ids},
            repeatable=True,
        )
        got: AckedBatch = await self._do(call)
        return got

    async def release(self, message_ids: Sequence[str]) -> int:
        """Give leased messages back at once instead of at the lease's end."""
        ids = list(message_ids)
        call = Call(
            "POST",
            "/v1/inbox/release",
            lambda s: s.member.release(ids),
            Released,
            {"message_ids": ids},
            repeatable=True,
        )
        got: Released = await self._do(call)
        return got.released

    async def give_up(self, message_ids: Sequence[str], reason: str) -> int:
        """Give up for good on leased messages you will never handle (your model fails
        for good): each is dead with ``reason`` and its sender is told. Returns how many
        were (ids you do not hold leased are left as they are)."""
        ids = list(message_ids)
        call = Call(
            "POST",
            "/v1/inbox/give-up",
            lambda s: s.member.give_up(ids, reason),
            GivenUp,
            {"message_ids": ids, "reason": reason},
            repeatable=True,
        )
        got: GivenUp = await self._do(call)
        return got.given_up

    # -- sessions and turns ------------------------------------------------------------
    async def open_session(self, session_id: str | None = None) -> SessionInfo:
        """Open a session, or resume ``session_id`` (same state, links and timers).
        Without an id the client picks a new one (as the hub would, ``<member>-<hex>``),
        so that an open whose answer was lost on the way is made again as the same
        session, never a second one: opening a session that is open answers it."""
        if session_id is None:
            me = await self.me()
            if me.name is not None:  # the administrator is refused by the hub
                session_id = new_session_id(me.name)
        call = Call(
            "POST",
            "/v1/sessions",
            lambda s: s.member.open_session(session_id),
            SessionInfo,
            {"session_id": session_id},
            repeatable=True,
        )
        got: SessionInfo = await self._do(call)
        return got

    async def list_sessions(
        self,
        member: str | None = None,
        *,
        active_only: bool = False,
        live_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[SessionInfo]:
        """Sessions of your team (or of one member; with ``active_only``, those whose
        turn runs now; with ``live_only``, those not terminated), in the order they were
        opened: at most ``limit`` after session ``after`` (every one when ``limit`` is
        None, read from the hub a bounded page at a time)."""
        out: list[SessionInfo] = []
        pages = self.session_pages(
            member, active_only=active_only, live_only=live_only, after=after, limit=limit
        )
        async for page in pages:
            out.extend(page.sessions)
        return out

    async def session_pages(
        self,
        member: str | None = None,
        *,
        active_only: bool = False,
        live_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[SessionList]:
        """The pages of your team's sessions (or one member's; with ``active_only``,
        those whose turn runs now; with ``live_only``, those not terminated), each at most :data:`~backchannel.core.pages.MAX_PAGE`
        long, until ``limit`` sessions (all when None) were given; each page's
        ``next_after`` says where the next one starts."""
        _check_page(after, limit, "session")

        def page(after: str | None, n: int) -> Call[SessionList]:
            return Call(
                "GET",
                "/v1/sessions",
                functools.partial(_member_sessions, member, active_only, live_only, after, n),
                SessionList,
                params={
                    "limit": n,
                    **_given(member=member, after=after),
                    **({"active_only": True} if active_only else {}),
                    **({"live_only": True} if live_only else {}),
                },
            )

        async for got in self._pages(page, lambda got: got.sessions, after, limit):
            yield got

    async def session(self, session_id: str) -> SessionInfo:
        """One session of your team."""
        call = Call(
            "GET",
            f"/v1/sessions/{_q(session_id)}",
            lambda s: s.member.session(session_id),
            SessionInfo,
        )
        got: SessionInfo = await self._do(call)
        return got

    async def report_event(
        self,
        session_id: str,
        kind: str,
        text: str = "",
        data: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> EventAnswer:
        """Report ``turn_start``, ``thought``, ``tool_call``, ``tool_result``,
        ``agent_output`` or ``agent_stop`` (its text is the closing text, routed).
        Idempotent on ``request_id``: the same id again answers the first answer,
        ``replayed``. Without one the client picks it, so that a report whose answer was
        lost on the way is made again without starting a turn twice or routing a
        closing text twice."""
        if request_id is None:
            request_id = new_request_id()
        body = {"kind": kind, "text": text, "data": dict(data or {}), "request_id": request_id}
        call = Call(
            "POST",
            f"/v1/sessions/{_q(session_id)}/events",
            lambda s: s.member.report_event(session_id, kind, text, data, request_id=request_id),
            EventAnswer,
            body,
            repeatable=True,
        )
        got: EventAnswer = await self._do(call)
        return got

    async def turn_start(self, session_id: str, text: str = "") -> EventAnswer:
        return await self.report_event(session_id, "turn_start", text)

    async def agent_stop(self, session_id: str, text: str) -> EventAnswer:
        return await self.report_event(session_id, "agent_stop", text)

    async def runtime_alive(self, runtime: str) -> Alive:
        """Runtime process ``runtime`` of yours is alive (as the command hook names it,
        :func:`backchannel.runtimes.liveness.runtime_key`): your live sessions that run
        under it are too. The stdio MCP server calls this while its runtime runs."""
        call = Call(
            "POST",
            "/v1/sessions/alive",
            lambda s: s.member.runtime_alive(runtime),
            Alive,
            {"runtime": runtime},
            repeatable=True,
        )
        got: Alive = await self._do(call)
        return got

    async def terminate_session(self, session_id: str, reason: str = "") -> SessionInfo:
        """End a session for good. Ending an ended session answers it as it is, so an
        end whose answer was lost on the way is made again."""
        call = Call(
            "POST",
            f"/v1/sessions/{_q(session_id)}/terminate",
            lambda s: s.member.terminate_session(session_id, reason),
            SessionInfo,
            {"reason": reason},
            repeatable=True,
        )
        got: SessionInfo = await self._do(call)
        return got

    async def session_data(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
        max_chars: int = 20_000,
    ) -> Transcript:
        """A teammate's transcript, paged and capped (``get_session_data``)."""
        params = {
            "since": since,
            "max_chars": max_chars,
            **_given(until=until, tail_chars=tail_chars),
        }
        call = Call(
            "GET",
            f"/v1/sessions/{_q(session_id)}/transcript",
            lambda s: s.member.transcript(
                session_id, since=since, until=until, tail_chars=tail_chars, max_chars=max_chars
            ),
            Transcript,
            params=params,
        )
        got: Transcript = await self._do(call)
        return got

    # -- links -------------------------------------------------------------------------
    async def links(
        self,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        """Your team's links: peers, turns used of the budget, state, why closed; in the
        order they opened, at most ``limit`` after link ``after`` (every one when
        ``limit`` is None, read from the hub a bounded page at a time)."""
        out: list[Link] = []
        pages = self.link_pages(member=member, open_only=open_only, after=after, limit=limit)
        async for page in pages:
            out.extend(page.links)
        return out

    async def link_pages(
        self,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[LinkList]:
        """The pages of your team's links (or one member's), each at most
        :data:`~backchannel.core.pages.MAX_PAGE` long, until ``limit`` links (all when
        None) were given; each page's ``next_after`` says where the next one starts."""
        _check_page(after, limit, "link")

        def page(after: str | None, n: int) -> Call[LinkList]:
            return Call(
                "GET",
                "/v1/links",
                functools.partial(_member_links, member, open_only, after, n),
                LinkList,
                params={"open_only": open_only, "limit": n, **_given(member=member, after=after)},
            )

        async for got in self._pages(page, lambda got: got.links, after, limit):
            yield got

    async def link(self, link_id: str) -> Link:
        call = Call("GET", f"/v1/links/{_q(link_id)}", lambda s: s.member.link(link_id), Link)
        got: Link = await self._do(call)
        return got

    # -- timers ------------------------------------------------------------------------
    async def set_timer(
        self,
        intent: str,
        minutes: float | None = None,
        note: str = "",
        target: str | None = None,
        *,
        seconds: float | None = None,
        session: str | None = None,
        request_id: str | None = None,
    ) -> Timer:
        """Set a heartbeat: ``anchor`` (back to your task; 10 minutes when no time is
        given), ``check`` or ``wait`` (on the ``target`` peer). One of ``minutes`` and
        ``seconds``. Idempotent on ``request_id``: the same id again answers the timer
        it set. Without one the client picks it, so that a set whose answer was lost on
        the way is made again as the same timer, never a second one."""
        if request_id is None:
            request_id = new_request_id()
        body = {
            "intent": intent,
            "note": note,
            "request_id": request_id,
            **_given(minutes=minutes, seconds=seconds, target=target, session=session),
        }
        call = Call(
            "POST",
            "/v1/timers",
            lambda s: s.member.set_timer(
                intent,
                minutes,
                note,
                target,
                seconds=seconds,
                session=session,
                request_id=request_id,
            ),
            Timer,
            body,
            repeatable=True,
        )
        got: Timer = await self._do(call)
        return got

    async def timer(self, timer_id: int) -> Timer:
        """One timer of your team (pending, fired or cancelled), its note whole."""
        call = Call("GET", f"/v1/timers/{timer_id}", lambda s: s.member.timer(timer_id), Timer)
        got: Timer = await self._do(call)
        return got

    async def cancel_timer(self, timer_id: int) -> Timer:
        """Cancel one of your pending timers. A timer cancelled already is answered as it
        is, so a cancel whose answer was lost on the way is made again."""
        call = Call(
            "DELETE",
            f"/v1/timers/{timer_id}",
            lambda s: s.member.cancel_timer(timer_id),
            Timer,
            repeatable=True,
        )
        got: Timer = await self._do(call)
        return got

    async def timers(
        self,
        *,
        member: str | None = None,
        session: str | None = None,
        all: bool = False,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Timer]:
        """Pending timers of your team (``all``: fired and cancelled ones too), in the
        order they were set: at most ``limit`` after timer id ``after`` (every one when
        ``limit`` is None, read from the hub a bounded page at a time)."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidRequest(
                f"after is a timer id (0 or more; the last one you listed), not {after!r}",
                field="after",
            )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidRequest(
                f"limit is how many timers to list (1 or more, or None for all), not {limit!r}",
                field="limit",
            )
        out: list[Timer] = []
        while limit is None or len(out) < limit:
            n = MAX_TIMER_PAGE if limit is None else min(limit - len(out), MAX_TIMER_PAGE)
            call: Call[TimerList] = Call(
                "GET",
                "/v1/timers",
                functools.partial(_member_timers, member, session, all, after, n),
                TimerList,
                params={
                    "all": all,
                    "after": after,
                    "limit": n,
                    **_given(member=member, session=session),
                },
            )
            got: TimerList = await self._do(call)
            out.extend(got.timers)
            if got.next_after is None:
                break
            after = got.next_after
        return out

    # -- delegation --------------------------------------------------------------------
    async def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> Delegation:
        """Call ``to`` as an asynchronous tool from your open turn; returns at once,
        pending. The answer arrives as a ``tool_result`` message. Idempotent on
        ``tool_use_id`` in your session: the same call again answers the delegation it
        made, ``replayed``. Without one the client picks it, so that a call whose answer was lost on
        the way is made again as the same delegation, never a second one."""
        if tool_use_id is None:
            tool_use_id = "tu_" + uuid.uuid4().hex[:16]
        body = {
            "to": to,
            "task": task,
            **_given(timeout_s=timeout_s, session=session, tool_use_id=tool_use_id),
        }
        call = Call(
            "POST",
            "/v1/delegations",
            lambda s: s.member.delegate(
                to, task, timeout_s=timeout_s, session=session, tool_use_id=tool_use_id
            ),
            Delegation,
            body,
            repeatable=True,
        )
        got: Delegation = await self._do(call)
        return got

    async def delegations(
        self,
        *,
        member: str | None = None,
        pending_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Delegation]:
        """The delegations you made or were asked (``member``: only those that member is
        in too; the team's human: every one of the team's; ``pending_only``: those still
        waiting for their answer), in the order they were made: at most ``limit`` after
        delegation ``after`` (every one when ``limit`` is None, read from the hub a
        bounded page at a time)."""
        out: list[Delegation] = []
        pages = self.delegation_pages(
            member=member, pending_only=pending_only, after=after, limit=limit
        )
        async for page in pages:
            out.extend(page.delegations)
        return out

    async def delegation_pages(
        self,
        *,
        member: str | None = None,
        pending_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[DelegationList]:
        """The pages of your delegations, each at most
        :data:`~backchannel.core.pages.MAX_PAGE` long, until ``limit`` delegations (all
        when None) were given; each page's ``next_after`` says where the next one starts."""
        _check_page(after, limit, "delegation")

        def page(after: str | None, n: int) -> Call[DelegationList]:
            return Call(
                "GET",
                "/v1/delegations",
                functools.partial(_member_delegations, member, pending_only, after, n),
                DelegationList,
                params={
                    "limit": n,
                    **_given(member=member, after=after),
                    **({"pending_only": True} if pending_only else {}),
                },
            )

        async for got in self._pages(page, lambda got: got.delegations, after, limit):
            yield got

    async def delegation(self, delegation_id: str) -> Delegation:
        call = Call(
            "GET",
            f"/v1/delegations/{_q(delegation_id)}",
            lambda s: s.member.delegation(delegation_id),
            Delegation,
        )
        got: Delegation = await self._do(call)
        return got

    async def chat(
        self,
        agent: str,
        message: str,
        *,
        reply_service: str,
        reply_token: str,
        session_id: str | None = None,
        tool_use_id: str | None = None,
        timeout_s: float | None = None,
        chain: Mapping[str, Any] | None = None,
    ) -> ChatAccepted:
        """As another hub: ask ``agent`` of your team for a task; the answer goes to
        ``reply_service`` (registered on the hub) with ``reply_token``. ``chain``
        (``{"id", "hop"}``): the conversation chain the task goes on in."""
        body = {
            "agent": agent,
            "message": message,
            "reply": {"callbackService": reply_service, "bearerToken": reply_token},
            **_given(session_id=session_id, tool_use_id=tool_use_id, timeout_s=timeout_s),
            **({"chain": dict(chain)} if chain is not None else {}),
        }
        call = Call(
            "POST",
            "/v1/chat",
            lambda s: s.member.chat(
                agent,
                message,
                reply_service=reply_service,
                reply_token=reply_token,
                session_id=session_id,
                tool_use_id=tool_use_id,
                timeout_s=timeout_s,
                chain=chain,
            ),
            ChatAccepted,
            body,
        )
        got: ChatAccepted = await self._do(call)
        return got

    async def tool_response(
        self, reply_token: str, result: Any, *, chain: Mapping[str, Any] | None = None
    ) -> ToolResponseAccepted:
        """As a callee hub: answer a delegation with the one-time ``reply_token``.
        ``chain`` (``{"id", "hop"}``): the conversation chain the answer goes on in."""
        call = Call(
            "POST",
            "/v1/tools/response",
            lambda s: answer_delegation(s.hub, reply_token, result, chain),
            ToolResponseAccepted,
            {"result": result, **({"chain": dict(chain)} if chain is not None else {})},
            token=reply_token,
        )
        got: ToolResponseAccepted = await self._do(call)
        return got

    # -- hooks -------------------------------------------------------------------------
    async def hook(self, runtime: str, payload: Any, *, expect: str | None = None) -> HookResult:
        """A runtime's hook call (``claude-code``, ``codex``, ``gemini``): its own hook
        JSON in, its own hook output JSON out. ``expect`` (``TEAM/MEMBER``) refuses,
        with no effect, a token of any other member. A payload it cannot use answers
        ``{}`` with the ``problem``."""
        call: Call[HookResult] = Call(
            "POST",
            f"/v1/hooks/{_q(runtime)}",
            lambda s: s.member.hook(runtime, payload, expect=expect),
            json=payload,
            params=_given(**{"as": expect}),
            parse=hook_result,
        )
        got: HookResult = await self._do(call)
        return got


async def _member_timers(
    member: str | None, session: str | None, all: bool, after: int, limit: int, s: Scope
) -> TimerList:
    """One page of timers, in-process."""
    return await s.member.timers(member=member, session=session, all=all, after=after, limit=limit)


async def _member_sessions(
    member: str | None,
    active_only: bool,
    live_only: bool,
    after: str | None,
    limit: int,
    s: Scope,
) -> SessionList:
    """One page of sessions, in-process."""
    return await s.member.sessions(
        member=member, active_only=active_only, live_only=live_only, after=after, limit=limit
    )


async def _member_links(
    member: str | None, open_only: bool, after: str | None, limit: int, s: Scope
) -> LinkList:
    """One page of links, in-process."""
    return await s.member.links(member=member, open_only=open_only, after=after, limit=limit)


def _check_page(after: str | None, limit: int | None, what: str, cursor: str = "") -> None:
    """Refuse a page's cursor (``cursor``: what it is, a ``what`` id by default) or
    length by name before asking the hub."""
    if after is not None and (not isinstance(after, str) or not after):
        raise InvalidRequest(
            f"after is {cursor or f'a {what} id'} (the last one you listed), not {after!r}",
            field="after",
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidRequest(
            f"limit is how many {what}s to list (1 or more, or None for all), not {limit!r}",
            field="limit",
        )


async def _member_delegations(
    member: str | None, pending_only: bool, after: str | None, limit: int, s: Scope
) -> DelegationList:
    """One page of delegations, in-process."""
    return await s.member.delegations(
        member=member, pending_only=pending_only, after=after, limit=limit
    )


async def _teams(after: str | None, limit: int, s: Scope) -> TeamList:
    """One page of the teams (the administrator), or a member's own, in-process."""
    if s.is_admin:
        return await s.admin.teams(after=after, limit=limit)
    own = s.member.team
    return TeamList(teams=[TeamRef(name=own)] if after is None or own > after else [])


async def _team_budgets(team: str, after: str | None, limit: int, s: Scope) -> BudgetList:
    """One page of a team's used budgets, in-process."""
    s.need_team(team)
    from backchannel.member import AdminApi

    return await AdminApi(s.hub).budgets(team, after=after, limit=limit)


async def _team_members(team: str, after: str | None, limit: int, s: Scope) -> MemberList:
    """One page of a team's members, in-process."""
    s.need_team(team)
    if not s.is_admin:
        return await s.member.members(after=after, limit=limit)
    return await s.admin.members(team, after=after, limit=limit)
