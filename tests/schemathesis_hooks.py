"""schemathesis hooks for tests/test_openapi_fuzz.py (loaded by SCHEMATHESIS_HOOKS).

- A long-poll may wait up to an hour by design; the fuzzer's requests wait at most a
  fraction of a second, so a run stays short and no request times out.
- A valid team name in a path becomes the team the run set up ($FUZZ_TEAM), so those
  calls reach the hub's logic instead of all answering 404. Invalid names are left as
  drawn: they are the negative cases.
"""

from __future__ import annotations

import os
import re
from typing import Any

import schemathesis

from backchannel.types import NAME_PATTERN


@schemathesis.hook
def map_query(ctx: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    if query and isinstance(query.get("wait"), (int, float)) and query["wait"] > 0.2:
        query["wait"] = 0.2
    return query


@schemathesis.hook
def map_path_parameters(ctx: Any, path: dict[str, Any] | None) -> dict[str, Any] | None:
    team = os.environ.get("FUZZ_TEAM")
    value = (path or {}).get("team")
    if path and team and isinstance(value, str) and re.fullmatch(NAME_PATTERN, value):
        path["team"] = team
    return path
