"""The command hook's record of what each runtime session was shown, on the agent's machine.

A message handed over in a hook answer stays leased on the hub until the session's next
hook event confirms it (:mod:`backchannel.runtimes.receiver`). The command hook
(``backchannel hook``) is the runtime side of that: after it has printed an answer that
hands messages over, it writes their ids here (the hub names them in the
:data:`DELIVERED_HEADER` response header), and every later hook call of the same runtime
session sends the record along as :data:`HAD_FIELD`. The hub acks the ids it lists and
never shows them to the session again, even when a copy comes back after its lease (the
session died before its next event, then was resumed); a handed-over id the record lacks
was never printed, so the hub hands it over again.

The record is one small JSON file per runtime session under the user's private state
directory (``$BACKCHANNEL_STATE_DIR``, else ``$XDG_STATE_HOME/backchannel/seen``, else
``~/.local/state/backchannel/seen``): directory mode 0700, files 0600, replaced
atomically under a lock on the directory (hooks of one session may run at once), the last
:data:`KEEP` ids. A record that cannot be read counts as empty; one
that cannot be written is skipped (the hub then shows the messages again rather than
lose them).

Standard library only: the lean command hook imports this on every call.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from backchannel.files import private_dirs, write_atomic

__all__ = [
    "DELIVERED_HEADER",
    "HAD_FIELD",
    "KEEP",
    "add_record",
    "delivered_ids",
    "forget_prompt",
    "forget_stop",
    "prompt_ids",
    "recorded",
    "remember",
    "session_lock",
    "state_dir",
    "stop_ids",
    "text_digest",
]

#: Response header of ``POST /v1/hooks/{runtime}``: the ids its answer hands over (JSON list).
DELIVERED_HEADER = "Backchannel-Delivered"
#: Where a hook payload lists the ids its session was already shown (see the docstring).
HAD_FIELD = "backchannel_had"
#: How many ids one session's record keeps (the newest).
KEEP = 200
_MAX_FILE = 64 * 1024


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    explicit = environ.get("BACKCHANNEL_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "backchannel" / "seen"


def _path(runtime: str, session_id: str) -> Path:
    # quoted, not hashed: importing hashlib costs the hook ~3 ms
    key = urllib.parse.quote(f"{runtime}_{session_id}", safe="-_.")
    if len(key) > 200:
        import hashlib

        key = f"{runtime}_{hashlib.sha256(session_id.encode()).hexdigest()}"
    return state_dir() / f"{key}.json"


def recorded(runtime: str, session_id: str) -> list[str]:
    """The ids session ``session_id`` of ``runtime`` was shown, oldest first."""
    try:
        with open(_path(runtime, session_id), "rb") as f:
            data = json.loads(f.read(_MAX_FILE))
    except (OSError, ValueError):
        return []
    ids = data.get("ids") if isinstance(data, dict) else None
    return [i for i in ids if isinstance(i, str)][-KEEP:] if isinstance(ids, list) else []


def _read(runtime: str, session_id: str) -> dict[str, Any]:
    try:
        with open(_path(runtime, session_id), "rb") as f:
            data = json.loads(f.read(_MAX_FILE))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def prompt_ids(runtime: str, session_id: str) -> list[str]:
    """The ids the session's last answer handed over, when that answer was a prompt's
    (``UserPromptSubmit``); else none."""
    ids = _read(runtime, session_id).get("prompt")
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def stop_ids(runtime: str, session_id: str) -> tuple[list[str], str]:
    """The ids the session's last answer handed over when that answer was a stop's
    continuation, and the digest of the text it printed (:func:`text_digest`); else
    none."""
    stop = _read(runtime, session_id).get("stop")
    if not isinstance(stop, dict) or not isinstance(stop.get("ids"), list):
        return [], ""
    digest = stop.get("digest")
    ids = [i for i in stop["ids"] if isinstance(i, str)]
    return ids, digest if isinstance(digest, str) else ""


def text_digest(text: str) -> str:
    """What a stop record keeps of the text an answer printed."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def remember(
    runtime: str,
    session_id: str,
    ids: Iterable[str],
    *,
    prompt: bool = False,
    stop_text: str | None = None,
) -> None:
    """Add ``ids`` to the session's record, noting whether a prompt's answer
    (``prompt``) handed them over (:func:`forget_prompt`), or a stop's continuation
    whose text was ``stop_text`` (:func:`forget_stop`); never raises."""
    new = [i for i in ids if isinstance(i, str)]
    if not new:
        return
    try:
        path = _path(runtime, session_id)
        private_dirs(path.parent)
        with _locked(path.parent):
            keep = list(dict.fromkeys([*recorded(runtime, session_id), *new]))[-KEEP:]
            data: dict[str, Any] = {"ids": keep} | ({"prompt": new} if prompt else {})
            if stop_text is not None:
                data["stop"] = {"ids": new, "digest": text_digest(stop_text)}
            write_atomic(path, json.dumps(data), mode=0o600)
    except OSError:
        return


