"""Per-member quotas: how much state one member may make the hub keep.

A limit comes from the member's ``settings``, else the team's ``settings``, else the
default here. A request over a limit is refused with :class:`QuotaExceeded` (429),
naming the limit, the current count and the way out; nothing already stored changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.errors import QuotaExceeded

#: Pending timers one member may hold (over all its sessions).
MAX_TIMERS = "max_timers"
#: Copies waiting in one member's inbox (``queued``: not yet handed out).
MAX_QUEUED = "max_queued"
DEFAULTS: dict[str, int] = {MAX_TIMERS: 100, MAX_QUEUED: 10_000}


def limit(key: str, team_settings: Mapping[str, Any], member_settings: Mapping[str, Any]) -> int:
    """The limit in force: the member's setting, the team's, or the default. A setting
    that is not a positive integer is ignored."""
    for settings in (member_settings, team_settings):
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULTS[key]


def too_many_timers(member: str, count: int, cap: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"{member!r} already has {count} pending timers, the limit ({MAX_TIMERS}={cap}); "
        "cancel timers you no longer need (cancel_timer, DELETE /v1/timers/{id}), or ask an "
        f"administrator to raise the member or team setting {MAX_TIMERS!r}",
        limit=cap,
        count=count,
        setting=MAX_TIMERS,
    )


def inbox_full(recipient: str, count: int, cap: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"{recipient!r} has {count} messages waiting, the limit ({MAX_QUEUED}={cap}); "
        f"try again after {recipient!r} has received and acked some, or ask an administrator "
        f"to raise the member or team setting {MAX_QUEUED!r}",
        limit=cap,
        count=count,
        setting=MAX_QUEUED,
        recipient=recipient,
    )
