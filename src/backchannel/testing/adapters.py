"""Delivery adapters under test: a recording adapter, and the check every adapter passes.

* :class:`RecordingAdapter` — a push adapter that keeps what it was handed in a
  :class:`Recording` instead of putting it anywhere: for testing a setup (which member
  gets what, in which order) without tmux panes, inbox files or web servers::

      recording = Recording()
      adapters = {**ADAPTERS, "record": RecordingAdapter.factory(recording)}
      # members with {"type": "record"} now deliver into `recording`

* :func:`check_adapter` — the contract of :mod:`backchannel.delivery.base`, run against
  an adapter: a setting of the wrong type is refused at construction, deliveries arrive
  in order with a detail, a copy handed over again is not shown twice (where the medium
  can tell), failures are sorted into permanent and retryable, and ``ready``,
  ``describe`` and ``close`` behave.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from backchannel.core.delegation import RetryPolicy
from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
)
from backchannel.testing.waiting import eventually
from backchannel.types import InboxMessage, Message, MessageKind, Recipient

__all__ = ["Recording", "RecordingAdapter", "check_adapter"]

#: Quick retries, so a test that exercises a failure does not wait on the default backoff.
QUICK_RETRY = RetryPolicy(start=0.05, factor=2.0, cap=0.2, budget=5.0, timeout=5.0)


@dataclass
class Recording:
    """What :class:`RecordingAdapter` instances were handed, shared by all of them."""

    delivered: list[tuple[str, InboxMessage]] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def texts(self, member: str | None = None) -> list[str]:
        """The delivered texts in order, of one member or of all."""
        return [i.message.text for m, i in self.delivered if member in (None, m)]

    def message_ids(self, member: str | None = None) -> list[str]:
        return [i.message.message_id for m, i in self.delivered if member in (None, m)]


class RecordingAdapter(Adapter):
    """``{"type": "record"}``: every delivery succeeds and is appended to a
    :class:`Recording`. A copy handed over again is recorded again, so a test can see
    redeliveries. Retries quickly (:data:`QUICK_RETRY`)."""

    type = "record"

    def __init__(self, ctx: AdapterContext, recording: Recording) -> None:
        super().__init__(ctx)
        self.recording = recording
        self.retry = QUICK_RETRY
        self.attempt_timeout = QUICK_RETRY.timeout

    @classmethod
    def factory(cls, recording: Recording) -> Callable[[AdapterContext], RecordingAdapter]:
        """An adapter factory for the dispatcher's ``adapters`` mapping."""
        return lambda ctx: cls(ctx, recording)

    async def start(self) -> None:
        self.recording.started.append(self.ctx.member)

    async def deliver(self, item: InboxMessage) -> str:
        self.recording.delivered.append((self.ctx.member, item))
        return f"recorded as #{len(self.recording.delivered)}"

    async def close(self) -> None:
        self.recording.closed.append(self.ctx.member)


#: Everything the agent's side of the medium shows so far, as text (an inbox file's
#: content, the bodies a web hook received, a pane's output). Sync or async.
Seen = Callable[[], str | Awaitable[str]]


async def check_adapter(
    factory: Callable[[AdapterContext], Adapter],
    ctx: AdapterContext,
    seen: Seen,
    *,
    rereads: bool = True,
    impossible: Mapping[str, Any] | None = None,
    failing: Mapping[str, Any] | None = None,
    within: float = 10.0,
) -> None:
    """Check an adapter against the delivery contract; raise ``AssertionError`` at the
    first promise it does not keep.

    ``factory`` builds the adapter from a context (an entry of the dispatcher's adapter
    mapping); ``ctx`` is a working setting for it and ``seen`` reads what reached the
    agent. Options:

    * ``rereads``: the medium can look back at what it holds, so a copy handed over
      twice is shown once (inbox files, web hooks whose receiver drops repeats). False
      for media that cannot (tmux, stdin): then a copy handed over twice may be shown
      twice, but not more;
    * ``impossible``: a setting under which no delivery can ever work (a missing
      service): construction, ``start`` or ``deliver`` must raise
      :class:`PermanentDeliveryError`, never a retryable :class:`AdapterError`;
    * ``failing``: a setting under which this attempt fails but a later one may work
      (a peer answering 503): ``deliver`` must raise :class:`AdapterError`.
    """
    _check_setting_types(factory, ctx)
    adapter = factory(ctx)
    _check_attributes(adapter)
    await adapter.start()
    try:
        first, second = _item(ctx, "first"), _item(ctx, "second")
        for item in (first, second):
            detail = await adapter.deliver(item)
            assert isinstance(detail, str) and detail, (
                f"{adapter.describe()}: deliver() must return a detail for the history, "
                f"got {detail!r}"
            )
        await eventually(
            lambda: _in_order(seen, first, second),
            what=f"{adapter.describe()} to show both messages in send order",
            within=within,
        )
        await adapter.deliver(first)  # as after a crash before the hub recorded it
        # the sentinel goes the same way after the repeat: once it shows, so would a repeat
        third = _item(ctx, "third")
        await adapter.deliver(third)
        text = await eventually(
            lambda: _showing(seen, third),
            what=f"{adapter.describe()} to show the message after the repeat",
            within=within,
        )
        times = str(text).count(_marker(first))
        if rereads:
            assert times == 1, (
                f"{adapter.describe()}: a copy handed over again was shown {times} times; "
                "the adapter must check the message id before it writes"
            )
        else:
            assert times <= 2, f"{adapter.describe()}: one copy was shown {times} times"
        held = await adapter.ready()
        assert held is None or isinstance(held, str), f"ready() returned {held!r}"
    finally:
        await adapter.close()
    if impossible is not None:
        await _check_impossible(factory, dataclasses.replace(ctx, setting=impossible))
    if failing is not None:
        await _check_failing(factory, dataclasses.replace(ctx, setting=failing))


