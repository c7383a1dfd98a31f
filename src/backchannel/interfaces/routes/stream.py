"""What the server-sent event routes share."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import StreamingResponse

from backchannel.errors import EventsSkipped, InvalidRequest
from backchannel.interfaces.wire import MAX_INT

if TYPE_CHECKING:
    from backchannel.hub import Hub

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """Server-sent events (so the OpenAPI document names the media type)."""

    media_type = "text/event-stream"


def resume_after(request: Request, after: int) -> int:
    """The cursor a feed stream starts after: ``after`` (the query), or the
    ``Last-Event-ID`` a reconnecting ``EventSource`` sends (the ``id:`` of the last event
    it saw) when that is later. An ``EventSource`` reconnects to the URL it first opened,
    so without the header it would be sent again all it saw. A header that is no cursor
    is refused, not ignored: ignored, the stream would start over from ``after`` and
    repeat what the client saw."""
    raw = request.headers.get("last-event-id", "").strip()
    if not raw:
        return after
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= MAX_INT):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise InvalidRequest(
            f"Last-Event-ID {shown!r} is not a cursor of this stream (a whole number from "
            f"0 to {MAX_INT}, the id: of an event it sent); reconnect without the header, "
            "with ?after= set to the cursor of the last event you saw",
            field="Last-Event-ID",
        )
    return max(after, int(raw))


async def check_cursor(hub: Hub, team: str, request: Request, after: int) -> int:
    """``after`` (from :func:`resume_after`), refused when it is past the team's newest
    event: such a cursor was never sent by this store (the store was restored from a
    backup, or reset, since the client saw it), and a stream after it would stay empty
    however many events came, since the new ones are numbered below it. The refusal
    names the newest cursor, so the client can fetch the team's state again and go on
    from there."""
    if after == 0:
        return after
    newest = await hub.feed_start(team, 0)
    if after <= newest:
        return after
    header = request.headers.get("last-event-id", "").strip()
    field = "Last-Event-ID" if header and int(header) == after else "after"
    raise InvalidRequest(
        f"{field} {after} is past the newest event of team {team!r} ({newest}): this "
        "store never sent it (it was restored or reset since); read the team's state "
        f"again and reconnect with ?after={newest} and without Last-Event-ID",
        field=field,
    )


async def skipped(hub: Hub, team: str, after: int) -> str | None:
    """The event a resumed stream starts with when retention removed events after its
    cursor (the team's :meth:`~backchannel.stores.base.Tx.feed_removed` is past it):
    ``event: skipped``, its ``id:`` the last cursor removed (a reconnecting
    ``EventSource`` goes on after it, told), its data the ``events_skipped`` error
    naming the cursors between which events are gone. What the client built from the
    events it saw is missing some: it reads the team's state again. None for a stream
    from 0 (it asked for what there is) or when nothing after ``after`` was removed."""
    if after == 0:
        return None
    through = await hub.feed_removed(team)
    if through <= after:
        return None
    error = EventsSkipped(
        f"events of team {team!r} after cursor {after} up to {through} were removed by "
        "retention before this stream could send them: read the team's state again "
        "(members, messages you wait for); the stream goes on after them",
        after=after,
        through=through,
    )
    return f"event: skipped\nid: {through}\ndata: {json.dumps(error.to_json())}\n\n"
