"""What the server-sent event routes share."""

from __future__ import annotations

from fastapi.responses import StreamingResponse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """Server-sent events (so the OpenAPI document names the media type)."""

    media_type = "text/event-stream"
