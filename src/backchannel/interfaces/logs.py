"""``serve --log-format json``: one JSON object per log line, for log collectors."""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message"}``, plus ``exc`` when there is a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(fmt: LogFormat, level: int = logging.WARNING) -> None:
    """Send the process's log records to stderr in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
