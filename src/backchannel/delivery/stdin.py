"""``stdin``: feed a lead agent the hub starts, one stream-json line per message.

Setting::

    {"type": "stdin",
     "command": ["claude", "-p", "--input-format", "stream-json",
                 "--output-format", "stream-json", "--verbose"],   # or one shell-quoted string
     "cwd": "/path/to/project",     # optional
     "env": {"NAME": "value"},      # optional; added to the hub's environment
     "stdout": "/path/agent.log",   # optional; the agent's stdout and stderr (default: discarded)
     "session": "<hub session id>", # optional; default (or "auto"): a new session opened at start
     "events": true,                # optional; read the agent's stream-json stdout into
                                    # session events (default: when the command has
                                    # "--output-format stream-json")
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

**The agent's stdout.** With ``events`` on, the adapter reports ``turn_start`` (the
message's text) before it writes a line, and reads the agent's stdout as Claude Code's
``--output-format stream-json``: ``assistant`` messages give ``thought`` (thinking),
``agent_output`` (text) and ``tool_call`` (tool_use) events, ``user`` tool results give
``tool_result``, and the ``result`` line gives ``agent_stop`` with the result text. The
hub holds the next message until then, so messages reach the agent between turns. Lines
that are not stream-json are kept in the ``stdout`` file only.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from backchannel.errors import BackchannelError, Forbidden, InvalidState, StdinClosed
from backchannel.files import narrow, no_space, private_dirs
from backchannel.types import EventKind, InboxMessage

__all__ = [
    "StdinAdapter",
    "StdinAgent",
    "StdinClosed",
    "stream_json_events",
    "stream_json_line",
]

log = logging.getLogger("backchannel.delivery.stdin")


def stream_json_line(text: str) -> bytes:
    """One user turn in Claude Code's ``--input-format stream-json``, newline-terminated."""
    obj = {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}}
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


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
        on_line: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        if not command:
            raise ValueError("command is empty")
        self.on_line = on_line
        self._pump: asyncio.Task[None] | None = None
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
            private_dirs(self.stdout.parent)
            # the agent's output holds its messages: private, as every file the hub writes
            fd = os.open(self.stdout, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            narrow(fd, self.stdout)  # one that was there, open to others, too
            out = os.fdopen(fd, "ab")  # the child keeps a copy
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if self.on_line else out,
                stderr=out if self.stdout is not None else asyncio.subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                limit=16 * 1024 * 1024,  # one stream-json line can be a long tool result
            )
        finally:
            if not isinstance(out, int) and self.on_line is None:
                out.close()
        if self.on_line is not None:
            log_file = out if not isinstance(out, int) else None
            self._pump = asyncio.create_task(self._read_stdout(log_file), name="bc-stdin-stdout")

    async def _read_stdout(self, log_file: IO[bytes] | None) -> None:
        """Hand each stdout line to ``on_line`` (and append it to the log file)."""
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        assert self.on_line is not None
        try:
            while line := await proc.stdout.readline():
                if log_file is not None:
                    try:
                        await asyncio.to_thread(_append, log_file, line)
                    except OSError as exc:
                        # a full disk: the lines are read on (the turns must be seen
                        # ending), only no longer kept in the file
                        log.warning(
                            "cannot write the agent's output to %s (%s); its lines are "
                            "no longer kept there until the delivery starts it again",
                            self.stdout, no_space(exc, self.stdout) if self.stdout else exc,
                        )  # fmt: skip
                        with contextlib.suppress(OSError):
                            log_file.close()
                        log_file = None
                try:
                    await self.on_line(line)
                except Exception:
                    log.exception("handling a line of the agent's stdout failed")
        except ValueError:  # a line past the limit: the rest is read as it comes
            log.warning("the agent (pid %s) wrote a stdout line over 16 MiB; stopped reading "
                        "its stdout", proc.pid)  # fmt: skip
        finally:
            if log_file is not None:
                with contextlib.suppress(OSError):  # what a full disk left in its buffer
                    log_file.close()

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
        try:
            return await self._close(proc, grace)
        finally:
            if self._pump is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(self._pump, grace)

    async def _close(self, proc: asyncio.subprocess.Process, grace: float) -> int | None:
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


def _append(f: IO[bytes], line: bytes) -> None:
    f.write(line)
    f.flush()


def stream_json_events(obj: Mapping[str, Any]) -> list[tuple[EventKind, str, dict[str, Any]]]:
    """The session events one line of Claude Code's ``--output-format stream-json`` holds."""
    kind = obj.get("type")
    message = obj.get("message")
    blocks = message.get("content") if isinstance(message, dict) else None
    out: list[tuple[EventKind, str, dict[str, Any]]] = []
    if kind == "result":
        text = obj.get("result")
        data = {k: obj[k] for k in ("subtype", "is_error", "num_turns") if k in obj}
        out.append((EventKind.AGENT_STOP, text if isinstance(text, str) else "", data))
    elif kind in ("assistant", "user") and isinstance(blocks, list):
        for b in blocks:
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            if t == "text" and kind == "assistant" and isinstance(b.get("text"), str):
                out.append((EventKind.AGENT_OUTPUT, b["text"], {}))
            elif t == "thinking" and isinstance(b.get("thinking"), str):
                out.append((EventKind.THOUGHT, b["thinking"], {}))
            elif t == "tool_use":
                data = {"tool": b.get("name"), "input": b.get("input"), "id": b.get("id")}
                out.append((EventKind.TOOL_CALL, str(b.get("name") or ""), data))
            elif t == "tool_result":
                content = b.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                out.append((EventKind.TOOL_RESULT, text, {"id": b.get("tool_use_id")}))
    return out


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
        command = _command(ctx)
        events: Any = ctx.option("events")
        if events is None:
            events = "--output-format" in command and "stream-json" in command
        if not isinstance(events, bool):
            raise PermanentDeliveryError(
                f"member {ctx.member!r}'s stdin delivery 'events' must be true or false"
            )
        self.events = events
        self.agent = StdinAgent(
            command,
            cwd=ctx.str_option("cwd"),
            env=env,
            stdout=ctx.str_option("stdout"),
            on_line=self._on_line if events else None,
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

    async def _on_line(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            return
        if not isinstance(obj, dict) or self.session is None:
            return
        for kind, text, data in stream_json_events(obj):
            await self._report(kind, text, data)

    async def _report(self, kind: EventKind, text: str, data: Mapping[str, Any]) -> None:
        assert self.session is not None
        try:
            await self.ctx.hub.report_event(
                self.ctx.team, self.ctx.member, self.session, kind, text, data
            )
        except BackchannelError as exc:  # no turn open (output before any input), say
            log.info("%s/%s: %s event not recorded: %s", self.ctx.team, self.ctx.member,
                     kind.value, exc.message)  # fmt: skip

    async def deliver(self, item: InboxMessage) -> str:
        text = agent_text(item)
        line = stream_json_line(text)
        if self.events and self.session is not None:
            m = item.message
            data = {"message_id": m.message_id, "from": m.sender}
            await self._report(EventKind.TURN_START, text, data)
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
