"""The Python SDK: one interface over a running hub (HTTP) or a store opened in-process.

::

    async with backchannel.connect("http://127.0.0.1:8765", token=TOKEN) as hub:
        await hub.send("worker-1", "count the lines in src/")
        async for msg in hub.inbox():
            print(msg.sender, msg.text)
            await msg.ack()

``connect("sqlite:///path/to.db", token=...)`` runs a hub inside this process on that
store; without a token an in-process client acts as the administrator. For scripts,
:func:`connect_sync` gives the same calls without ``await``.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from backchannel import errors
from backchannel.config import open_store
from backchannel.errors import BackchannelError, InvalidRequest, PeerError, Unauthorized
from backchannel.hub import Hub, session_json
from backchannel.types import Member

__all__ = ["Client", "Received", "SyncClient", "connect", "connect_sync"]

T = TypeVar("T")


@dataclass(frozen=True)
class Received:
    """A message handed to you. Call :meth:`ack` once you have handled it."""

    message_id: str
    sender: str
    to: str
    kind: str
    text: str
    summary: str | None
    created_at: float
    attempt: int
    session: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _client: Client | None = field(default=None, repr=False, compare=False)

    async def ack(self) -> None:
        if self._client is None:
            raise InvalidRequest("this message is not bound to a client")
        await self._client.ack([self.message_id])

    @classmethod
    def from_json(cls, data: dict[str, Any], client: Client | None) -> Received:
        return cls(
            message_id=data["message_id"],
            sender=data["from"],
            to=data["to"],
            kind=data["kind"],
            text=data["text"],
            summary=data.get("summary"),
            created_at=data["created_at"],
            attempt=data["attempt"],
            session=data.get("session"),
            meta=dict(data.get("meta") or {}),
            _client=client,
        )


class Client(ABC):
    """What the SDK offers; the same over HTTP and in-process."""

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        return None

    @abstractmethod
    async def close(self) -> None: ...

    # administrator
    @abstractmethod
    async def create_team(
        self, name: str, settings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Create a team; the answer carries ``user_token``, shown only once."""

    @abstractmethod
    async def add_member(
        self, team: str, name: str, kind: str = "llm", delivery: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Add a member; the answer carries its ``token``, shown only once."""

    # members
    @abstractmethod
    async def members(self, team: str | None = None) -> list[dict[str, Any]]: ...

    @abstractmethod
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
    ) -> dict[str, Any]:
        """Send as the authenticated member (from ``from_session``'s turn, if given).
        A send from a turn opens a link to the recipient unless ``link=False``.
        Returns ``{"message_id", "status", "recipients"}``."""

    @abstractmethod
    async def receive(
        self,
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
    ) -> list[Received]:
        """Lease up to ``limit`` messages, waiting up to ``wait`` s for the first (for
        ``lease`` seconds; with ``pinned_only``, only those pinned to ``session``)."""

    @abstractmethod
    async def pending(self) -> int:
        """How many of your messages are not acked yet."""

    @abstractmethod
    async def list_sessions(self, member: str | None = None) -> list[dict[str, Any]]:
        """Sessions of your team (or of one member)."""

    @abstractmethod
    async def ack(self, message_ids: Sequence[str]) -> dict[str, Any]: ...

    async def release(self, message_ids: Sequence[str]) -> int:
        """Give leased messages back at once instead of at the lease's end."""
        raise NotImplementedError(f"{type(self).__name__} cannot release messages")

    @abstractmethod
    async def status(self, message_id: str) -> dict[str, Any]:
        """Delivery state and history of a message you sent or received."""

    # sessions and turns
    @abstractmethod
    async def open_session(self, session_id: str | None = None) -> dict[str, Any]:
        """Open a session, or resume ``session_id`` (same state, links and timers)."""

    @abstractmethod
    async def report_event(
        self, session_id: str, kind: str, text: str = "", data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Report ``turn_start``, ``thought``, ``tool_call``, ``tool_result``,
        ``agent_output`` or ``agent_stop`` (its text is the closing text, routed)."""

    async def turn_start(self, session_id: str, text: str = "") -> dict[str, Any]:
        return await self.report_event(session_id, "turn_start", text)

    async def agent_stop(self, session_id: str, text: str) -> dict[str, Any]:
        return await self.report_event(session_id, "agent_stop", text)

    @abstractmethod
    async def terminate_session(self, session_id: str, reason: str = "") -> dict[str, Any]: ...

    @abstractmethod
    async def session_data(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
    ) -> dict[str, Any]:
        """A teammate's transcript, paged and capped (``get_session_data``)."""

    @abstractmethod
    async def react(self, message_id: str, emoji: str) -> None: ...

    @abstractmethod
    async def set_timer(
        self,
        intent: str,
        minutes: float,
        note: str,
        target: str | None = None,
        *,
        session: str | None = None,
    ) -> dict[str, Any]:
        """Set a heartbeat: ``anchor``, ``check`` (target peer) or ``wait`` (target peer)."""

    @abstractmethod
    async def cancel_timer(self, timer_id: int) -> dict[str, Any]: ...

    @abstractmethod
    async def timers(self, *, session: str | None = None) -> list[dict[str, Any]]:
        """Pending timers of your team (or of one session)."""

    @abstractmethod
    async def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> dict[str, Any]:
        """Call ``to`` as an asynchronous tool from your open turn; returns at once,
        pending. The answer arrives as a ``tool_result`` message."""

    @abstractmethod
    async def delegations(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    async def links(self, *, open_only: bool = False) -> list[dict[str, Any]]:
        """Your team's links: peers, turns used of the budget, state, why closed."""

    async def inbox(
        self, *, session: str | None = None, wait: float = 30.0, batch: int = 32
    ) -> AsyncIterator[Received]:
        """Yield messages as they arrive (pushed: a waiting receiver wakes on commit)."""
        while True:
            for msg in await self.receive(limit=batch, wait=wait, session=session):
                yield msg


def _member_json(m: Member) -> dict[str, Any]:
    return {"team": m.team, "name": m.name, "kind": m.kind.value, "created_at": m.created_at}


class LocalClient(Client):
    """A hub running in this process on a store. ``token=None`` acts as administrator."""

    def __init__(self, hub: Hub, token: str | None, *, own_hub: bool) -> None:
        self.hub = hub
        self._token = token
        self._own = own_hub
        self._me: Member | None = None

    async def start(self) -> None:
        await self.hub.start()
        if self._token is not None:
            self._me = await self.hub.authenticate(self._token)
            if self._me is None:
                raise Unauthorized("invalid token: no member of any team has it")

    async def close(self) -> None:
        if self._own:
            await self.hub.close()

    def _member(self) -> Member:
        if self._me is None:
            raise Unauthorized("this call acts as a member: connect with a member token")
        if self._me.token_hash in self.hub.revoked:
            raise Unauthorized("this token was rotated or its member removed; use the new token")
        return self._me

    def _admin(self) -> None:
        if self._token is not None:
            raise errors.Forbidden(
                "this call needs the administrator: connect without a member token"
            )

    async def create_team(
        self, name: str, settings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._admin()
        team, token = await self.hub.create_team(name, settings=settings)
        return {"name": team.name, "created_at": team.created_at, "user_token": token}

    async def add_member(
        self, team: str, name: str, kind: str = "llm", delivery: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._admin()
        member, token = await self.hub.add_member(team, name, kind, delivery=delivery)
        return {**_member_json(member), "token": token}

    async def members(self, team: str | None = None) -> list[dict[str, Any]]:
        if self._me is not None:
            if team not in (None, self._me.team):
                raise errors.UnknownTeam(f"unknown team {team!r}", team=team)
            team = self._me.team
        if team is None:
            raise InvalidRequest("name the team whose members you want")
        return [_member_json(m) for m in await self.hub.list_members(team)]

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
    ) -> dict[str, Any]:
        me = self._member()
        result = await self.hub.send(
            me.team,
            me.name,
            to,
            text,
            summary=summary,
            message_id=message_id,
            to_session=session,
            sender_session=from_session,
            link=link,
            close_link=close_link,
            link_budget=link_budget,
        )
        return {**result.to_json(), "replayed": result.replayed}

    async def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> dict[str, Any]:
        me = self._member()
        d = await self.hub.delegate(
            me.team, me.name, session, to, task, timeout_s=timeout_s, tool_use_id=tool_use_id
        )
        return d.to_json()

    async def delegations(self) -> list[dict[str, Any]]:
        me = self._member()
        return [d.to_json() for d in await self.hub.list_delegations(me.team)]

    async def set_timer(
        self,
        intent: str,
        minutes: float,
        note: str,
        target: str | None = None,
        *,
        session: str | None = None,
    ) -> dict[str, Any]:
        me = self._member()
        timer = await self.hub.set_timer(
            me.team, me.name, session, intent, minutes * 60, note, target
        )
        return timer.to_json(self.hub.clock.now())

    async def cancel_timer(self, timer_id: int) -> dict[str, Any]:
        me = self._member()
        return (await self.hub.cancel_timer(me.team, me.name, timer_id)).to_json()

    async def timers(self, *, session: str | None = None) -> list[dict[str, Any]]:
        me = self._member()
        now = self.hub.clock.now()
        return [t.to_json(now) for t in await self.hub.list_timers(me.team, session_id=session)]

    async def links(self, *, open_only: bool = False) -> list[dict[str, Any]]:
        me = self._member()
        return [link.to_json() for link in await self.hub.list_links(me.team, open_only=open_only)]

    async def open_session(self, session_id: str | None = None) -> dict[str, Any]:
        me = self._member()
        return session_json(await self.hub.open_session(me.team, me.name, session_id))

    async def report_event(
        self, session_id: str, kind: str, text: str = "", data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        me = self._member()
        return await self.hub.report_event(me.team, me.name, session_id, kind, text, data)

    async def terminate_session(self, session_id: str, reason: str = "") -> dict[str, Any]:
        me = self._member()
        return session_json(await self.hub.terminate_session(me.team, me.name, session_id, reason))

    async def session_data(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
    ) -> dict[str, Any]:
        me = self._member()
        return await self.hub.get_session_data(
            me.team, session_id, since=since, until=until, tail_chars=tail_chars
        )

    async def react(self, message_id: str, emoji: str) -> None:
        me = self._member()
        await self.hub.react(me.team, me.name, message_id, emoji)

    async def receive(
        self,
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
    ) -> list[Received]:
        me = self._member()
        got = await self.hub.receive(
            me.team,
            me.name,
            session=session,
            limit=limit,
            wait=wait,
            lease_seconds=lease,
            pinned_only=pinned_only,
        )
        return [Received.from_json(m.to_json(), self) for m in got]

    async def pending(self) -> int:
        me = self._member()
        return await self.hub.pending(me.team, me.name)

    async def list_sessions(self, member: str | None = None) -> list[dict[str, Any]]:
        me = self._member()
        return [session_json(s) for s in await self.hub.list_sessions(me.team, member)]

    async def ack(self, message_ids: Sequence[str]) -> dict[str, Any]:
        me = self._member()
        result = await self.hub.ack(me.team, me.name, list(message_ids))
        return {"acked": len(result.acked), "not_held": list(result.not_held)}

    async def release(self, message_ids: Sequence[str]) -> int:
        me = self._member()
        return await self.hub.release(me.team, me.name, list(message_ids))

    async def status(self, message_id: str) -> dict[str, Any]:
        me = self._member()
        return (await self.hub.message_status(me.team, message_id, viewer=me.name)).to_json()


_ERRORS: dict[str, type[BackchannelError]] = {
    cls.code: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, BackchannelError)
}


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()["error"]
        code, message = body.pop("code"), body.pop("message")
    except (ValueError, KeyError, TypeError):
        raise PeerError(
            f"hub answered {resp.status_code} without a backchannel error body: {resp.text[:200]}"
        ) from None
    raise _ERRORS.get(code, BackchannelError)(message, **body)


class HttpClient(Client):
    """A hub over its HTTP API v1."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=5.0)
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, wait: float = 0.0, **kw: Any) -> Any:
        timeout = httpx.Timeout(wait + 30.0, connect=5.0)
        try:
            resp = await self._http.request(method, path, timeout=timeout, **kw)
        except httpx.TransportError as exc:
            raise PeerError(
                f"cannot reach the hub at {self.url}: {exc}; is `backchannel serve` running?"
            ) from exc
        _raise_for(resp)
        return resp.json()

    async def create_team(
        self, name: str, settings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if settings:
            body["settings"] = settings
        result: dict[str, Any] = await self._call("POST", "/v1/teams", json=body)
        return result

    async def add_member(
        self, team: str, name: str, kind: str = "llm", delivery: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "kind": kind}
        if delivery:
            body["delivery"] = delivery
        result: dict[str, Any] = await self._call("POST", f"/v1/teams/{team}/members", json=body)
        return result

    async def members(self, team: str | None = None) -> list[dict[str, Any]]:
        if team is None:
            me = await self._call("GET", "/v1/me")
            team = me["team"]
        result = await self._call("GET", f"/v1/teams/{team}/members")
        members: list[dict[str, Any]] = result["members"]
        return members

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
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"to": to, "text": text, "link": link, "close_link": close_link}
        for key, value in (
            ("summary", summary),
            ("message_id", message_id),
            ("session", session),
            ("from_session", from_session),
            ("link_budget", link_budget),
        ):
            if value is not None:
                body[key] = value
        result: dict[str, Any] = await self._call("POST", "/v1/messages", json=body)
        return result

    async def set_timer(
        self,
        intent: str,
        minutes: float,
        note: str,
        target: str | None = None,
        *,
        session: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "intent": intent,
            "minutes": minutes,
            "note": note,
            "target": target,
            "session": session,
        }
        result: dict[str, Any] = await self._call("POST", "/v1/timers", json=body)
        return result

    async def cancel_timer(self, timer_id: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("DELETE", f"/v1/timers/{timer_id}")
        return result

    async def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "to": to,
            "task": task,
            "timeout_s": timeout_s,
            "session": session,
            "tool_use_id": tool_use_id,
        }
        result: dict[str, Any] = await self._call("POST", "/v1/delegations", json=body)
        return result

    async def delegations(self) -> list[dict[str, Any]]:
        result = await self._call("GET", "/v1/delegations")
        found: list[dict[str, Any]] = result["delegations"]
        return found

    async def timers(self, *, session: str | None = None) -> list[dict[str, Any]]:
        params = {"session": session} if session else {}
        result = await self._call("GET", "/v1/timers", params=params)
        timers: list[dict[str, Any]] = result["timers"]
        return timers

    async def links(self, *, open_only: bool = False) -> list[dict[str, Any]]:
        result = await self._call("GET", "/v1/links", params={"open_only": open_only})
        links: list[dict[str, Any]] = result["links"]
        return links

    async def open_session(self, session_id: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/v1/sessions", json={"session_id": session_id}
        )
        return result

    async def report_event(
        self, session_id: str, kind: str, text: str = "", data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST",
            f"/v1/sessions/{session_id}/events",
            json={"kind": kind, "text": text, "data": data or {}},
        )
        return result

    async def terminate_session(self, session_id: str, reason: str = "") -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"/v1/sessions/{session_id}/terminate", json={"reason": reason}
        )
        return result

    async def session_data(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since}
        if until is not None:
            params["until"] = until
        if tail_chars is not None:
            params["tail_chars"] = tail_chars
        result: dict[str, Any] = await self._call(
            "GET", f"/v1/sessions/{session_id}/transcript", params=params
        )
        return result

    async def react(self, message_id: str, emoji: str) -> None:
        await self._call("POST", f"/v1/messages/{message_id}/reactions", json={"emoji": emoji})

    async def receive(
        self,
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
    ) -> list[Received]:
        params: dict[str, Any] = {"limit": limit, "wait": wait, "pinned_only": pinned_only}
        if session is not None:
            params["session"] = session
        if lease is not None:
            params["lease"] = lease
        result = await self._call("GET", "/v1/inbox", params=params, wait=wait)
        return [Received.from_json(m, self) for m in result["messages"]]

    async def pending(self) -> int:
        return int((await self._call("GET", "/v1/inbox/pending"))["pending"])

    async def list_sessions(self, member: str | None = None) -> list[dict[str, Any]]:
        params = {"member": member} if member else {}
        result = await self._call("GET", "/v1/sessions", params=params)
        sessions: list[dict[str, Any]] = result["sessions"]
        return sessions

    async def ack(self, message_ids: Sequence[str]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/v1/inbox/ack", json={"message_ids": list(message_ids)}
        )
        return result

    async def release(self, message_ids: Sequence[str]) -> int:
        result = await self._call(
            "POST", "/v1/inbox/release", json={"message_ids": list(message_ids)}
        )
        return int(result["released"])

    async def status(self, message_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/v1/messages/{message_id}")
        return result


def connect(url: str, token: str | None = None, **hub_options: Any) -> Client:
    """A client for a hub at ``url`` (``http(s)://``) or a store opened in-process
    (``sqlite:///path``, ``postgresql://...``, ``memory://``). Use it with ``async with``."""
    if url.startswith(("http://", "https://")):
        return HttpClient(url, token)
    hub = Hub(open_store(url), **hub_options)
    return LocalClient(hub, token, own_hub=True)


def attach(hub: Hub, token: str | None = None) -> Client:
    """A client for a hub this process already runs (it is not closed with the client)."""
    return LocalClient(hub, token, own_hub=False)


class SyncClient:
    """The same calls without ``await``, for scripts. Runs an event loop in a thread."""

    def __init__(self, url: str, token: str | None = None, **hub_options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = connect(url, token, **hub_options)
        self._run(self._client.start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wrap(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
        def call(*args: Any, **kwargs: Any) -> T:
            async def run() -> T:
                return await fn(*args, **kwargs)

            return self._run(run())

        return call

    def create_team(self, name: str) -> dict[str, Any]:
        return self._wrap(self._client.create_team)(name)

    def add_member(self, team: str, name: str, kind: str = "llm") -> dict[str, Any]:
        return self._wrap(self._client.add_member)(team, name, kind)

    def members(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._wrap(self._client.members)(team)

    def send(self, to: str, text: str, **kwargs: Any) -> dict[str, Any]:
        return self._wrap(self._client.send)(to, text, **kwargs)

    def receive(self, **kwargs: Any) -> list[Received]:
        return self._wrap(self._client.receive)(**kwargs)

    def ack(self, message_ids: Sequence[str]) -> dict[str, Any]:
        return self._wrap(self._client.ack)(message_ids)

    def status(self, message_id: str) -> dict[str, Any]:
        return self._wrap(self._client.status)(message_id)

    def open_session(self, session_id: str | None = None) -> dict[str, Any]:
        return self._wrap(self._client.open_session)(session_id)

    def report_event(
        self, session_id: str, kind: str, text: str = "", data: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return self._wrap(self._client.report_event)(session_id, kind, text, data)

    def session_data(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        return self._wrap(self._client.session_data)(session_id, **kwargs)


def connect_sync(url: str, token: str | None = None, **hub_options: Any) -> SyncClient:
    """:func:`connect` for scripts: ``with connect_sync(url, token) as hub: hub.send(...)``."""
    return SyncClient(url, token, **hub_options)
