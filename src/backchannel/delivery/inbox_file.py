"""``inbox-file``: append to the Claude Code team inbox the member's agent polls.

Setting::

    {"type": "inbox-file",
     "root": "~/.claude/teams",   # optional; default $CLAUDE_CONFIG_DIR/teams or ~/.claude/teams
     "team": "my-team",           # optional; the Claude Code team name, default the hub team
     "inbox": "researcher",       # optional; the inbox name, default the member name
     "color": "blue",             # optional; the entry's color
     "session": "<hub session>"}  # optional; hold messages while that session's turn runs

Each message becomes one entry ``{from: sender, text, summary?, msg_id: message_id,
color?}`` whose ``text`` is the message framed as every adapter frames it
(``[From sender] ...``, see :mod:`backchannel.core.framing`: so a text can neither pose
as another sender's message nor as one of Claude Code's JSON protocol messages), written by :class:`~backchannel.delivery.claude_inbox.InboxWriter` (Claude
Code's own lock, atomic replace, read back). An entry whose ``msg_id`` is already in the
inbox is not written again, so a redelivery after a crash is a no-op unless the agent had
already read and pruned the entry. ``InboxWriteError`` (lock not won before the writer's
deadline, I/O error) is transient: the dispatcher retries.

The lock is proper-lockfile's (the directory ``<inbox>.lock``, stale after 10 s). A stale
one is taken over under a ``flock`` on it, and only while it is still that directory and
still stale (:class:`~backchannel.delivery.claude_inbox.InboxLock`): of the hub's writers
(its threads, other hub processes) that find it stale at once, one takes it over and
the others wait for the new lock, so no two write the inbox at once and no append is
lost. Claude Code's own writers take a stale lock over as proper-lockfile does, without
that step.
"""

from __future__ import annotations

from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
    agent_text,
)
from backchannel.delivery.claude_inbox import InboxIdTaken, InboxWriteError, InboxWriter
from backchannel.types import InboxMessage

__all__ = ["InboxFileAdapter"]


class InboxFileAdapter(Adapter):
    """See the module docstring."""

    type = "inbox-file"

    def __init__(self, ctx: AdapterContext, *, writer: InboxWriter | None = None) -> None:
        super().__init__(ctx)
        root = ctx.str_option("root")
        self.writer = writer or InboxWriter(root)
        self.inbox_team = ctx.str_option("team") or ctx.team
        self.inbox = ctx.str_option("inbox") or ctx.member
        self.color = ctx.str_option("color")
        # one append waits at most the writer's deadline for the lock
        self.attempt_timeout = self.writer.deadline_s + 5.0

    async def deliver(self, item: InboxMessage) -> str:
        m = item.message
        try:
            result = await self.writer.append_async(
                self.inbox_team,
                self.inbox,
                msg_id=m.message_id,
                from_=m.sender,
                text=agent_text(item),
                summary=m.summary,
                color=self.color,
            )
        except InboxIdTaken as exc:  # writing again finds the same entry: never retried
            raise PermanentDeliveryError(f"inbox {self.path}: {exc}") from exc
        except InboxWriteError as exc:
            raise AdapterError(f"inbox {self.path}: {exc}") from exc
        except OSError as exc:  # not expected (the writer wraps I/O errors), but transient
            raise AdapterError(f"inbox {self.path}: {exc}") from exc
        if result.already_present:
            return f"already in {result.path}"
        return f"written to {result.path}"

    @property
    def path(self) -> str:
        return str(self.writer.path_for(self.inbox_team, self.inbox))

    def describe(self) -> str:
        return f"inbox-file {self.path}"
