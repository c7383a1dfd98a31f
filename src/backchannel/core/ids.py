"""The ids a client or the hub makes for what it creates: messages, receives, requests
and sessions. A leaf module, so that a client (the CLI, the SDK over HTTP) makes them
without loading the hub."""

from __future__ import annotations

import itertools
import secrets
import time
import uuid

__all__ = ["new_message_id", "new_receive_id", "new_request_id", "new_session_id"]

_ID_PREFIX = secrets.token_hex(4)  # per process: ids from different processes never meet
_id_counter = itertools.count()


def new_message_id() -> str:
    """Time-ordered (nanoseconds, then a per-process random prefix and a counter): new
    rows land at the end of the indexes instead of all over them, which keeps commits
    small, and no system call is needed per id."""
    return f"msg_{time.time_ns():016x}{_ID_PREFIX}{next(_id_counter) & 0xFFFFFF:06x}"


def new_receive_id() -> str:
    """A name for one receive (``receive_id``): random, so no two clients share one."""
    return f"rcv_{uuid.uuid4().hex}"


def new_request_id() -> str:
    """A client's id for one call it may make again under that id (an event, a timer):
    made again, the hub answers the first answer instead of doing it twice."""
    return f"req_{uuid.uuid4().hex}"


def new_session_id(member: str) -> str:
    """A new session's id when its opener names none: ``<member>-<12 hex digits>``."""
    return f"{member}-{uuid.uuid4().hex[:12]}"
