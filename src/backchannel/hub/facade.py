"""The Hub facade: everything that talks to a hub (the SDK, the HTTP API, the CLI, the
MCP server, the runner, the delivery adapters) goes through its methods.

The caller is always already authenticated: the ``sender`` or ``member`` passed in is
the member the token belongs to. The hub builds its parts in the order below, each from
the parts it calls; every public method is one part's method (docs/architecture.md
draws the parts and the arrows between them).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from backchannel.callbacks import CallbackConfig
from backchannel.core import messages as rules
from backchannel.errors import InvalidRequest
from backchannel.hub.admin import Admin, Removal
from backchannel.hub.budgets import Budgets
from backchannel.hub.context import Env, HubConfig, HubMiddleware
from backchannel.hub.delegations import Delegations
from backchannel.hub.inbox import InboxFiles, TakeResult
from backchannel.hub.links import Links
from backchannel.hub.maintenance import DEFAULT_RETENTION, Maintenance
from backchannel.hub.members import Members, hash_token, new_token
from backchannel.hub.messages import (
    AckResult,
    FeedItem,
    Leased,
    Messages,
    MessageStatus,
    Outgoing,
)
from backchannel.hub.outbox import Outbox
from backchannel.hub.pipeline import Pipeline
from backchannel.hub.quotas import Quotas
from backchannel.hub.sessions import Sessions, session_json
from backchannel.hub.timers import Timer, Timers
from backchannel.hub.turns import StopResult, Turns
from backchannel.stores.base import Store
from backchannel.types import Clock, SystemClock

__all__ = [
    "AckResult",
    "FeedItem",
    "Hub",
    "HubMiddleware",
    "Leased",
    "MessageStatus",
    "Outgoing",
    "Removal",
    "StopResult",
    "TakeResult",
    "Timer",
    "hash_token",
    "new_token",
    "session_json",
]

P = ParamSpec("P")
R = TypeVar("R")


class _Delegate(Generic[P, R]):
    """A facade method that is the method of the same name on one of the hub's parts
    (typed as that method, so callers see its exact signature)."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.name = self.attr = method.__name__
        self.__doc__ = method.__doc__

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, hub: None, owner: type) -> Self: ...
    @overload
    def __get__(self, hub: object, owner: type) -> Callable[P, R]: ...
    def __get__(self, hub: object, owner: type) -> Self | Callable[P, R]:
        if hub is None:
            return self
        method: Callable[P, R] = getattr(getattr(hub, self.part), self.name)
        # kept on the hub: the next look-up finds it there, not here (the parts are
        # set once, in the hub's constructor)
        vars(hub)[self.attr] = method
        return method