def _check_setting_types(factory: Callable[[AdapterContext], Adapter], ctx: AdapterContext) -> None:
    wrong = dataclasses.replace(ctx, setting={**ctx.setting, "session": 12})
    try:
        factory(wrong)
    except PermanentDeliveryError as exc:
        assert "session" in str(exc), f"the refusal should name the option: {exc}"
    else:
        raise AssertionError(
            "a delivery setting with 'session': 12 must be refused at construction with "
            "PermanentDeliveryError (the base class does this: call super().__init__(ctx))"
        )


def _check_attributes(adapter: Adapter) -> None:
    assert adapter.type, "an adapter names its delivery type"
    assert isinstance(adapter.retry, RetryPolicy), f"retry is {adapter.retry!r}"
    assert adapter.attempt_timeout > 0, f"attempt_timeout is {adapter.attempt_timeout!r}"
    assert adapter.turn_wait >= 0, f"turn_wait is {adapter.turn_wait!r}"
    described = adapter.describe()
    assert isinstance(described, str) and described, f"describe() returned {described!r}"


async def _check_impossible(
    factory: Callable[[AdapterContext], Adapter], ctx: AdapterContext
) -> None:
    try:
        adapter = factory(ctx)
    except PermanentDeliveryError:
        return
    try:
        await adapter.start()
        await adapter.deliver(_item(ctx, "impossible"))
    except PermanentDeliveryError:
        return
    except AdapterError as exc:
        raise AssertionError(
            f"{adapter.describe()}: a delivery that can never work raised the retryable "
            f"{type(exc).__name__} ({exc}); raise PermanentDeliveryError"
        ) from exc
    finally:
        await adapter.close()
    raise AssertionError(f"{adapter.describe()}: a delivery that can never work succeeded")


async def _check_failing(factory: Callable[[AdapterContext], Adapter], ctx: AdapterContext) -> None:
    adapter = factory(ctx)
    try:
        await adapter.start()
        await adapter.deliver(_item(ctx, "failing"))
    except PermanentDeliveryError as exc:
        raise AssertionError(
            f"{adapter.describe()}: a failure a later attempt may get past raised "
            f"PermanentDeliveryError ({exc}); raise AdapterError"
        ) from exc
    except AdapterError:
        return
    finally:
        await adapter.close()
    raise AssertionError(f"{adapter.describe()}: a delivery that should fail succeeded")


def _item(ctx: AdapterContext, label: str) -> InboxMessage:
    mid = f"check-{uuid.uuid4().hex[:12]}"
    message = Message(
        team=ctx.team,
        message_id=mid,
        sender="checker",
        to=ctx.member,
        text=f"{label} {_marker_of(mid)}",
        kind=MessageKind.DIRECT,
        created_at=1_700_000_000.0,
        fingerprint=f"fp-{mid}",
        summary=None,
    )
    return InboxMessage(message, Recipient(ctx.member, ctx.setting.get("session")), 1, 1)


def _marker_of(message_id: str) -> str:
    # not the id itself: a medium may show the id beside the text (an inbox entry's msg_id)
    return "mark-" + message_id.removeprefix("check-")[::-1]


def _marker(item: InboxMessage) -> str:
    return _marker_of(item.message.message_id)


async def _read(seen: Seen) -> str:
    got = seen()
    return await got if inspect.isawaitable(got) else got


async def _showing(seen: Seen, item: InboxMessage) -> str | None:
    text = await _read(seen)
    return text if _marker(item) in text else None


async def _in_order(seen: Seen, *items: InboxMessage) -> bool:
    text = await _read(seen)
    places = [text.find(_marker(i)) for i in items]
    return all(p >= 0 for p in places) and places == sorted(places)
