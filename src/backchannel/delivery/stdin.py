"""``stdin``: feed a lead agent the hub starts, one stream-json line per message.

Setting::

    {"type": "stdin",
     "command": ["claude", "-p", "--input-format", "stream-json",
                 "--output-format", "stream-json", "--verbose"],   # or one shell-quoted string
     "cwd": "/path/to/project",     # optional
     "env": {"NAME": "value"},      # optional; added to the hub's environment
     "stdout": "/path/agent.log",   # optional; the agent's stdout and stderr (default: discarded)
     "session": "<hub session id>", # optional; default (or "auto"): a new session opened at start
     "turn_wait": 0}                # optional; see backchannel.delivery.base.Adapter

When the dispatcher starts serving the member, :class:`StdinAgent` starts ``command``
(in its own process group, so a Ctrl-C meant for the hub does not reach it) and the
adapter opens the hub session (``open_session``: a session whose turn was running is
recovered, since the process that ran it is gone). Each message is then written as one
line::

    {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "[From lead] ..."}]}}

**Closed stdin.** When the process exits, or a write finds its stdin closed, the session
is terminated (``hub.terminate_session``, reason naming the exit code): its links close,
the dispatcher stops serving the member, and a message whose write failed is
dead-lettered with that reason. Nothing restarts the agent; a changed ``delivery``
setting (or a hub restart) starts a new process. A hub shutdown closes the agent's
stdin (end of input), waits briefly, then terminates it, *without* terminating the
session, so the next start resumes it.

The agent's own ``message_id`` check is impossible here (the line carries only text), so
a crash between the write and the hub's record delivers the line twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from backchannel.delivery.base import (
    AUTO_SESSION,
    Adapter,
    AdapterContext,
    AdapterError,
    PermanentDeliveryError,
    agent_text,
)
from backchannel.errors import BackchannelError, Forbidden, InvalidState
from backchannel.types import InboxMessage

__all__ = ["StdinAdapter", "StdinAgent", "StdinClosed", "stream_json_line"]

log = logging.getLogger("backchannel.delivery.stdin")


def stream_json_line(text: str) -> bytes:
    """One user turn in Claude Code's ``--input-format stream-json``, newline-terminated."""
    obj = {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}}
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


class StdinClosed(Exception):
    """The agent's stdin no longer takes input (the process exited or closed it)."""


