"""Claude Code channels: the MCP server pushes a teammate's message into an idle session.

Claude Code lets an MCP server that declares the experimental ``claude/channel``
capability send ``notifications/claude/channel`` ``{content, meta}``; it shows the content
to the model as ``<channel source="backchannel" message_id="…" from="…" kind="…">`` and,
when the session is idle, starts a turn with it at once. The session must be started
with channels enabled (``--dangerously-load-development-channels server:backchannel`` for
the server of ``.mcp.json``); Claude Code never tells the server whether it listens.

The contract of :class:`ChannelPusher`:

* It never pushes the hub's own notices alone: like the hook routes, it lets them wait
  for the next turn (and leases nothing again until something new arrives).
* It pushes only while the session is between turns (the hub hands a session's messages
  out only then) and has been for ``settle_s`` (what waits when a turn ends is the Stop
  hook's answer, not a push), in send order, each message at most once per connection,
  framed by :func:`~backchannel.runtimes.common.format_message` like every delivery.
  The session's state is polled (``poll_s``): the server and the hub are different
  processes, and the hub's own wake-up would race the Stop hook.
* A pushed message stays leased, never acked here: the session's next hook event acks it
  when it shows the message (the ``<channel … message_id>`` tag in its prompt or
  transcript; :func:`backchannel.runtimes.channel_tags.channel_ids`). Unconfirmed, it comes back after its lease and the next
  route (the Stop answer, the next prompt) delivers it; that route drops a copy the
  session has already shown.
* Until one push is confirmed the channel is on probation: a push not confirmed within
  ``confirm_s`` means the client does not listen (channels not enabled, or no hooks to
  confirm), so the message is released at once to the hook routes and nothing more is
  pushed on this connection. Without channels the hook routes work as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from backchannel.client import Client
from backchannel.errors import BackchannelError
from backchannel.models import Received, SessionInfo
from backchannel.runtimes.common import format_message

__all__ = ["CAPABILITY", "METHOD", "ChannelPusher", "notification"]

log = logging.getLogger("backchannel.mcp.channel")

#: The experimental capability that makes Claude Code listen (``experimental`` of the
#: server's ``initialize`` answer).
CAPABILITY = "claude/channel"
METHOD = "notifications/claude/channel"

Push = Callable[[str, dict[str, str]], Awaitable[None]]


class ChannelPusher:
    """Pushes the member's waiting messages into its Claude Code session; one per
    connected client (see the module docstring for the contract)."""

    def __init__(
        self,
        client: Client,
        member: str,
        push: Push,
        *,
        session: str | None = None,
        lease_s: float = 60.0,
        confirm_s: float = 10.0,
        poll_s: float = 0.2,
        settle_s: float = 0.3,
    ) -> None:
        self._client = client
        self._member = member
        self._push = push
        self._session = session or os.environ.get("BACKCHANNEL_SESSION") or None
        # the Claude Code session that started this server, when it says (a resumed one
        # continues on the hub as <id>.2, <id>.3...)
        self._runtime_session = os.environ.get("CLAUDE_CODE_SESSION_ID") or None
        # the sessions the server's beat says run under its runtime process (its last
        # answer): after a /clear, the new conversation's, which the id above is not
        self._here: frozenset[str] = frozenset()
        self._lease_s = lease_s
        self._confirm_s = confirm_s
        self._poll_s = poll_s
        self._settle_s = settle_s
        self.pushed: dict[str, None] = {}  # every id pushed on this connection, in order
        self.live: bool | None = None  # None: not known yet; False: the client ignores us
        self._hold: tuple[object, int] | None = None  # notices alone wait: (spell, pending)

    async def run(self) -> None:
        """Push until cancelled, or until the client shows it does not listen."""
        loop = asyncio.get_running_loop()
        seen: tuple[object, float] | None = None  # the session's idle spell, first seen when
        while self.live is not False:
            s = await self._target()
            if s is None or s.get("state") != "idle":
                seen = None
                await asyncio.sleep(self._poll_s)
                continue
            # the turn's own Stop answer goes first: push only into a session that has
            # been idle for a moment (the hook that ended the turn leases what waits)
            spell = (s["session_id"], s.get("turn"), s.get("last_stop_at"))
            if seen is None or seen[0] != spell:
                seen = (spell, loop.time())
            if loop.time() - seen[1] < self._settle_s or await self._holding(spell):
                await asyncio.sleep(self._poll_s)
                continue
            try:
                got = await self._client.receive(
                    session=str(s["session_id"]), limit=20, lease=self._lease_s
                )
            except BackchannelError as exc:  # the session ended meanwhile
                log.debug("channel receive for %s: %s", s["session_id"], exc)
                got = []
            if not got:
                await asyncio.sleep(self._poll_s)
                continue
            if all(m.kind == "system" for m in got):
                # the hub's own notices never start a turn: they wait for the next one,
                # and nothing is leased again until something new arrives
                await self._release([m.message_id for m in got])
                self._hold = (spell, await self._client.pending())
                continue
            fresh = [m for m in got if m.message_id not in self.pushed]
            stale = [m.message_id for m in got if m.message_id in self.pushed]
            if stale:  # pushed before and never shown: the hook routes take it from here
                await self._release([m.message_id for m in got])
                await self._until_done(stale)
                continue
            for m in fresh:
                self.pushed[m.message_id] = None
                await self._push(format_message(m.sender, m.kind, m.text), _meta(m))
            if self.live is None:
                await self._probation([m.message_id for m in fresh])

    def runs_here(self, sessions: Iterable[str]) -> None:
        """The sessions that run under this server's runtime process now, as its beat
        was answered (:func:`backchannel.interfaces.mcp.beat`)."""
        self._here = frozenset(sessions)

    async def _holding(self, spell: object) -> bool:
        """Only notices wait, and nothing came since (in this same idle spell)."""
        if self._hold is None or self._hold[0] != spell:
            self._hold = None
            return False
        try:
            if await self._client.pending() <= self._hold[1]:
                return True
        except BackchannelError:
            return True
        self._hold = None
        return False

    async def _target(self) -> SessionInfo | None:
        """The session to push into: the one named, else one the beat says runs under
        this server's runtime process, else the live one of the Claude Code session that
        started this server, else the member's most recently active live session
        (delegation sub-sessions aside). The beat comes first: ``/clear`` gives the
        process a new session id, and the one it was started with is left exited."""
        try:
            found = await self._client.list_sessions(self._member)
        except BackchannelError:
            return None
        mine = [s for s in found if s.get("member") == self._member]
        if self._session is not None:
            return next((s for s in mine if s.get("session_id") == self._session), None)
        live = [
            s
            for s in mine
            if s.get("state") != "terminated" and "--" not in str(s.get("session_id"))
        ]
        here = [
            s
            for s in live
            if s.get("session_id") in self._here and s.get("state") in ("idle", "active")
        ]
        if here:
            return max(here, key=lambda s: float(s.get("updated_at") or 0))
        rt = self._runtime_session
        if rt is not None:
            live = [
                s for s in live if str(s["session_id"]).split(".")[0] == rt.split(".")[0]
            ] or live
        if not live:
            return None
        return max(live, key=lambda s: float(s.get("updated_at") or 0))

    async def _probation(self, ids: list[str]) -> None:
        """Wait for the session to show one of ``ids``; else give them all back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._confirm_s
        while loop.time() < deadline:
            if any([await self._acked(i, missing=False) for i in ids]):
                self.live = True
                return
            await asyncio.sleep(self._poll_s)
        self.live = False
        log.warning(
            "channel push not shown by the session within %.0f s: channels are off for "
            "this connection (start Claude Code with --dangerously-load-development-channels "
            "server:backchannel); the hook routes deliver instead",
            self._confirm_s,
        )
        await self._release(ids)

    async def _until_done(self, ids: list[str]) -> None:
        """Wait until another route has delivered ``ids`` (acked, or dead)."""
        while True:  # another process delivers them: polled, as nothing signals here
            if all([await self._acked(i, ("acked", "dead")) for i in ids]):
                return
            await asyncio.sleep(self._poll_s)

    async def _acked(
        self, message_id: str, states: tuple[str, ...] = ("acked",), *, missing: bool = True
    ) -> bool:
        """Whether the member's copy is in ``states`` (``missing``: when it cannot be read)."""
        try:
            status = await self._client.status(message_id)
        except BackchannelError:
            return missing
        return any(
            d.get("to") == self._member and d.get("state") in states
            for d in status.get("deliveries", [])
        )

    async def _release(self, ids: Iterable[str]) -> None:
        with contextlib.suppress(BackchannelError):
            await self._client.release(list(ids))


def _meta(m: Received) -> dict[str, str]:
    meta = {"message_id": m.message_id, "from": m.sender, "kind": m.kind}
    if m.summary:
        meta["summary"] = m.summary
    return meta


def notification(content: str, meta: dict[str, str]) -> dict[str, Any]:
    """The JSON-RPC notification for one push."""
    return {"jsonrpc": "2.0", "method": METHOD, "params": {"content": content, "meta": meta}}