class Hub:
    """A message hub on a store. Use as ``async with Hub(store) as hub:``.

    ``callbacks`` is the callback registry (where delegation answers and webhooks may
    go); by default it is read from the environment.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        max_text: int = rules.DEFAULT_MAX_TEXT,
        middleware: Iterable[HubMiddleware] = (),
        background: bool = True,
        check_delivery: bool = True,
        retention_seconds: float | None = DEFAULT_RETENTION,
        callbacks: CallbackConfig | None = None,
    ) -> None:
        if not lease_seconds > 0 or not math.isfinite(lease_seconds):  # NaN: not > 0
            raise InvalidRequest("lease_seconds must be a number of seconds above 0")
        if max_attempts < 1:
            raise InvalidRequest("max_attempts must be at least 1")
        if retention_seconds is not None and retention_seconds <= 0:
            raise InvalidRequest("retention_seconds must be positive (or None to keep all)")
        config = HubConfig(lease_seconds, max_attempts, max_text)
        env = Env(store, clock or SystemClock(), config, middleware)
        env.hub = self
        # The parts, in the order they are built: each names the parts it calls. The
        # pipeline comes first (every part sends through it) and is connected to the
        # parts that react to a send, a lease, a turn or a tick once they exist.
        self.pipeline = Pipeline(env)
        self.quotas = Quotas()
        self.members = Members(env, self.quotas, check_delivery=check_delivery)
        self.messages = Messages(env, self.quotas, self.pipeline)
        self.sessions = Sessions(env, self.pipeline)
        self.turns = Turns(env, self.sessions, self.quotas, self.pipeline)
        self.links = Links(env, self.pipeline)
        self.timers = Timers(env, self.sessions, self.quotas, self.pipeline)
        self.outbox = Outbox(env, self.pipeline, callbacks)
        self.delegations = Delegations(env, self.timers, self.quotas, self.outbox, self.pipeline)
        self.budgets = Budgets(env, self.links, self.pipeline)
        self.inbox_files = InboxFiles(env, self.pipeline)
        self.admin = Admin(
            env, self.members, self.quotas, self.messages, self.sessions, self.links,
            self.pipeline,
        )  # fmt: skip
        self.maintenance = Maintenance(env, self.messages, self.pipeline, retention_seconds)
        self.pipeline.connect(
            sessions=self.sessions, turns=self.turns, links=self.links, timers=self.timers,
            outbox=self.outbox, delegations=self.delegations, budgets=self.budgets,
        )  # fmt: skip

        self.env = env
        self.store = store
        self.clock = env.clock
        self.config = config
        self.middleware = env.middleware
        self.callbacks = self.outbox.callbacks
        self.push_circuits = env.push_circuits
        self.delivery_checks = self.members.delivery_checks
        self.watch_revocation = self.admin.watch_revocation
        self._waiters = env.waiters
        self._background = background
        self._maint_task: asyncio.Task[None] | None = None
        self._started = False

    @property
    def retention_seconds(self) -> float | None:
        return self.maintenance.retention_seconds

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        await self.store.open()
        try:
            await self.maintenance.check_clock(starting=True)
        except BaseException:
            await self.store.close()
            raise
        self.store.on_external_change(self.maintenance.on_external_change)
        self.store.on_external_change(self.admin.on_external_change)
        self.store.on_external_change(self.messages.on_external_change)
        self._started = True
        if self._background:
            self._maint_task = asyncio.create_task(self.maintenance.loop(), name="bc-maintenance")

    async def close(self) -> None:
        await self.outbox.close()
        if self._maint_task is not None:
            self._maint_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maint_task
            self._maint_task = None
        await self.admin.close()
        self._waiters.notify(None, None)
        await self.store.close()
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- teams and members ----------------------------------------------------------------
    create_team = _Delegate("members", Members.create_team)
    get_team = _Delegate("members", Members.get_team)
    list_teams = _Delegate("members", Members.list_teams)
    count_teams = _Delegate("members", Members.count_teams)
    add_member = _Delegate("members", Members.add_member)
    update_member = _Delegate("members", Members.update_member)
    list_members = _Delegate("members", Members.list_members)
    get_member = _Delegate("members", Members.get_member)
    authenticate = _Delegate("members", Members.authenticate)
    member_of_token = _Delegate("members", Members.member_of_token)
    # -- credentials and removal --------------------------------------------------------------
    rotate_token = _Delegate("admin", Admin.rotate_token)
    remove_member = _Delegate("admin", Admin.remove_member)
    remove_team = _Delegate("admin", Admin.remove_team)
    # -- messages ----------------------------------------------------------------------------
    send = _Delegate("messages", Messages.send)
    send_many = _Delegate("messages", Messages.send_many)
    sending = _Delegate("messages", Messages.sending)
    notice = _Delegate("messages", Messages.notice)
    receive = _Delegate("messages", Messages.receive)
    held = _Delegate("messages", Messages.held)
    held_since = _Delegate("messages", Messages.held_since)
    holding = _Delegate("messages", Messages.holding)
    held_leases = _Delegate("messages", Messages.held_leases)
    open_stream = _Delegate("messages", Messages.open_stream)
    close_stream = _Delegate("messages", Messages.close_stream)
    inbox = _Delegate("messages", Messages.inbox)
    ack = _Delegate("messages", Messages.ack)
    release = _Delegate("messages", Messages.release)
    mark_delivered = _Delegate("messages", Messages.mark_delivered)
    pending = _Delegate("messages", Messages.pending)
    give_up = _Delegate("messages", Messages.give_up)
    first_held = _Delegate("messages", Messages.first_held)
    message_status = _Delegate("messages", Messages.message_status)
    react = _Delegate("messages", Messages.react)
    feed = _Delegate("messages", Messages.feed)
    feed_start = _Delegate("messages", Messages.feed_start)
    feed_removed = _Delegate("messages", Messages.feed_removed)
    dead_letters = _Delegate("messages", Messages.dead_letters)
    watch = _Delegate("messages", Messages.watch)
    # -- sessions and turns -------------------------------------------------------------------
    get_session = _Delegate("sessions", Sessions.get_session)
    list_sessions = _Delegate("sessions", Sessions.list_sessions)
    member_sessions = _Delegate("sessions", Sessions.member_sessions)
    open_session = _Delegate("sessions", Sessions.open_session)
    start_session = _Delegate("sessions", Sessions.start_session)
    exit_session = _Delegate("sessions", Sessions.exit_session)
    terminate_session = _Delegate("sessions", Sessions.terminate_session)
    note_runtime = _Delegate("sessions", Sessions.note_runtime)
    runtime_alive = _Delegate("sessions", Sessions.runtime_alive)
    get_session_data = _Delegate("sessions", Sessions.get_session_data)
    report_event = _Delegate("turns", Turns.report_event)
    forget_stop = _Delegate("turns", Turns.forget_stop)
    settle_handed = _Delegate("turns", Turns.settle_handed)
    # -- links, timers, delegations, budgets ----------------------------------------------------
    list_links = _Delegate("links", Links.list_links)
    links_overview = _Delegate("links", Links.links_overview)
    get_link = _Delegate("links", Links.get_link)
    set_timer = _Delegate("timers", Timers.set_timer)
    get_timer = _Delegate("timers", Timers.get_timer)
    cancel_timer = _Delegate("timers", Timers.cancel_timer)
    list_timers = _Delegate("timers", Timers.list_timers)
    timers_due = _Delegate("timers", Timers.timers_due)
    delegate = _Delegate("delegations", Delegations.delegate)
    list_delegations = _Delegate("delegations", Delegations.list_delegations)
    delegations_overview = _Delegate("delegations", Delegations.delegations_overview)
    get_delegation = _Delegate("delegations", Delegations.get_delegation)
    accept_chat = _Delegate("delegations", Delegations.accept_chat)
    accept_tool_response = _Delegate("delegations", Delegations.accept_tool_response)
    list_budgets = _Delegate("budgets", Budgets.list_budgets)
    budgets_for_human = _Delegate("budgets", Budgets.budgets_for_human)
    extend_budget = _Delegate("budgets", Budgets.extend_budget)
    # -- Claude Code inbox files ------------------------------------------------------------------
    take_inbox_entries = _Delegate("inbox_files", InboxFiles.take_inbox_entries)
    forget_inbox_entries = _Delegate("inbox_files", InboxFiles.forget_inbox_entries)
    skip_inbox_entries = _Delegate("inbox_files", InboxFiles.skip_inbox_entries)
    put_back_inbox_entry = _Delegate("inbox_files", InboxFiles.put_back_inbox_entry)
    lost_inbox_entry = _Delegate("inbox_files", InboxFiles.lost_inbox_entry)
    member_activity = _Delegate("inbox_files", InboxFiles.member_activity)
    member_states = _Delegate("inbox_files", InboxFiles.member_states)
    # -- maintenance --------------------------------------------------------------------------------
    maintain = _Delegate("maintenance", Maintenance.maintain)
    compact = _Delegate("maintenance", Maintenance.compact)