class StdinAgent:
    """An agent process started by the hub; this object owns its stdin.

    ``stdout`` is a file the process's stdout and stderr are appended to (``None``:
    discarded, so a chatty agent never blocks on a full pipe).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdout: str | os.PathLike[str] | None = None,
    ) -> None:
        if not command:
            raise ValueError("command is empty")
        self.command = list(command)
        self.cwd = cwd
        self.env = {**os.environ, **env} if env else None
        self.stdout = Path(stdout).expanduser() if stdout else None
        self.proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        """Start the process. ``OSError`` if the command cannot be run."""
        out: IO[bytes] | int = asyncio.subprocess.DEVNULL
        if self.stdout is not None:
            self.stdout.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.stdout, "ab")  # noqa: SIM115, ASYNC230 - local file; the child keeps a copy
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=out,
                stderr=out if self.stdout is not None else asyncio.subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()

    async def send(self, data: bytes, *, within: float = 30.0) -> None:
        """Write ``data`` (whole lines) and wait until the pipe took it. Raises
        :class:`StdinClosed` when the stdin is closed, ``TimeoutError`` when the process
        does not read for ``within`` seconds (what was written may still arrive later)."""
        async with self._lock:
            proc = self.proc
            if proc is None or proc.stdin is None:
                raise StdinClosed("the agent process was not started")
            if proc.returncode is not None:
                raise StdinClosed(f"the agent process exited with code {proc.returncode}")
            if proc.stdin.is_closing():
                raise StdinClosed("the agent's stdin is closed")
            try:
                proc.stdin.write(data)
                await asyncio.wait_for(proc.stdin.drain(), within)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise StdinClosed(f"the agent closed its stdin ({exc})") from exc

    async def wait(self) -> int:
        """Wait for the process to exit; its exit code."""
        if self.proc is None:
            raise RuntimeError("the agent process was not started")
        return await self.proc.wait()

    async def wait_closed(self) -> str:
        """Wait until the stdin takes no more input: the process exited, or it closed its
        end of the pipe (noticed without writing). Returns why, as a sentence."""
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise RuntimeError("the agent process was not started")
        exited = asyncio.ensure_future(proc.wait())
        closed = asyncio.ensure_future(proc.stdin.wait_closed())
        try:
            await asyncio.wait({exited, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():  # an exit closes the pipe first: give it a moment
                await asyncio.wait({exited}, timeout=0.5)
        finally:
            for f in (exited, closed):
                f.cancel()
            await asyncio.wait({exited, closed})
        if closed.done() and not closed.cancelled():
            closed.exception()  # retrieved: a broken pipe is the expected way to close
        if exited.done() and not exited.cancelled():
            return f"the agent process exited with code {exited.result()}; its stdin is closed"
        if proc.returncode is not None:
            return f"the agent process exited with code {proc.returncode}; its stdin is closed"
        return f"the agent (pid {proc.pid}) closed its stdin"

    async def close(self, grace: float = 3.0) -> int | None:
        """End of input, then ``grace`` seconds to exit, then SIGTERM, then SIGKILL."""
        proc = self.proc
        if proc is None:
            return None
        steps: list[Any] = [proc.terminate, proc.kill]
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
            steps.insert(0, None)  # end of input first; a process that closed it gets SIGTERM
        for stop in steps:
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(proc.wait(), grace)
        return proc.returncode


def _command(ctx: AdapterContext) -> list[str]:
    raw: Any = ctx.option("command")
    if isinstance(raw, str) and raw.strip():
        return shlex.split(raw)
    if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        return list(raw)
    raise PermanentDeliveryError(
        f"member {ctx.member!r} has a stdin delivery setting without a 'command' to start; "
        'set the member\'s delivery to e.g. {"type": "stdin", "command": ["claude", "-p", '
        '"--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]}'
    )


class StdinAdapter(Adapter):
    """See the module docstring."""

    type = "stdin"
    starts_turn = True

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        env: Any = ctx.option("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise PermanentDeliveryError(
                f"member {ctx.member!r}'s stdin delivery 'env' must map names to strings"
            )
        self.agent = StdinAgent(
            _command(ctx), cwd=ctx.str_option("cwd"), env=env, stdout=ctx.str_option("stdout")
        )
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        self._ended: str | None = None

    def describe(self) -> str:
        return f"stdin of {shlex.join(self.agent.command)} (pid {self.agent.pid})"

    async def start(self) -> None:
        hub, team, member = self.ctx.hub, self.ctx.team, self.ctx.member
        # the process will be new: a turn the session had open died with the old one
        sid = None if self.session == AUTO_SESSION else self.session
        try:
            session = await hub.open_session(team, member, sid)
        except (InvalidState, Forbidden) as exc:
            raise PermanentDeliveryError(
                f"member {member!r}'s stdin delivery cannot use session {sid!r}: {exc.message}; "
                "drop 'session' from the setting (a new one is opened) or name another"
            ) from exc
        self.session = session.session_id
        try:
            await self.agent.start()
        except OSError as exc:
            raise PermanentDeliveryError(
                f"cannot start {shlex.join(self.agent.command)!r} for member {member!r}: {exc}; "
                "fix the command in the member's stdin delivery setting"
            ) from exc
        self._watch = asyncio.create_task(self._watch_exit(), name=f"bc-stdin-{team}-{member}")
        log.info("started %s for %s/%s, session %s", self.describe(), team, member, self.session)

    async def _watch_exit(self) -> None:
        reason = await self.agent.wait_closed()
        if not self._closing:
            await self._terminate(reason)

    async def _terminate(self, reason: str) -> None:
        if self._ended is not None or self.session is None:
            return
        self._ended = reason
        log.warning("%s/%s: %s", self.ctx.team, self.ctx.member, reason)
        try:
            await self.ctx.hub.terminate_session(
                self.ctx.team, self.ctx.member, self.session, reason
            )
        except BackchannelError as exc:
            log.warning("could not terminate session %s: %s", self.session, exc.message)

    async def deliver(self, item: InboxMessage) -> str:
        line = stream_json_line(agent_text(item))
        try:
            await self.agent.send(line, within=self.attempt_timeout)
        except StdinClosed as exc:
            await self._terminate(f"{exc}; session {self.session} is terminated")
            raise PermanentDeliveryError(
                f"{self._ended}; restart the agent (restart the hub or change the member's delivery)"
            ) from exc
        except TimeoutError:
            raise AdapterError(
                f"the agent (pid {self.agent.pid}) has not read its stdin for "
                f"{self.attempt_timeout:g} s"
            ) from None
        return f"written to the stdin of pid {self.agent.pid} ({len(line)} bytes)"

    async def close(self) -> None:
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.agent.close()
