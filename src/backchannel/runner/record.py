"""The runner's record of what its models were handed and the hub has not acked yet.

A turn's inputs are leased for the whole turn and acked after its ``agent_stop``. Once
the model has answered in the turn, the inputs reached it: from then on they must never
be handed to a model again. A runner that gives up on a hub it cannot reach (after
``hub_patience``), or that is killed, may have no chance to ack them; they come back to
the queue when their lease runs out, and the member's next runner would hand them to its
model a second time.

So the runner writes their ids here before it goes on past the model's first answer,
and takes them out once the hub has acked them. A runner for the same member of the
same team on the same hub acks what it finds here before it receives anything, and a
runner that is still running acks what a stopped session left here as soon as the hub
answers again. An id the hub no longer holds (acked already, expired) answers
``not_held``: acking it again changes nothing.

One small JSON file per hub, team and member, under the user's private state directory
(:func:`backchannel.runtimes.seen.state_dir`, the command hooks' records' directory),
in ``runner/``: directory mode 0700, file 0600, replaced atomically
(:func:`backchannel.files.write_atomic`). A record that cannot be read counts as empty;
one that cannot be written is logged, and the runner goes on (the inputs may then be
handed again after a give-up, as before the record existed). One runner at a time per
member: two runners of one member write the same file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from backchannel.files import private_dirs, write_atomic
from backchannel.runtimes.seen import state_dir

__all__ = ["SeenRecord", "record_path"]

log = logging.getLogger("backchannel.runner")

_MAX_FILE = 1024 * 1024
#: More ids than this are never outstanding at once; the oldest go first beyond it.
KEEP = 2000


def record_path(where: str, team: str, member: str, folder: Path | None = None) -> Path:
    """The record of ``member`` of ``team`` on the hub at ``where``: its URL, or
    ``in-process`` for a hub the runner's own process runs, whatever its store (an id
    acked on a hub that does not hold it answers ``not_held``, and the hub's ids are
    unique, so a record shared by two such hubs acks nothing it should not)."""
    key = hashlib.sha256(json.dumps([where, team, member]).encode()).hexdigest()[:32]
    return (folder or state_dir() / "runner") / f"{key}.json"


class SeenRecord:
    """The ids one member's models were handed and the hub has not acked (see the module
    docstring). Kept in memory and written through to ``path`` on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids: dict[str, None] = dict.fromkeys(self._read())

    def _read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read(_MAX_FILE))
        except (OSError, ValueError):
            return []
        ids = data.get("handed") if isinstance(data, dict) else None
        return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []

    @property
    def ids(self) -> list[str]:
        """The outstanding ids, oldest first."""
        return list(self._ids)

    def add(self, ids: Iterable[str]) -> None:
        """Note that the model was handed ``ids``."""
        before = len(self._ids)
        self._ids.update(dict.fromkeys(ids))
        if len(self._ids) != before:
            self._write()

    def drop(self, ids: Iterable[str]) -> None:
        """Forget ``ids``: the hub has acked them."""
        gone = [i for i in ids if i in self._ids]
        for i in gone:
            del self._ids[i]
        if gone:
            self._write()

    def _write(self) -> None:
        while len(self._ids) > KEEP:
            del self._ids[next(iter(self._ids))]
        try:
            private_dirs(self.path.parent)
            if self._ids:
                write_atomic(self.path, json.dumps({"handed": list(self._ids)}), mode=0o600)
            else:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(
                "cannot write the runner's record %s (%s): inputs a model saw may be "
                "handed to it again if the runner gives up before they are acked",
                self.path,
                exc,
            )