def forget_stop(runtime: str, session_id: str) -> list[str]:
    """Take the ids the session's last stop answer handed over out of its record, and
    return them: the runtime process died before its conversation kept that
    continuation (Claude Code killed while its model worked on it, then resumed), so the
    resumed conversation never had them and the hub is to hand them over again. Never
    raises."""
    try:
        path = _path(runtime, session_id)
        with _locked(path.parent):
            gone, _ = stop_ids(runtime, session_id)
            if gone:
                keep = [i for i in recorded(runtime, session_id) if i not in gone]
                write_atomic(path, json.dumps({"ids": keep}), mode=0o600)
            return gone
    except OSError:
        return []


def forget_prompt(runtime: str, session_id: str) -> list[str]:
    """Take the ids the session's last prompt answer handed over out of its record, and
    return them: the runtime took that prompt back with its context before the model
    answered (Claude Code's Esc before any answer puts the prompt back in the input), so
    the session never had them and the hub is to hand them over again. Never raises."""
    try:
        path = _path(runtime, session_id)
        with _locked(path.parent):
            gone = prompt_ids(runtime, session_id)
            if gone:
                keep = [i for i in recorded(runtime, session_id) if i not in gone]
                write_atomic(path, json.dumps({"ids": keep}), mode=0o600)
            return gone
    except OSError:
        return []


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the record directory: two hook processes of one
    session (a Stop and a UserPromptSubmit hook at once) each read the record, add their
    ids and write it back, and without the lock the later write drops the earlier one's
    ids, which the hub then hands over, and the session shows, again. One lock for the
    directory rather than a lock file per session: it is held for one small read and
    write, and leaves nothing behind."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the flock


@contextlib.contextmanager
def session_lock(runtime: str, session_id: str, wait: float) -> Iterator[bool]:
    """Hold the lock of one runtime session's hook calls for as long as the ``with``
    lasts, waiting up to ``wait`` s for it; yields whether it holds it (without it, the
    call goes on as before: the lock is for never-twice, and the agent must not wait).

    A hook call reads the record, asks the hub, prints and then adds what it printed;
    the hub takes an id the record lacks for one that was never printed and hands it
    over again. A second hook of the session (a UserPromptSubmit hook while the Stop
    hook's answer is on its way) that read the record before the first one wrote it
    would have the hub put back what the first one is printing. Held across the whole
    call, the lock makes the second read what the first printed."""
    fd = -1
    try:
        path = _path(runtime, session_id)
        private_dirs(path.parent)
        fd = os.open(
            path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        until = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise
                time.sleep(0.01)
    except OSError:
        if fd >= 0:
            os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)  # drops the flock


def add_record(runtime: str, payload: Any) -> Any:
    """``payload`` with :data:`HAD_FIELD` added (the session's record, maybe empty), when it
    names a session; the field also tells the hub that this hook keeps a record."""
    if not isinstance(payload, dict) or HAD_FIELD in payload:
        return payload
    sid = payload.get("session_id")
    if not isinstance(sid, str) or not sid:
        return payload
    return {**payload, HAD_FIELD: recorded(runtime, sid)}


def delivered_ids(header: str | None) -> list[str]:
    """The ids a :data:`DELIVERED_HEADER` value names."""
    if not header:
        return []
    try:
        ids = json.loads(header)
    except ValueError:
        return []
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
