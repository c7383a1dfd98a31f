"""Reading a runtime's own transcript, on the agent's machine only.

A ``Stop`` hook of an older Claude Code (or Codex) may lack ``last_assistant_message``;
the turn's closing text is then the last assistant message of the session's transcript,
named by the payload's ``transcript_path``. Claude Code's ``Stop`` names no turn; what
does is the uuid its transcript gives the turn's last assistant message
(:func:`last_assistant_uuid`): the same ``Stop`` reported twice finds the same one, a
new turn that ends with the same words another. Only the command hook (``backchannel
hook``, run by the runtime as the agent's user) fills these in, through :func:`enrich`.
The hub never opens a path a request names: a hook posted over HTTP is taken as it is.

Even the command hook reads a transcript only when

* its real path (symlinks resolved) lies inside the runtime's own transcript directory:
  ``$CLAUDE_CONFIG_DIR/projects`` (default ``~/.claude/projects``) for Claude Code,
  ``$CODEX_HOME/sessions`` (default ``~/.codex/sessions``) for Codex;
* it is a regular file, checked on the open descriptor (opened ``O_NONBLOCK`` and
  ``O_NOFOLLOW``, so a FIFO or device never blocks and a swapped-in link is not followed)
  and the same file that was checked;
* and then only its last :data:`TRANSCRIPT_TAIL_BYTES` are read.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from backchannel.errors import TranscriptRefused

__all__ = [
    "TRANSCRIPT_TAIL_BYTES",
    "TRANSCRIPT_WAIT_SECONDS",
    "TranscriptRefused",
    "enrich",
    "last_assistant_text",
    "last_assistant_uuid",
    "parse_last_assistant",
    "prompt_taken_back",
    "transcript_dirs",
]

#: How much of a transcript's tail is read to find the last assistant message.
TRANSCRIPT_TAIL_BYTES = 2 * 1024 * 1024
#: How long Claude Code's ``Stop`` hook waits for the transcript to show the turn's
#: answer (the interactive CLI writes it behind, within a fraction of a second), and how
#: often it looks meanwhile.
TRANSCRIPT_WAIT_SECONDS = 1.0
TRANSCRIPT_POLL_SECONDS = 0.05


def transcript_dirs(runtime: str) -> tuple[Path, ...]:
    """Where ``runtime`` keeps its session transcripts on this machine."""
    if runtime == "claude-code":
        base = os.environ.get("CLAUDE_CONFIG_DIR") or str(Path.home() / ".claude")
        return (Path(base) / "projects",)
    if runtime == "codex":
        base = os.environ.get("CODEX_HOME") or str(Path.home() / ".codex")
        return (Path(base) / "sessions",)
    return ()


def _read_tail(path: str, runtime: str) -> tuple[bytes, bool]:
    """The last bytes of the transcript at ``path`` and whether it was cut; raises
    :class:`TranscriptRefused` naming the reason, ``OSError`` when it cannot be read."""
    roots = [os.path.realpath(d) for d in transcript_dirs(runtime)]
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, root]) == root for root in roots):
        where = " or ".join(roots) or "no transcript directory"
        raise TranscriptRefused(
            f"transcript_path {path!r} is not inside {runtime}'s transcript directory "
            f"({where}); the hook reads no other file"
        )
    checked = os.stat(real)
    if not stat.S_ISREG(checked.st_mode):
        raise TranscriptRefused(f"transcript_path {path!r} is not a regular file")
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
            checked.st_dev,
            checked.st_ino,
        ):
            raise TranscriptRefused(f"transcript_path {path!r} changed while it was opened")
        start = max(0, opened.st_size - TRANSCRIPT_TAIL_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        chunks: list[bytes] = []
        left = TRANSCRIPT_TAIL_BYTES
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), start > 0
    finally:
        os.close(fd)


def last_assistant_text(path: str | os.PathLike[str], runtime: str = "claude-code") -> str | None:
    """The last assistant message in ``runtime``'s transcript at ``path``, or ``None``
    when there is none or the file is unreadable. Raises :class:`TranscriptRefused` for a
    file the hook may not read (see the module docstring)."""
    try:
        raw, cut = _read_tail(os.fspath(path), runtime)
    except OSError:
        return None
    return parse_last_assistant(raw, cut=cut)


def _text_blocks(message: Any, kinds: tuple[str, ...] = ("text",)) -> list[str]:
    if not isinstance(message, Mapping):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content] if content.strip() else []
    out = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") in kinds:
                text = block.get("text")
                if isinstance(text, str) and text.strip():
                    out.append(text)
    return out


def _assistant(entry: Mapping[str, Any]) -> tuple[object, list[str]] | None:
    """``(message id, texts)`` of an assistant entry (Claude Code: one entry per content
    block, sharing the message id; Codex rollout: one ``response_item`` per message)."""
    message = entry.get("message")
    if entry.get("type") == "assistant" and isinstance(message, Mapping):
        return message.get("id"), _text_blocks(message)
    payload = entry.get("payload")
    if (
        entry.get("type") == "response_item"
        and isinstance(payload, Mapping)
        and payload.get("type") == "message"
        and payload.get("role") == "assistant"
    ):
        return None, _text_blocks(payload, ("output_text", "text"))
    return None


def _sidechain(entry: Mapping[str, Any]) -> bool:
    """A subagent's entry in Claude Code's transcript (``isSidechain``): its prompt and
    answers are the subagent's, not the session's model's, and may be written after the
    turn's own answer (a task run in the background); they are passed over."""
    return entry.get("isSidechain") is True


