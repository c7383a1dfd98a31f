"""schemathesis hooks for tests/test_openapi_fuzz.py (loaded by SCHEMATHESIS_HOOKS).

- A long-poll may wait up to an hour by design; the fuzzer's requests wait at most a
  fraction of a second (``wait`` in a query or a JSON body), so a run stays short and
  no request times out.
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


def _short_wait(query: Any) -> None:
    # the coverage phase may give the number as text
    if isinstance(query, dict) and "wait" in query:
        try:
            wait = float(query["wait"])
        except (TypeError, ValueError):
            return
        if wait > 0.2:
            query["wait"] = 0.2


@schemathesis.hook
def map_query(ctx: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    _short_wait(query)
    return query


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    _short_wait(body)
    return body


@schemathesis.hook
def map_path_parameters(ctx: Any, path: dict[str, Any] | None) -> dict[str, Any] | None:
    team = os.environ.get("FUZZ_TEAM")
    value = (path or {}).get("team")
    if path and team and isinstance(value, str) and re.fullmatch(NAME_PATTERN, value):
        path["team"] = team
    return path


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    # cases of the coverage and stateful phases do not all pass through map_query
    _short_wait(case.query)
    _short_wait(case.body)
