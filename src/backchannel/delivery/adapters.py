"""The push adapters by ``delivery.type``, and the check of a member's ``delivery`` setting.

=============  ==========================================  ===============================
``type``       adapter                                     module
=============  ==========================================  ===============================
inbox-file     Claude Code team inbox file                 :mod:`.inbox_file`
tmux           typed into an idle tmux pane                :mod:`.tmux`
stdin          stream-json lines on a lead process's stdin :mod:`.stdin`
webhook        signed POST to a registered service         :mod:`.webhook`
=============  ==========================================  ===============================

A member without a ``delivery`` setting, or with one of :data:`PULL_TYPES`, fetches its
messages itself (SDK, long-poll, SSE, a runtime's hooks); the dispatcher leaves it alone.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from backchannel.callbacks import CallbackConfig
from backchannel.delivery.base import (
    DEFAULT_RETRY,
    Adapter,
    AdapterContext,
    PermanentDeliveryError,
)
from backchannel.delivery.claude_inbox import name_problem
from backchannel.delivery.inbox_file import InboxFileAdapter, inbox_clash
from backchannel.delivery.stdin import StdinAdapter
from backchannel.delivery.tmux import TmuxAdapter, check_pane
from backchannel.delivery.tmux import agent_commands as tmux_agent_commands
from backchannel.delivery.webhook import WebhookAdapter
from backchannel.errors import InvalidRequest, UnknownService
from backchannel.hub.checks import DeliveryChecks
from backchannel.types import InboxMessage

__all__ = [
    "ADAPTERS",
    "PULL_TYPES",
    "AdapterFactory",
    "MisconfiguredAdapter",
    "build_adapter",
    "check_delivery_setting",
    "delivery_type",
]

#: Builds a member's adapter from its context; raises ``PermanentDeliveryError``.
AdapterFactory = Callable[[AdapterContext], Adapter]

ADAPTERS: Mapping[str, AdapterFactory] = {
    InboxFileAdapter.type: InboxFileAdapter,
    TmuxAdapter.type: TmuxAdapter,
    StdinAdapter.type: StdinAdapter,
    WebhookAdapter.type: WebhookAdapter,
}

#: ``delivery.type`` values whose member fetches its own messages: not dispatched.
PULL_TYPES = frozenset({"pull", "hook"})


def delivery_type(setting: Mapping[str, Any] | None) -> str:
    """The setting's ``type``: ``"pull"`` when the setting is empty or has none."""
    if not setting:
        return "pull"
    value = setting.get("type", "pull")
    return value if isinstance(value, str) else repr(value)


def check_delivery_setting(
    setting: Mapping[str, Any] | None, *, adapters: Mapping[str, AdapterFactory] = ADAPTERS
) -> None:
    """Refuse a ``delivery`` setting no adapter understands (for ``member add``).

    Checks the type and the options each adapter needs without side effects; what the
    hub that delivers knows (its registered services: :class:`ServiceCheck`) is checked
    where it is registered. Raises :class:`~backchannel.errors.InvalidRequest` naming the fix.
    """
    kind = delivery_type(setting)
    if kind in PULL_TYPES:
        return
    if kind not in adapters:
        choices = ", ".join(sorted({*PULL_TYPES, *adapters}))
        raise InvalidRequest(
            f"unknown delivery type {kind!r}; use one of: {choices}", field="delivery"
        )
    assert setting is not None
    need = {"tmux": "target", "webhook": "service", "stdin": "command"}.get(kind)
    if need is not None and not setting.get(need):
        raise InvalidRequest(
            f"a {kind} delivery needs {need!r}; see docs/adapters/README.md", field="delivery"
        )
    _check_option_types(kind, setting)
    if kind == "inbox-file":
        for what in ("team", "inbox"):
            name = setting.get(what)
            if isinstance(name, str) and (problem := name_problem(what, name)) is not None:
                raise InvalidRequest(problem, field="delivery")
    if kind == "tmux" and "agent_commands" in setting:
        try:
            tmux_agent_commands(setting.get("agent_commands"), "the member")
        except PermanentDeliveryError as exc:
            raise InvalidRequest(exc.message, field="delivery") from None
    if kind == "webhook" and "url" in setting:
        raise InvalidRequest(
            "a webhook delivery names a registered service, never a URL: drop 'url' and "
            "register the URL as a callback service",
            field="delivery",
        )


#: The string and the number options of each stock adapter (``session`` is the
#: dispatcher's, for every type): a setting giving one of another type is refused when
#: it is stored, rather than stored and every message to the member dead-lettered.
_STRING_OPTIONS = {
    "tmux": ("target", "socket_path", "socket_name"),
    "inbox-file": ("root", "team", "inbox", "color"),
    "stdin": ("cwd", "stdout"),
    "webhook": ("service",),
}
_NUMBER_OPTIONS = {"tmux": ("turn_wait", "hold_max"), "stdin": ("turn_wait",)}


