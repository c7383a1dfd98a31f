"""What the server-sent event routes share."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import StreamingResponse

from backchannel.errors import InvalidRequest
from backchannel.interfaces.wire import MAX_INT

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