def parse_last_assistant(raw: bytes, *, cut: bool = False) -> str | None:
    """The last assistant message in a JSONL transcript's bytes (``cut``: the first line
    may be partial and is skipped)."""
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    entries: list[Mapping[str, Any]] = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, Mapping) and not _sidechain(entry):
            entries.append(entry)
    msg_id: object = None
    parts: list[str] = []
    for entry in reversed(entries):
        found = _assistant(entry)
        if found is None:
            if parts:
                break
            continue
        this_id, texts = found
        if not parts:
            if texts:
                msg_id, parts = this_id, texts
            continue
        if this_id is None or this_id != msg_id:
            break
        parts = texts + parts
    return "\n".join(parts) if parts else None


#: What Claude Code writes once a turn's ``Stop`` hooks have run: an answer before one of
#: them is an earlier stop's (a hook's own ``hook_success`` is not one: a second hook of
#: the same stop may still be reading).
_TURN_ENDED = ("stop_hook_summary", "turn_duration")


def _last_answer(raw: bytes, cut: bool) -> tuple[bool, str | None, list[str]]:
    """``(behind, uuid, texts)`` of the last assistant message in Claude Code's
    transcript bytes: ``behind`` when the transcript does not show the stop's turn
    answered yet (it ends with input, a prompt, a channel push or a tool's result, or
    with a turn whose ``Stop`` hooks have run, or shows no answer at all); else the message's uuid (``None`` when it has none) and its
    text blocks."""
    lines = raw.split(b"\n")
    if cut and lines:
        lines = lines[1:]
    uuid: str | None = None
    msg_id: object = None
    parts: list[str] = []
    for line in reversed(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, Mapping) or _sidechain(entry):
            continue
        message = entry.get("message")
        if entry.get("type") == "assistant" and isinstance(message, Mapping):
            if uuid is None:
                found = entry.get("uuid")
                if not isinstance(found, str) or not found:
                    return False, None, []
                uuid, msg_id = found, message.get("id")
            elif msg_id is None or message.get("id") != msg_id:
                break
            parts = _text_blocks(message) + parts
            continue
        if uuid is not None:
            break  # the message's entries are written together
        if entry.get("type") == "user" or (
            entry.get("type") == "system" and entry.get("subtype") in _TURN_ENDED
        ):
            return True, None, []  # input the model has not answered, or a turn ended
    return uuid is None, uuid, parts


def last_assistant_uuid(raw: bytes, text: str | None, *, cut: bool = False) -> str | None:
    """The uuid Claude Code's transcript (its JSONL bytes; ``cut``: the first line may
    be partial) gives the last assistant message: what names the turn's end. ``None``
    unless the transcript plainly ends with that turn's answer: no input follows it and
    its ``Stop`` hooks have not run (the transcript would be behind the runtime, showing
    an earlier turn, which may have ended with the same words), and its text is
    ``text``, the payload's ``last_assistant_message`` (Claude Code gives the message's
    text blocks joined by line ends), when there is one. Without an id the hub tells a
    repeat by its words."""
    behind, uuid, parts = _last_answer(raw, cut)
    if behind or uuid is None:
        return None
    if text is not None and "\n".join(parts).strip() != text.strip():
        return None
    return uuid


def enrich(runtime: str, payload: Any) -> tuple[Any, str | None]:
    """``payload`` with ``last_assistant_message`` filled in from the runtime's transcript
    when a stop event lacks it, and why it could not be (or ``None``). For Claude Code's
    ``Stop`` also the channel pushes the transcript shows (``backchannel_seen``: the hub
    acks them and never hands them over again), what names the stop
    (``backchannel_stop_id``, :func:`last_assistant_uuid`: the hub tells the same stop
    reported again by it) and the Claude Code version (``backchannel_cli_version``: it
    says how a Stop answer may keep the session going).

    Never raises: what this machine's files add is a help, and no failure to read them may
    keep the event itself from the hub (the payload then goes as it came, with the
    reason)."""
    try:
        return _enrich(runtime, payload)
    except Exception as exc:  # the event must still reach the hub
        return payload, f"the transcript could not be read ({type(exc).__name__}: {exc})"