def _check_option_types(kind: str, setting: Mapping[str, Any]) -> None:
    """Refuse an option of a stock adapter whose value has the wrong type, naming it."""

    def refuse(key: str, want: str) -> None:
        raise InvalidRequest(
            f"the {kind} delivery option {key!r} must be {want}, got {setting[key]!r}; "
            "correct it in the member's delivery setting (docs/adapters/README.md)",
            field="delivery",
        )

    for key in ("session", *_STRING_OPTIONS.get(kind, ())):
        if setting.get(key) is not None and not isinstance(setting[key], str):
            refuse(key, "a string")
    for key in _NUMBER_OPTIONS.get(kind, ()):
        value = setting.get(key)
        if key in setting and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            refuse(key, "a non-negative number")
    if "hold_max" in setting and setting["hold_max"] == 0:
        refuse("hold_max", "a number of seconds above 0 (default 1800)")
    if kind != "stdin":
        return
    command = setting.get("command")
    if isinstance(command, str):
        try:
            shlex.split(command)
        except ValueError as exc:
            refuse("command", f"a list of strings or one shell-quoted string ({exc})")
    elif not (isinstance(command, list) and command and all(isinstance(p, str) for p in command)):
        refuse("command", "a list of strings or one shell-quoted string")
    env = setting.get("env")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
    ):
        refuse("env", "an object of names to strings")
    if setting.get("events") is not None and not isinstance(setting["events"], bool):
        refuse("events", "true or false")


@dataclasses.dataclass(frozen=True)
class ServiceCheck:
    """Refuse a ``webhook`` delivery naming a service the hub's callback registry does
    not hold, when it is set: otherwise it is stored and every message to the member is
    dead-lettered at delivery. Registered only by a hub whose registry is the one its
    webhooks go through (``serve``); a client opening a store itself reads no config
    file, and cannot tell which services the ``serve`` on that store has."""

    callbacks: CallbackConfig

    def __call__(self, setting: Mapping[str, Any]) -> None:
        if delivery_type(setting) != WebhookAdapter.type:
            return
        name = setting.get("service")
        if not isinstance(name, str) or not name:
            return  # check_delivery_setting names it
        try:
            self.callbacks.resolve(name)
        except UnknownService as exc:
            raise InvalidRequest(
                f"the webhook delivery names service {name!r}, which this hub has not "
                f"registered: {exc.message} Register it first, or name a registered one.",
                field="delivery",
            ) from None


def register_checks(
    checks: DeliveryChecks, callbacks: CallbackConfig | None = None, *, panes: bool = False
) -> None:
    """Register the stock adapters' setting check with a hub (see
    :mod:`backchannel.hub.checks`); with ``callbacks``, the registry the hub's webhooks
    go through, a webhook's service is checked to be registered too; with ``panes`` (a
    hub whose adapters type into this host's tmux), a tmux target is checked to be a
    pane of the tmux server it names (:func:`~backchannel.delivery.tmux.check_pane`)."""
    checks.register(check_delivery_setting)
    checks.register_clash(inbox_clash)
    if callbacks is not None:
        checks.register(ServiceCheck(callbacks))
    if panes:
        checks.register(check_pane)


class MisconfiguredAdapter(Adapter):
    """Stands in for an adapter that could not be built: dead-letters each message with
    the reason it could not be built (which names the fix)."""

    def __init__(self, ctx: AdapterContext, reason: str) -> None:
        self.ctx = ctx
        self.reason = reason
        self.kind = delivery_type(ctx.setting)
        self.session = None
        self.retry = DEFAULT_RETRY
        self.attempt_timeout = DEFAULT_RETRY.timeout
        self.turn_wait = 0.0

    async def deliver(self, item: InboxMessage) -> str:
        raise PermanentDeliveryError(self.reason)

    def describe(self) -> str:
        return f"misconfigured {self.kind} delivery: {self.reason}"


def build_adapter(
    ctx: AdapterContext, *, adapters: Mapping[str, AdapterFactory] = ADAPTERS
) -> Adapter:
    """The adapter for ``ctx.setting``. A setting that cannot be served (unknown type,
    missing option) yields an adapter that dead-letters every message with the reason,
    so the senders learn about it instead of their messages waiting forever."""
    kind = delivery_type(ctx.setting)
    factory = adapters.get(kind)
    if factory is None:
        choices = ", ".join(sorted({*PULL_TYPES, *adapters}))
        return MisconfiguredAdapter(
            ctx,
            f"member {ctx.member!r} has an unknown delivery type {kind!r}; set its delivery "
            f"type to one of: {choices}",
        )
    try:
        return factory(ctx)
    except PermanentDeliveryError as exc:
        return MisconfiguredAdapter(ctx, exc.message)
