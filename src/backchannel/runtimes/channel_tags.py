"""What Claude Code shows of a channel push, and which Claude Code a hook runs under.

Standard library only: the lean command hook (:mod:`backchannel.interfaces.hook_command`)
reads these at every turn's end.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "SEEN_FIELD",
    "SEEN_TAIL_BYTES",
    "STOP_CONTEXT_SINCE",
    "STOP_ID_FIELD",
    "VERSION_FIELD",
    "channel_ids",
    "cli_version",
    "version_tuple",
]

#: How Claude Code shows a channel push to the model (also in the transcript, where the
#: quotes are JSON-escaped): the server's name and the message id the push carried.
_CHANNEL_TAG = re.compile(
    r'<channel source=\\?"backchannel\\?"[^>\n]{0,400}? message_id=\\?"([A-Za-z0-9._:@-]{1,200})\\?"'
)
#: Where a hook's answer lists the channel pushes the session has shown (see :func:`enrich`).
SEEN_FIELD = "backchannel_seen"
#: How much of a transcript's tail :func:`enrich` reads for channel pushes.
SEEN_TAIL_BYTES = 256 * 1024
#: Where :func:`enrich` puts the Claude Code version its hook runs under (from the
#: ``AI_AGENT=claude-code_2-1-330_harness`` Claude Code exports to its hooks).
VERSION_FIELD = "backchannel_cli_version"
#: Where :func:`enrich` puts what names a ``Stop``: the uuid Claude Code gave the turn's
#: last assistant message in its transcript (:func:`~.transcripts.last_assistant_uuid`).
STOP_ID_FIELD = "backchannel_stop_id"
#: From this version on (the first one checked), a Stop hook's
#: ``hookSpecificOutput.additionalContext`` keeps the session going as plain feedback;
#: ``decision: block`` shows the person watching a "Stop hook reported a problem".
STOP_CONTEXT_SINCE = (2, 1, 330)
_AI_AGENT = re.compile(r"^claude-code_(\d+)-(\d+)-(\d+)(?:_|$)")


def channel_ids(*texts: str) -> list[str]:
    """Message ids of the channel pushes shown in ``texts`` (a prompt, a transcript)."""
    out: dict[str, None] = {}
    for text in texts:
        for match in _CHANNEL_TAG.finditer(text):
            out[match.group(1)] = None
    return list(out)


def version_tuple(text: Any) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError:
        return ()


def cli_version(environ: Mapping[str, str] = os.environ) -> str | None:
    """The version of the Claude Code whose hook this process is, from ``AI_AGENT``."""
    found = _AI_AGENT.match(environ.get("AI_AGENT", ""))
    return ".".join(found.groups()) if found else None