def stop_context_kept(path: str, digest: str) -> bool:
    """Whether Claude Code's transcript at ``path`` keeps the context a ``Stop`` hook
    answer added (its text's :func:`~backchannel.runtimes.seen.text_digest` is
    ``digest``): the conversation a resume rebuilds from this file shows it to the model.
    Claude Code writes it when it goes on with the answer; killed before that, the
    resumed conversation never had it. ``True`` when the file cannot be read (nothing
    then says the model lacks it)."""
    from backchannel.runtimes.seen import text_digest

    try:
        raw, _ = _read_tail(path, "claude-code")
    except (TranscriptRefused, OSError):
        return True
    for entry in _main_entries_backwards(raw):
        if (attached := _hook_context(entry, "Stop")) is not None:
            content = attached.get("content")
            parts = content if isinstance(content, list) else [content]
            texts = [p for p in parts if isinstance(p, str)]
            if digest in {text_digest(t) for t in [*texts, "\n".join(texts)]}:
                return True
    return False


def prompt_taken_back(path: str) -> bool:
    """Whether Claude Code's transcript at ``path`` shows its last prompt taken back with
    the context a ``UserPromptSubmit`` hook added to it: after that context nothing of
    the conversation came, no answer and no "[Request interrupted by user]" (Esc before
    any answer puts the prompt back in the input, and the next prompt is written after
    the one before it, so the model never sees that context). An interrupt after the
    answer began keeps the prompt, its context and the marker in the conversation. Only
    for a call of the next prompt's hook, before Claude Code writes that prompt; ``False``
    when the file cannot be read."""
    try:
        raw, _ = _read_tail(path, "claude-code")
    except (TranscriptRefused, OSError):
        return False
    for entry in _main_entries_backwards(raw):
        if entry.get("type") in ("user", "assistant"):
            return False
        if _hook_context(entry, "UserPromptSubmit") is not None:
            return True
    return False


def _main_entries_backwards(raw: bytes) -> Iterator[dict[str, Any]]:
    """The transcript's entries of the main conversation (no sidechain), last first;
    a line that is not a JSON object is passed over."""
    for line in reversed(raw.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and not _sidechain(entry):
            yield entry


def _hook_context(entry: dict[str, Any], event: str) -> dict[str, Any] | None:
    """The context a hook of ``event`` added, when ``entry`` records one."""
    attached = entry.get("attachment")
    if (
        isinstance(attached, dict)
        and attached.get("type") == "hook_additional_context"
        and attached.get("hookEvent") == event
    ):
        return attached
    return None


def _enrich(runtime: str, payload: Any) -> tuple[Any, str | None]:
    if runtime == "claude-code" and isinstance(payload, dict):
        payload = _claude_stop_extras(payload)
    if (
        runtime not in ("claude-code", "codex")
        or not isinstance(payload, dict)
        or payload.get("hook_event_name") not in ("Stop", "SubagentStop")
        or isinstance(payload.get("last_assistant_message"), str)
    ):
        return payload, None
    path = payload.get("agent_transcript_path") or payload.get("transcript_path")
    if not isinstance(path, str) or not path:
        return payload, None
    try:
        text = last_assistant_text(path, runtime)
    except TranscriptRefused as exc:
        return payload, str(exc)
    if text is None:
        return payload, None
    return {**payload, "last_assistant_message": text}, None


def _claude_stop_extras(payload: dict[str, Any]) -> dict[str, Any]:
    from backchannel.runtimes import channel_tags as tags

    if payload.get("hook_event_name") != "Stop":
        return payload
    version = tags.cli_version()
    if version and not isinstance(payload.get(tags.VERSION_FIELD), str):
        payload = {**payload, tags.VERSION_FIELD: version}
    path = payload.get("transcript_path")
    if isinstance(path, str) and path:
        given = payload.get("last_assistant_message")
        text = given if isinstance(given, str) else None
        deadline = time.monotonic() + TRANSCRIPT_WAIT_SECONDS
        while True:
            try:
                raw, cut = _read_tail(path, "claude-code")  # the same checks as for the text
            except (TranscriptRefused, OSError):
                # refused: said when the closing text is looked for, if it is; not there
                # yet: Claude Code may run the Stop hook before it first writes the file
                return payload
            # interactive Claude Code writes its transcript behind and may run the Stop
            # hook before the turn's answer is there: wait a moment for it
            if text is None or not _last_answer(raw, cut)[0] or time.monotonic() >= deadline:
                break
            time.sleep(TRANSCRIPT_POLL_SECONDS)
        tail = raw[-tags.SEEN_TAIL_BYTES :].decode("utf-8", errors="replace")
        seen = tags.channel_ids(tail)[-100:]
        if seen:
            payload = {**payload, tags.SEEN_FIELD: seen}
        stop_id = last_assistant_uuid(raw, text, cut=cut)
        if stop_id:
            payload = {**payload, tags.STOP_ID_FIELD: stop_id}
    return payload
