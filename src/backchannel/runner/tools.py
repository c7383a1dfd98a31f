"""The tools the built-in runner gives a model: the hub's agent tools and read-only
workspace tools for real work on local files.

Hub tools act for the agent's session through the SDK :class:`backchannel.Client`;
workspace tools only read files under the team's workspace directory.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backchannel.client import Client
from backchannel.core import framing
from backchannel.core.ids import new_message_id, new_request_id
from backchannel.core.timers import DEFAULT_ANCHOR_MINUTES
from backchannel.errors import BackchannelError, ToolFailed
from backchannel.runner.models import ToolSpec
from backchannel.runtimes.common import format_message

MAX_RESULT = 20_000
SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".cache",
    ".backchannel",
    ".pytest_cache",
    "dist",
    "build",
}
LANGUAGES = {
    ".py": "Python",
    ".js": "JavaScript",
    ".ts": "TypeScript",
    ".tsx": "TypeScript",
    ".css": "CSS",
    ".html": "HTML",
    ".md": "Markdown",
    ".sh": "Shell",
    ".toml": "TOML",
    ".yaml": "YAML",
    ".yml": "YAML",
    ".json": "JSON",
    ".go": "Go",
    ".rs": "Rust",
    ".c": "C",
    ".h": "C",
    ".cpp": "C++",
    ".java": "Java",
    ".rb": "Ruby",
    ".sql": "SQL",
    "Makefile": "Makefile",
}
# a TODO in a comment (after #, //, /*, <!--, -- or ;), not the word in prose or a string
TODO_RE = re.compile(r"(?:^|\s)(?:#+|//+|/\*+|<!--|--|;+)\s*\b(TODO|FIXME)\b[:\s]*(.*)")


#: Makes a call again while the hub cannot be reached, for a call that means the same
#: made twice (the runner's :meth:`~backchannel.runner.host.Runner.patient`).
Again = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def _once(call: Callable[[], Awaitable[Any]]) -> Any:
    return await call()


@dataclass
class ToolContext:
    """What a tool call acts for. ``again`` makes a hub call again while the hub is away
    (only calls that mean the same made twice go through it)."""

    client: Client
    member: str
    session: str
    workspace: Path
    call_id: str = ""
    again: Again = _once


Handler = Callable[[ToolContext, Mapping[str, Any]], Awaitable[str]]


def _str(args: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = args.get(key)
    if value is None:
        if required:
            raise ToolFailed(f"argument {key!r} is required")
        return None
    if not isinstance(value, str):
        raise ToolFailed(f"argument {key!r} must be a string")
    return value


def _req(args: Mapping[str, Any], key: str) -> str:
    value = _str(args, key)
    assert value is not None
    return value


def _num(args: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolFailed(f"argument {key!r} must be a number")
    return float(value)


def _inside(ctx: ToolContext, rel: str) -> Path:
    root = ctx.workspace.resolve()
    path = (root / rel).resolve()
    if path != root and root not in path.parents:
        raise ToolFailed(f"path {rel!r} is outside the workspace; use a path relative to it")
    if not path.exists():
        raise ToolFailed(f"no such file or directory in the workspace: {rel!r}")
    return path


def _files(base: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames)]
    return out


# -- hub tools ------------------------------------------------------------------------


async def send_message(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """One send, under one ``message_id`` chosen here: made again while the hub is away
    (its answer lost after the hub took it, say), the hub answers the first result
    (``replayed``) instead of sending it twice. Told the send failed, a model sends
    again, and that would be a second message."""
    to, text = _req(args, "to"), _req(args, "message")
    summary = _str(args, "summary", required=False)
    close_link = bool(args.get("close_link", False))
    mid = new_message_id()
    r = await ctx.again(
        lambda: ctx.client.send(
            to,
            text,
            summary=summary,
            from_session=ctx.session,
            close_link=close_link,
            message_id=mid,
        )
    )
    return f"sent {r.message_id} to {', '.join(r.recipients)}"


async def delegate(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """One delegation, under the tool call's id (or one chosen here): made again while
    the hub is away, the hub answers the delegation it made, never a second one. That
    answer (``replayed``) is told as such, as the MCP tool tells it: the model waits for
    one answer and does not take the hub for having made a second delegation."""
    to, task = _req(args, "to"), _req(args, "task")
    timeout_s = _num(args, "timeout_s")
    tuid = ctx.call_id or "tu_" + uuid.uuid4().hex[:16]
    d = await ctx.again(
        lambda: ctx.client.delegate(
            to, task, timeout_s=timeout_s, session=ctx.session, tool_use_id=tuid
        )
    )
    head = f"delegated to {to} as {d.delegation_id} ({d.state})"
    if d.replayed:
        head += (
            f": the same delegation an earlier try of this call (id {d.tool_use_id}) "
            "made, which runs once; its answer reaches you once"
        )
    return (
        f"{head}. The answer arrives as a tool result in a later turn; do not wait for it "
        "in this turn."
    )


async def set_timer(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """One timer, under one ``request_id`` chosen here: made again while the hub is
    away, the hub answers the timer it set, never a second one."""
    intent, note = _req(args, "intent"), _req(args, "note")
    minutes = _num(args, "minutes")
    if minutes is None and intent == "anchor":
        minutes = DEFAULT_ANCHOR_MINUTES
    if minutes is None:
        raise ToolFailed("argument 'minutes' is required")
    target, rid = _str(args, "target", required=False), new_request_id()
    t = await ctx.again(
        lambda: ctx.client.set_timer(
            intent, minutes, note, target, session=ctx.session, request_id=rid
        )
    )
    return f"timer {t.timer_id} ({t.intent}) due in {t.due_in or 0:.0f} s"


async def cancel_timer(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """A cancel made again while the hub is away: the hub answers a timer cancelled
    already as it is, so a model is never told a cancel the hub did had failed."""
    tid = _num(args, "id")
    if tid is None:
        raise ToolFailed("argument 'id' is required")
    t = await ctx.again(lambda: ctx.client.cancel_timer(int(tid)))
    return f"timer {t.timer_id} cancelled"


async def get_session_data(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    session = _req(args, "session")
    since = int(_num(args, "since", 0) or 0)
    tail = _num(args, "tail_chars")
    data = await ctx.client.session_data(
        session, since=since, tail_chars=int(tail) if tail else None
    )
    lines = [f"[{e.kind}] {e.text}" for e in data.events if e.text]
    if data.note:
        lines.append(data.note)
    return "\n".join(lines) or "(no events)"


#: The most messages one ``check_inbox`` call reads (its answer goes into the model's
#: context whole).
CHECK_INBOX_BATCH = 50
#: How a ``check_inbox`` answer ends when it may not be all that waits.
MORE_MAY_WAIT = "\n\n(more messages may wait: call check_inbox again to read them)"
#: The most UTF-8 bytes of one message's text a tool answer carries: a message longer
#: than that is read in parts (``check_inbox`` answers its first, ``read_message`` each
#: next), so that an answer stays within :data:`MAX_RESULT` and a model with a small
#: context (a local server that drops what is past its window) reads every line.
PART_BYTES = 15_000
#: A ``check_inbox`` that found nothing. The runner calls tools within a turn, and the
#: hub hands a session nothing while its turn runs (messages are never injected
#: mid-turn): a bare "(no messages)" told a model polling for a teammate's answer that
#: none came while it waited. What arrives during the turn is its next input.
NOTHING_NOW = (
    "(no messages now. Messages that arrive while your turn runs are not shown here: "
    "they come as your next input once this turn ends, so end your turn to read a "
    "reply you wait for.)"
)
#: Tools whose answers are bounded by the tool itself and never cut by :func:`run_tool`
#: (``check_inbox`` acks what it answers: a cut would lose the messages past it).
UNCUT = frozenset({"check_inbox"})


async def check_inbox(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """What waits for the agent, read and acked: at most :data:`CHECK_INBOX_BATCH`, and
    only as many whole messages as fit in :data:`MAX_RESULT` characters (the first one
    whatever its length). An answer is acked, so it is never cut (:func:`run_tool`
    leaves it whole): what does not fit is given back to be read by the next call. A
    full batch, or one that gave messages back, says that more may wait, so the model
    does not take it for all there is."""
    room = MAX_RESULT - len(MORE_MAY_WAIT)
    shown: list[str] = []  # ids
    pieces: list[str] = []
    more = True  # a full batch, unless the inbox ran out first or messages went back
    while len(shown) < CHECK_INBOX_BATCH:
        # about as many as the room left holds (one first, then by the length of those
        # read so far): what goes back is little, and read by the next call, so that no
        # message spends its attempts being handed out and given back call after call
        used = sum(map(len, pieces)) + 2 * len(pieces)
        fits = (room - used) * len(pieces) // used if pieces else 1
        limit = max(1, min(fits, CHECK_INBOX_BATCH - len(shown)))
        got = await ctx.client.receive(limit=limit, session=ctx.session)
        back: list[str] = []
        for m in got:
            piece = format_message(m.sender, m.kind, m.text)
            if not pieces and not back and framing.size(m.text) > PART_BYTES:
                piece = _part(m.sender, m.kind, m.message_id, m.text, 1)[0]
            if back or (pieces and sum(map(len, pieces)) + 2 * len(pieces) + len(piece) > room):
                back.append(m.message_id)
                continue
            shown.append(m.message_id)
            pieces.append(piece)
        if back:
            await ctx.client.release(back)
            break
        if len(got) < limit:
            more = False
            break
    if shown:
        await ctx.client.ack(shown)
    text = "\n\n".join(pieces) or NOTHING_NOW
    return text + MORE_MAY_WAIT if more and shown else text


def _part(sender: str, kind: str, ident: str, text: str, part: int) -> tuple[str, int]:
    """Part ``part`` of a message as the model reads it, with the call that reads the
    next when one follows; and how many parts there are."""
    split = framing.parts(text, PART_BYTES)
    shown = format_message(sender, framing.mid_kind(kind, part > 1), split[part - 1])
    if len(split) == 1:
        return shown, 1
    shown += f"\n(message_id {ident}, part {part} of {len(split)})"
    if part < len(split):
        shown += (
            f"\n[This message is longer than one answer: call read_message with "
            f"message_id={ident!r} and part={part + 1} for its next part.]"
        )
    return shown, len(split)


async def read_message(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    """A message the agent received or sent, a part at a time (see :data:`PART_BYTES`);
    reading acks nothing, and a part can be read again."""
    ident = _req(args, "message_id")
    part = _num(args, "part", 1)
    assert part is not None
    r = await ctx.client.status(ident)
    n = len(framing.parts(r.text, PART_BYTES))
    if part != int(part) or not 1 <= part <= n:
        raise ToolFailed(
            f"message {ident} has {n} part{'s' if n != 1 else ''}; "
            f"call again with part between 1 and {n}"
        )
    return _part(r.sender, r.kind, r.message_id, r.text, int(part))[0]


#: How many members one list_members answer names: a page the model can take in; the
#: answer says how to read the next.
MEMBER_PAGE = 50


async def list_members(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    after = _str(args, "after", required=False) or None
    # one page of the hub's list, not every member: a team of thousands would flood the
    # model's context with one answer
    found = await ctx.client.members(after=after, limit=MEMBER_PAGE + 1)
    lines = [f"{m.name} ({m.kind})" for m in found[:MEMBER_PAGE]]
    if len(found) > MEMBER_PAGE:
        lines.append(
            f"(more follow: call list_members with after={found[MEMBER_PAGE - 1].name!r} "
            "for the next page)"
        )
    return "\n".join(lines) or "(no members)"


# -- workspace tools ---------------------------------------------------------------------


async def list_files(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    base = _inside(ctx, _str(args, "path", required=False) or ".")
    pattern = _str(args, "pattern", required=False) or "*"
    root = ctx.workspace.resolve()
    names = [str(p.relative_to(root)) for p in _files(base) if fnmatch.fnmatch(p.name, pattern)]
    return "\n".join(names) or "(no files)"


async def read_file(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    path = _inside(ctx, _str(args, "path") or "")
    if path.is_dir():
        raise ToolFailed(f"{args['path']!r} is a directory; use list_files")
    return path.read_text(errors="replace")


def count_by_language(base: Path) -> dict[str, dict[str, int]]:
    totals: dict[str, Counter[str]] = {}
    for p in _files(base):
        lang = LANGUAGES.get(p.suffix) or LANGUAGES.get(p.name)
        if lang is None:
            continue
        try:
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        c = totals.setdefault(lang, Counter())
        c["files"] += 1
        c["lines"] += len(lines)
        c["code"] += sum(1 for line in lines if line.strip())
    return {k: dict(v) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]["lines"])}


async def count_lines(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    base = _inside(ctx, _str(args, "path", required=False) or ".")
    return json.dumps(count_by_language(base), indent=1)


def _outside_quotes(line: str, at: int) -> bool:
    before = line[:at]
    return before.count('"') % 2 == 0 and before.count("'") % 2 == 0


def find_todo_lines(base: Path, root: Path) -> list[str]:
    out = []
    for p in _files(base):
        if (LANGUAGES.get(p.suffix) or LANGUAGES.get(p.name)) is None:
            continue
        try:
            text = p.read_text(errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = TODO_RE.search(line)
            if m and _outside_quotes(line, m.start()):
                out.append(f"{p.relative_to(root)}:{n}: {m.group(1)} {m.group(2).strip()[:100]}")
    return out


async def find_todos(ctx: ToolContext, args: Mapping[str, Any]) -> str:
    base = _inside(ctx, _str(args, "path", required=False) or ".")
    return "\n".join(find_todo_lines(base, ctx.workspace.resolve())) or "(no TODO or FIXME)"


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_S = {"type": "string"}
_N = {"type": "number"}

TOOLS: dict[str, tuple[ToolSpec, Handler]] = {
    "send_message": (
        ToolSpec(
            "send_message",
            "Send a message to a teammate (a member name, or '*' for everyone). The first message "
            "to a teammate from your turn links you: from then on each of your finished turns "
            "reaches them, and theirs reach you. Set close_link to end a link you opened.",
            _schema(
                {"to": _S, "message": _S, "summary": _S, "close_link": {"type": "boolean"}},
                ["to", "message"],
            ),
        ),
        send_message,
    ),
    "delegate": (
        ToolSpec(
            "delegate",
            "Ask a teammate (or agent@service on another hub) to do a task, as an asynchronous "
            "tool: returns at once; the answer arrives as a tool result in a later turn. Several "
            "delegations may run at once.",
            _schema({"to": _S, "task": _S, "timeout_s": _N}, ["to", "task"]),
        ),
        delegate,
    ),
    "set_timer": (
        ToolSpec(
            "set_timer",
            "Set a heartbeat: intent 'anchor' brings you back to your own task, 'check' shows a "
            "peer's state (target required), 'wait' says whether a peer replied (target required). "
            "An anchor without minutes is due in 10.",
            _schema(
                {
                    "intent": {"type": "string", "enum": ["anchor", "check", "wait"]},
                    "minutes": _N,
                    "note": _S,
                    "target": _S,
                },
                ["intent", "note"],
            ),
        ),
        set_timer,
    ),
    "cancel_timer": (
        ToolSpec(
            "cancel_timer", "Cancel one of your pending timers by id.", _schema({"id": _N}, ["id"])
        ),
        cancel_timer,
    ),
    "get_session_data": (
        ToolSpec(
            "get_session_data",
            "Read a teammate's session transcript (thoughts, tool calls, outputs), paged.",
            _schema({"session": _S, "since": _N, "tail_chars": _N}, ["session"]),
        ),
        get_session_data,
    ),
    "check_inbox": (
        ToolSpec(
            "check_inbox",
            "Read messages waiting for you now. Messages that arrive while your turn "
            "runs are not shown here: they come as your next input once the turn ends.",
            _schema({}, []),
        ),
        check_inbox,
    ),
    "read_message": (
        ToolSpec(
            "read_message",
            "Read a message you received or sent by its id, a part at a time (a message "
            "longer than one answer is read in parts; part 1 is the first).",
            _schema({"message_id": _S, "part": _N}, ["message_id"]),
        ),
        read_message,
    ),
    "list_members": (
        ToolSpec(
            "list_members",
            "List your team's members by name, a page at a time (after: the last name of "
            "the page before).",
            _schema({"after": _S}, []),
        ),
        list_members,
    ),
    "list_files": (
        ToolSpec(
            "list_files",
            "List files under a workspace directory, optionally matching a glob.",
            _schema({"path": _S, "pattern": _S}, []),
        ),
        list_files,
    ),
    "read_file": (
        ToolSpec("read_file", "Read a workspace file.", _schema({"path": _S}, ["path"])),
        read_file,
    ),
    "count_lines": (
        ToolSpec(
            "count_lines",
            "Count files, lines and non-blank lines by language under a workspace directory.",
            _schema({"path": _S}, []),
        ),
        count_lines,
    ),
    "find_todos": (
        ToolSpec(
            "find_todos",
            "List every TODO and FIXME comment under a workspace directory.",
            _schema({"path": _S}, []),
        ),
        find_todos,
    ),
}

DEFAULT_TOOLS = (
    "send_message",
    "delegate",
    "set_timer",
    "cancel_timer",
    "get_session_data",
    "check_inbox",
    "read_message",
    "list_members",
)


def unparsed_arguments(name: str, text: str) -> str:
    """What the model hears for a call whose arguments are not a JSON object: the tool
    was not run (guessing what it meant could send the wrong message)."""
    shown = text if len(text) <= 500 else text[:500] + "…"
    return (
        f"{name} was not run: its arguments are not valid JSON for an object of "
        f"arguments: {shown} -- call it again with its arguments as one JSON object, "
        "as the tool's parameters describe"
    )


#: Stop reasons that say the answer was cut before its end, and why: at the output limit
#: (Anthropic's ``max_tokens``, OpenAI's ``length``), at the model's context window
#: (Anthropic's ``model_context_window_exceeded``, which its newer models give in place
#: of an error), or by the API's filter.
CUT_SHORT = {
    "max_tokens": "reached the output limit (max_tokens)",
    "length": "reached the output limit (length)",
    "model_context_window_exceeded": (
        "reached the model's context window (model_context_window_exceeded)"
    ),
    "refusal": "was stopped by the API's safety filter (refusal)",
    "content_filter": "was stopped by the API's content filter (content_filter)",
}


def cut_short(name: str, stop_reason: str) -> str:
    """What the model hears for a call in an answer cut before its end: the call may be
    missing its end (half a message, a path cut short), so it was not run."""
    return (
        f"{name} was not run: your answer {CUT_SHORT[stop_reason]} before this call was "
        "complete, so its arguments may be cut short -- call it again, with less text "
        "before it or a shorter message"
    )


#: Stop reasons of an answer cut at the output limit, whose model can be asked to go on
#: (one its filter stopped is not asked to go on past the filter, nor one cut at the
#: context window, which has no room left to go on in).
AT_THE_LIMIT = frozenset({"max_tokens", "length"})
#: How many times a turn asks a model whose text was cut at the output limit to go on.
GO_ON_TIMES = 3


def go_on(stop_reason: str) -> str:
    """What a model whose answer of text only was cut at the output limit is told: go on
    where it stopped, so the turn's closing text is the whole answer, not its start."""
    return (
        f"(Your answer was cut at the output limit ({stop_reason}). Go on from exactly "
        "where it stopped, mid-word if it stopped there: do not repeat what you wrote, "
        "and do not apologise.)"
    )


def cut_mark(stop_reason: str) -> str:
    """The line a closing text cut before its end ends with, so whoever reads it (a
    delegation's caller, a person) knows it may be incomplete."""
    return f"[cut short: the answer {CUT_SHORT[stop_reason]}]"


async def run_tool(
    ctx: ToolContext, name: str, args: Mapping[str, Any], allowed: frozenset[str]
) -> tuple[str, bool]:
    """Run one tool call; returns ``(text, is_error)``. Errors are for the model to read."""
    if name not in TOOLS or name not in allowed:
        return f"unknown tool {name!r}; available: {', '.join(sorted(allowed))}", True
    try:
        text = await TOOLS[name][1](ctx, args)
    except ToolFailed as exc:
        return f"{name} failed: {exc}", True
    except BackchannelError as exc:
        return f"{name} failed: {exc.message}", True
    if len(text) > MAX_RESULT and name not in UNCUT:
        text = text[:MAX_RESULT] + f"\n[… cut at {MAX_RESULT} characters]"
    return text, False
