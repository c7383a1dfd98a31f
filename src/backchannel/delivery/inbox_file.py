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

A write runs in a thread and has the writer's deadline plus 5 s (``attempt_timeout``);
on a filesystem that does not answer (a hung network mount) the attempt fails as
transient past it, and the thread, which cannot be interrupted, is left waiting. While
it waits no other write to the member's inbox starts (each attempt fails at once, saying
so), so a stuck filesystem costs one thread, not one per retry; the copy is given up
once the retries are spent, the sender told. Should the stuck write complete later, the
entry is in the inbox all the same (a copy given up may have reached the agent).

The lock is proper-lockfile's (the directory ``<inbox>.lock``, stale after 10 s). A stale
one is taken over under a ``flock`` on it, and only while it is still that directory and
still stale (:class:`~backchannel.delivery.claude_inbox.InboxLock`): of the hub's writers
(its threads, other hub processes) that find it stale at once, one takes it over and
the others wait for the new lock, so no two write the inbox at once and no append is
lost. Claude Code's own writers take a stale lock over as proper-lockfile does, without
that step.
"""

from __future__ import annotations

import asyncio
import threading
import time

import anyio.to_thread

from backchannel.delivery.base import (
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
    agent_text,
)
from backchannel.delivery.claude_inbox import (
    AppendResult,
    InboxIdTaken,
    InboxTeamDeleted,
    InboxWriteError,
    InboxWriter,
    name_problem,
)
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
        for what, name in (("team", self.inbox_team), ("inbox", self.inbox)):
            if (problem := name_problem(what, name)) is not None:
                raise PermanentDeliveryError(problem)
        self.color = ctx.str_option("color")
        # one append waits at most the writer's deadline for the lock
        self.attempt_timeout = self.writer.deadline_s + 5.0
        # set once the thread of the last write returned (see deliver)
        self._writing: threading.Event | None = None
        self._writing_since = 0.0

    async def deliver(self, item: InboxMessage) -> str:
        m = item.message
        if self._writing is not None and not self._writing.is_set():
            raise AdapterError(
                f"inbox {self.path}: the write started "
                f"{time.monotonic() - self._writing_since:.0f} s ago has still not returned "
                "(the filesystem does not answer); no other write starts until it does. "
                "Check the filesystem the inbox is on"
            )
        done = threading.Event()

        def append() -> AppendResult:
            try:
                return self.writer.append(
                    self.inbox_team,
                    self.inbox,
                    msg_id=m.message_id,
                    from_=m.sender,
                    text=agent_text(item),
                    summary=m.summary,
                    color=self.color,
                )
            finally:
                done.set()

        self._writing, self._writing_since = done, time.monotonic()
        try:
            async with asyncio.timeout(self.attempt_timeout):
                # abandoned, not waited for, when the attempt times out or the worker
                # is cancelled: a thread stuck in the kernel cannot be interrupted
                result = await anyio.to_thread.run_sync(append, abandon_on_cancel=True)
        except TimeoutError:
            raise AdapterError(
                f"inbox {self.path}: the write did not answer within "
                f"{self.attempt_timeout:g} s (the filesystem does not answer); check the "
                "filesystem the inbox is on"
            ) from None
        except InboxTeamDeleted as exc:  # no agent reads the inbox: a dead letter at once
            raise PermanentDeliveryError(f"inbox {self.path}: {exc}") from exc
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
