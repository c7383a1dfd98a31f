"""The same client without ``await``, for scripts: :class:`SyncClient` runs a
:class:`~backchannel.client.Client` on an event loop in a thread of its own. Its methods
are the async client's, one for one (a test holds them equal)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, TypeVar

from backchannel.client._async import Client
from backchannel.client._transport import RETRY_WITHIN, Transport
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
    HookResult,
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
    Reaction,
    Received,
    Removal,
    Sent,
    SentBatch,
    SessionInfo,
    SessionList,
    TeamCreated,
    TeamList,
    TeamRef,
    Timer,
    TokenRotated,
    ToolResponseAccepted,
    Traffic,
    Transcript,
)

if TYPE_CHECKING:
    from backchannel.hub import Hub

T = TypeVar("T")


class SyncClient:
    """:class:`~backchannel.client.Client`'s calls without ``await``.
    ``SyncClient(url, token)`` picks the transport by the URL, as the async client does."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry_within: float = RETRY_WITHIN,
        **hub_options: Any,
    ) -> None:
        self._setup(
            lambda: Client(url, token, timeout=timeout, retry_within=retry_within, **hub_options)
        )

    @classmethod
    def local(cls, hub: Hub, token: str | None = None) -> SyncClient:
        """A client of ``hub`` (not closed with the client). The hub runs on this
        client's own event loop: give it a hub no other loop has started."""
        client = cls.__new__(cls)
        client._setup(lambda: Client.local(hub, token))
        return client

    @classmethod
    def over(cls, transport: Transport) -> SyncClient:
        """A client whose calls ``transport`` carries."""
        client = cls.__new__(cls)
        client._setup(lambda: Client.over(transport))
        return client

    def _setup(self, make: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._async: Client = make()
        try:
            self._run(self._async.start())
        except BaseException:
            self._stop()
            raise

    def _run(
        self,
        coro: Coroutine[Any, Any, T],
        given_back: Callable[[T], Coroutine[Any, Any, Any]] | None = None,
    ) -> T:
        """``coro``'s result, run on the client's loop. ``given_back``: what gives back
        the result of a call that leases, when the caller is stopped (Ctrl-C) once the
        call had its answer but before the caller took it."""
        running: list[asyncio.Task[T]] = []

        async def owned() -> T:
            running.append(asyncio.ensure_future(coro))
            return await running[0]

        call = asyncio.run_coroutine_threadsafe(owned(), self._loop)
        try:
            # waited for in slices: the kernel hands a process's SIGINT to any of its
            # threads, and one taken by another thread wakes no caller blocked on a lock
            # (Ctrl-C would do nothing until a long-poll's whole wait was over); between
            # slices the interpreter runs the signal's handler here
            while not concurrent.futures.wait((call,), timeout=SIGNAL_SLICE).done:
                pass
            return call.result()
        except BaseException:
            # the caller was stopped while it waited (Ctrl-C, another signal's handler
            # raising): the call is called off and over before this returns, not left
            # running in the client's thread, where a long-poll would lease messages to
            # nobody until their lease ended (and an iterator closed meanwhile would be
            # found still running). Scheduled after ``owned``, so its task exists.
            if not call.done():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(_called_off(running), self._loop).result(
                        CALL_OFF_WITHIN
                    )
                    concurrent.futures.wait((call,), timeout=CALL_OFF_WITHIN)
            # the call had its answer (before the signal, or as it was called off): the
            # messages it leased are given back at once, not left to the lease's end
            if given_back is not None and call.done() and not call.cancelled():
                with contextlib.suppress(Exception):
                    if call.exception() is None:
                        asyncio.run_coroutine_threadsafe(
                            given_back(call.result()), self._loop
                        ).result(CALL_OFF_WITHIN)
            raise

    def _iterate(
        self,
        items: AsyncIterator[T],
        given_back: Callable[[T], Coroutine[Any, Any, Any]] | None = None,
    ) -> Iterator[T]:
        steps: list[asyncio.Task[Any]] = []

        async def step() -> T:
            steps[:] = [t] if (t := asyncio.current_task()) is not None else []
            return await anext(items)

        try:
            while True:
                try:
                    yield self._run(step(), given_back)
                except StopAsyncIteration:
                    return
        finally:
            self._run(_aclose(items, steps))

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def start(self) -> None:
        """Nothing to do: a sync client starts when it is made (kept so the two
        clients have the same calls)."""

    def close(self) -> None:
        try:
            self._run(self._async.close())
        finally:
            self._stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def me(self) -> Me:
        """Who this client acts as: the administrator, or a member of a team."""
        return self._run(self._async.me())

    def create_team(self, name: str, settings: Mapping[str, Any] | None = None) -> TeamCreated:
        """Create a team; the answer carries ``user_token``, shown only once."""
        return self._run(self._async.create_team(name, settings))

    def teams(self, *, after: str | None = None, limit: int | None = None) -> list[TeamRef]:
        """The teams (administrator), or your own, by name: at most ``limit`` after the
        name ``after`` (every one when ``limit`` is None, read a bounded page at a time)."""
        return self._run(self._async.teams(after=after, limit=limit))

    def team_pages(
        self, *, after: str | None = None, limit: int | None = None
    ) -> Iterator[TeamList]:
        """The pages of the teams until ``limit`` teams (all when None) were given; each
        page's ``next_after`` says where the next starts."""
        return self._iterate(self._async.team_pages(after=after, limit=limit))

    def add_member(
        self,
        team: str,
        name: str,
        kind: str = "llm",
        delivery: Mapping[str, Any] | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberCreated:
        """Add a member; the answer carries its ``token``, shown only once."""
        return self._run(self._async.add_member(team, name, kind, delivery, settings=settings))

    def update_member(
        self,
        team: str,
        name: str,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberUpdated:
        """Change a member's delivery setting or settings (what is not given stays)."""
        return self._run(
            self._async.update_member(team, name, delivery=delivery, settings=settings)
        )

    def members(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[MemberInfo]:
        """The members of ``team`` (a member: of its own team, the default), by name: at
        most ``limit`` after the name ``after`` (every one when ``limit`` is None, read a
        bounded page at a time)."""
        return self._run(self._async.members(team, after=after, limit=limit))

    def member_pages(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> Iterator[MemberList]:
        """The pages of ``team``'s members until ``limit`` members (all when None) were
        given; each page's ``next_after`` says where the next starts."""
        return self._iterate(self._async.member_pages(team, after=after, limit=limit))

    def rotate_token(self, team: str, name: str) -> TokenRotated:
        """Give a member a new token (in the answer only); the old one fails at once."""
        return self._run(self._async.rotate_token(team, name))

    def remove_member(self, team: str, name: str, *, reason: str = "") -> Removal:
        """Remove a member: what waits for it becomes dead letters (senders told)."""
        return self._run(self._async.remove_member(team, name, reason=reason))

    def remove_team(self, team: str) -> Removal:
        """Remove a team and everything stored for it."""
        return self._run(self._async.remove_team(team))

    def budgets(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[Budget]:
        """The conversation budgets used in ``team`` (yours by default), by key: at most
        ``limit`` after the key ``after`` (every one when ``limit`` is None, read a
        bounded page at a time)."""
        return self._run(self._async.budgets(team, after=after, limit=limit))

    def budget_pages(
        self, team: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> Iterator[BudgetList]:
        """The pages of ``team``'s used budgets until ``limit`` (all when None) were
        given; each page's ``next_after`` says where the next starts."""
        return self._iterate(self._async.budget_pages(team, after=after, limit=limit))

    def extend_budget(
        self, key: str, by: int, *, team: str | None = None, request_id: str | None = None
    ) -> Budget:
        """Let exactly ``by`` more exchanges (``pair:a|b``) or hops (``chain:<id>``)
        through: the team's human or the administrator only (idempotent on
        ``request_id``, which the client picks when not given)."""
        return self._run(self._async.extend_budget(key, by, team=team, request_id=request_id))

    def team_events(
        self, team: str | None = None, *, after: int = 0, reconnect_within: float | None = None
    ) -> Iterator[Traffic]:
        """The team's live traffic (sends, leases, acks, dead letters) from cursor
        ``after`` on; it never ends by itself. With ``reconnect_within`` (seconds), a
        failed connection is opened again where it stopped, each event once, and the
        stream gives up only after failing that long."""
        return self._iterate(
            self._async.team_events(team, after=after, reconnect_within=reconnect_within)
        )

    def send(
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
        ``message_id``: the same id again answers the first result, ``replayed``."""
        return self._run(
            self._async.send(
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
        )

    def send_batch(self, messages: Sequence[MessageIn | Mapping[str, Any]]) -> SentBatch:
        """Send many messages in one request (each a :class:`MessageIn` or its JSON).
        Each is answered on its own; a bad one loses none of the others."""
        return self._run(self._async.send_batch(messages))

    def status(self, message_id: str) -> MessageReport:
        """Delivery state and history of a message you sent or received."""
        return self._run(self._async.status(message_id))

    def react(self, message_id: str, emoji: str) -> Reaction:
        """React to a message you sent or received (not a send: it crosses no link)."""
        return self._run(self._async.react(message_id, emoji))

    def receive(
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
        Ack each (:meth:`ack`, or ``await msg.ack()``) once handled. The receive is
        named (``receive_id``) as the async client's is."""
        got = self._run(
            self._async.receive(
                limit=limit,
                wait=wait,
                session=session,
                lease=lease,
                pinned_only=pinned_only,
                receive_id=receive_id,
            ),
            self._async._given_back,
        )
        return [m.bind_sync(self.ack) for m in got]

    def ack_and_receive(
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
        not held fail nothing); ``messages`` are what was leased."""
        got = self._run(
            self._async.ack_and_receive(
                ack,
                limit=limit,
                wait=wait,
                session=session,
                lease=lease,
                pinned_only=pinned_only,
                receive_id=receive_id,
            ),
            lambda got: self._async._given_back(got.messages),
        )
        for m in got.messages:
            m.bind_sync(self.ack)
        return got

    def inbox(
        self, *, session: str | None = None, wait: float = 30.0, batch: int = 32
    ) -> Iterator[Received]:
        """Yield messages as they arrive (pushed: a waiting receiver wakes on commit)."""
        items = self._async.inbox(session=session, wait=wait, batch=batch)
        for m in self._iterate(items, lambda m: self._async._given_back([m])):
            yield m.bind_sync(self.ack)

    def pending(self) -> int:
        """How many of your messages are not acked yet."""
        return self._run(self._async.pending())

    def ack(self, message_ids: Sequence[str]) -> Acked:
        """Ack messages you hold; ``not_held`` names those you did not."""
        return self._run(self._async.ack(message_ids))

    def ack_batch(self, message_ids: Sequence[str]) -> AckedBatch:
        """Ack many ids, each answered on its own (``acked``, ``not_held``, ``invalid``)."""
        return self._run(self._async.ack_batch(message_ids))

    def release(self, message_ids: Sequence[str]) -> int:
        """Give leased messages back at once instead of at the lease's end."""
        return self._run(self._async.release(message_ids))

    def give_up(self, message_ids: Sequence[str], reason: str) -> int:
        """Give up for good on leased messages you will never handle: each is dead with
        ``reason`` and its sender is told."""
        return self._run(self._async.give_up(message_ids, reason))

    def open_session(self, session_id: str | None = None) -> SessionInfo:
        """Open a session, or resume ``session_id`` (same state, links and timers)."""
        return self._run(self._async.open_session(session_id))

    def list_sessions(
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
        None, read a bounded page at a time)."""
        return self._run(
            self._async.list_sessions(
                member, active_only=active_only, live_only=live_only, after=after, limit=limit
            )
        )

    def session_pages(
        self,
        member: str | None = None,
        *,
        active_only: bool = False,
        live_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> Iterator[SessionList]:
        """The pages of your team's sessions (or one member's; with ``active_only``,
        those whose turn runs now; with ``live_only``, those not terminated) until
        ``limit`` sessions (all when None) were given; each page's ``next_after`` says
        where the next starts."""
        return self._iterate(
            self._async.session_pages(
                member, active_only=active_only, live_only=live_only, after=after, limit=limit
            )
        )

    def session(self, session_id: str) -> SessionInfo:
        """One session of your team."""
        return self._run(self._async.session(session_id))

    def report_event(
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
        Idempotent on ``request_id`` (the client picks one when not given)."""
        return self._run(
            self._async.report_event(session_id, kind, text, data, request_id=request_id)
        )

    def turn_start(self, session_id: str, text: str = "") -> EventAnswer:
        return self._run(self._async.turn_start(session_id, text))

    def agent_stop(self, session_id: str, text: str) -> EventAnswer:
        return self._run(self._async.agent_stop(session_id, text))

    def runtime_alive(self, runtime: str) -> Alive:
        """Runtime process ``runtime`` of yours is alive: your live sessions under it are."""
        return self._run(self._async.runtime_alive(runtime))

    def terminate_session(self, session_id: str, reason: str = "") -> SessionInfo:
        return self._run(self._async.terminate_session(session_id, reason))

    def session_data(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
        max_chars: int = 20_000,
    ) -> Transcript:
        """A teammate's transcript, paged and capped (``get_session_data``)."""
        return self._run(
            self._async.session_data(
                session_id, since=since, until=until, tail_chars=tail_chars, max_chars=max_chars
            )
        )

    def links(
        self,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        """Your team's links: peers, turns used of the budget, state, why closed; in the
        order they opened, at most ``limit`` after link ``after`` (every one when
        ``limit`` is None, read a bounded page at a time)."""
        return self._run(
            self._async.links(member=member, open_only=open_only, after=after, limit=limit)
        )

    def link_pages(
        self,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> Iterator[LinkList]:
        """The pages of your team's links until ``limit`` links (all when None) were
        given; each page's ``next_after`` says where the next one starts."""
        return self._iterate(
            self._async.link_pages(member=member, open_only=open_only, after=after, limit=limit)
        )

    def link(self, link_id: str) -> Link:
        return self._run(self._async.link(link_id))

    def set_timer(
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
        ``seconds``. Idempotent on ``request_id`` (the client picks one when not given)."""
        return self._run(
            self._async.set_timer(
                intent,
                minutes,
                note,
                target,
                seconds=seconds,
                session=session,
                request_id=request_id,
            )
        )

    def timer(self, timer_id: int) -> Timer:
        """One timer of your team (pending, fired or cancelled), its note whole."""
        return self._run(self._async.timer(timer_id))

    def cancel_timer(self, timer_id: int) -> Timer:
        return self._run(self._async.cancel_timer(timer_id))

    def timers(
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
        ``limit`` is None, read a bounded page at a time)."""
        return self._run(
            self._async.timers(member=member, session=session, all=all, after=after, limit=limit)
        )

    def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> Delegation:
        """Call ``to`` as an asynchronous tool from your open turn; returns at once,
        pending. The answer arrives as a ``tool_result`` message."""
        return self._run(
            self._async.delegate(
                to, task, timeout_s=timeout_s, session=session, tool_use_id=tool_use_id
            )
        )

    def delegations(
        self,
        *,
        member: str | None = None,
        pending_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Delegation]:
        """The delegations you made or were asked (``pending_only``: those still waiting
        for their answer), in the order they were made: at most ``limit`` after delegation
        ``after`` (every one when ``limit`` is None, read a bounded page at a time)."""
        return self._run(
            self._async.delegations(
                member=member, pending_only=pending_only, after=after, limit=limit
            )
        )

    def delegation_pages(
        self,
        *,
        member: str | None = None,
        pending_only: bool = False,
        after: str | None = None,
        limit: int | None = None,
    ) -> Iterator[DelegationList]:
        """The pages of your delegations until ``limit`` delegations (all when None) were
        given; each page's ``next_after`` says where the next starts."""
        return self._iterate(
            self._async.delegation_pages(
                member=member, pending_only=pending_only, after=after, limit=limit
            )
        )

    def delegation(self, delegation_id: str) -> Delegation:
        return self._run(self._async.delegation(delegation_id))

    def chat(
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
        return self._run(
            self._async.chat(
                agent,
                message,
                reply_service=reply_service,
                reply_token=reply_token,
                session_id=session_id,
                tool_use_id=tool_use_id,
                timeout_s=timeout_s,
                chain=chain,
            )
        )

    def tool_response(
        self, reply_token: str, result: Any, *, chain: Mapping[str, Any] | None = None
    ) -> ToolResponseAccepted:
        """As a callee hub: answer a delegation with the one-time ``reply_token``.
        ``chain`` (``{"id", "hop"}``): the conversation chain the answer goes on in."""
        return self._run(self._async.tool_response(reply_token, result, chain=chain))

    def hook(self, runtime: str, payload: Any, *, expect: str | None = None) -> HookResult:
        """A runtime's hook call (``claude-code``, ``codex``, ``gemini``): its own hook
        JSON in, its own hook output JSON out. ``expect`` (``TEAM/MEMBER``) refuses,
        with no effect, a token of any other member. A payload it cannot use answers
        ``{}`` with the ``problem``."""
        return self._run(self._async.hook(runtime, payload, expect=expect))


#: How long a sync call stopped by a signal waits for its call to be over (closing its
#: connection takes a turn or two of the client's loop).
CALL_OFF_WITHIN = 10.0
#: How long closing a sync ``inbox()`` loop waits for its last step, called off, to end.
STEP_END_WITHIN = 10.0
#: How often a sync call's caller looks for a signal (Ctrl-C) while it waits, in seconds.
SIGNAL_SLICE = 0.2


async def _called_off(running: list[asyncio.Task[Any]]) -> None:
    """Cancel the call in ``running`` and wait until it is over."""
    for task in running:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def _aclose(items: AsyncIterator[Any], steps: Sequence[asyncio.Task[Any]] = ()) -> None:
    """Close ``items`` once its last step (``steps``) is over. A step called off by
    Ctrl-C may still be ending on the client's loop when the caller's ``_run`` gave up
    waiting for it (a loaded machine, a hub slow to hang up): closing the generator under
    it raised ``RuntimeError: aclose(): asynchronous generator is already running``
    instead of the ``KeyboardInterrupt``. A step that never ends leaves it unclosed."""
    if pending := [t for t in steps if not t.done()]:
        await asyncio.wait(pending, timeout=STEP_END_WITHIN)
        if not all(t.done() for t in pending):
            return
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()
