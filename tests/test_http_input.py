"""Hostile input over a real socket against `backchannel serve`: bad JSON, deep
nesting, huge integers, names with a trailing newline, and text at the limit in any
script. Each is refused with 422 (or 413) and the error model, never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from backchannel.core.messages import check_message_id, check_name, check_session_id
from backchannel.errors import InvalidRequest
from backchannel.interfaces.http import body_limit
from backchannel.interfaces.wire import MAX_DEPTH, MAX_INT
from tests.conftest import Server, start_server

TEXT_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("input") / "home")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokens(srv: Server) -> dict[str, str]:
    return srv.team("crew", "lead", "worker")


def _error(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert isinstance(err["code"], str)
    assert isinstance(err["message"], str)
    return dict(err)


@pytest.mark.parametrize("check", [check_name, check_session_id, check_message_id])
def test_names_and_ids_are_matched_whole(check: object) -> None:
    fn = check if check is not check_name else (lambda v: check_name("member", v))
    assert callable(fn)
    assert fn("ok-1") == "ok-1"
    for bad in ("ok-1\n", "ok\n1", "\nok", "ok-1\r\n"):
        with pytest.raises(InvalidRequest):
            fn(bad)


def test_a_trailing_newline_is_refused_in_every_name_and_id(
    srv: Server, tokens: dict[str, str]
) -> None:
    with srv.client() as admin:
        assert _error(admin.post("/v1/teams", json={"name": "crew2\n"}), 422)["code"] == (
            "invalid_name"
        )
        r = admin.post("/v1/teams/crew/members", json={"name": "worker-3\n"})
        assert _error(r, 422)["code"] == "invalid_name"
        _error(admin.get("/v1/teams/crew%0A/members"), 422)
    with srv.client(tokens["lead"]) as lead:
        r = lead.post("/v1/messages", json={"to": "worker", "text": "hi", "message_id": "m-1\n"})
        assert "message_id" in _error(r, 422)["message"]
        assert lead.get("/v1/messages/m-1").status_code == 404  # nothing was kept
        _error(lead.post("/v1/messages", json={"to": "worker\n", "text": "hi"}), 422)
        _error(lead.post("/v1/sessions", json={"session_id": "s-1\n"}), 422)
        _error(lead.get("/v1/messages/m-1%0A"), 422)
        _error(lead.get("/v1/sessions/s-1%0A"), 422)


def _body_operations(spec: dict[str, object]) -> list[tuple[str, str]]:
    ops = []
    paths = spec["paths"]
    assert isinstance(paths, dict)
    for path, methods in paths.items():
        for method, op in methods.items():
            if "requestBody" in op:
                ops.append((method.upper(), path))
    return ops


def _fill(path: str) -> str:
    return (
        path.replace("{team}", "crew")
        .replace("{name}", "worker")
        .replace("{session_id}", "s-1")
        .replace("{message_id}", "m-1")
        .replace("{runtime}", "codex")
    )


# parsed by the model itself (pydantic's strict JSON, no free-form fields): a 422 all
# the same, whose message may name a field instead
FAST = ("/v1/messages", "/v1/inbox/ack", "/v1/inbox/receive")

BAD_BODIES = [
    pytest.param(b'{"text": "\\ud800"}', "not valid JSON", id="lone-surrogate"),
    pytest.param(b'{"text": "\\udc00x"}', "not valid JSON", id="lone-low-surrogate"),
    pytest.param(b'{"text": "\xff"}', "not valid JSON", id="invalid-utf8"),
    pytest.param(b'{"n": NaN}', "NaN at line 1 column 7 is not a JSON number", id="nan"),
    pytest.param(b'{"n": Infinity}', "Infinity at line 1 column 7 is not a JSON", id="infinity"),
    pytest.param(b'{"n":\n-Infinity}', "-Infinity at line 2 column 1 is not a JSON", id="-inf"),
    pytest.param(b'{"n": 1e400}', "too large for a float", id="infinite-float"),
    pytest.param(b'{"n": 1' + b"0" * 5000 + b"}", "not valid JSON", id="int-5000-digits"),
    pytest.param(
        b'{"d": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "deeper than 64", id="depth-65"
    ),
    pytest.param(b"[" * 100_000, "not valid JSON", id="depth-100000"),
    pytest.param(b'{"text": "x"', "not valid JSON", id="truncated"),
]


@pytest.mark.parametrize(("raw", "needle"), BAD_BODIES)
def test_bad_json_is_422_with_the_error_model_on_every_endpoint(
    srv: Server, tokens: dict[str, str], raw: bytes, needle: str
) -> None:
    spec = httpx.get(f"{srv.url}/openapi.json").json()
    ops = _body_operations(spec)
    assert len(ops) >= 15
    hooks = {p for _, p in ops if p.startswith("/v1/hooks/")}
    for token in (tokens["lead"], srv.admin_token):
        with srv.client(token) as c:
            for method, path in ops:
                r = c.request(
                    method, _fill(path), content=raw, headers={"content-type": "application/json"}
                )
                if path in hooks and r.status_code == 200:
                    # a hook never blocks its agent: it answers {} and says why, unused
                    assert r.json() == {}
                    continue
                if r.status_code in (401, 403) and path in hooks:
                    continue
                err = _error(r, 422)
                if path not in FAST:
                    assert needle in err["message"], (method, path, err)
    with srv.client() as admin:
        assert admin.get("/healthz").status_code == 200


def test_nesting_up_to_the_limit_is_kept(srv: Server, tokens: dict[str, str]) -> None:
    # team settings are free-form JSON with no limit of their own: the body's depth counts
    deep: object = "end"
    for _ in range(MAX_DEPTH - 2):  # the body and "settings" are two levels
        deep = [deep]
    with srv.client() as admin:
        r = admin.post("/v1/teams", json={"name": "deep-ok", "settings": {"d": deep}})
        assert r.status_code == 201, r.text
        r = admin.post("/v1/teams", json={"name": "deep-no", "settings": {"d": [deep]}})
        assert "deeper than 64" in _error(r, 422)["message"]
        names = [t["name"] for t in admin.get("/v1/teams").json()["teams"]]
        assert "deep-ok" in names and "deep-no" not in names


def test_integer_body_fields_are_bounded_and_free_form_numbers_kept(
    srv: Server, tokens: dict[str, str]
) -> None:
    with srv.client(tokens["lead"]) as lead:
        for budget in (MAX_INT + 1, 2**64, 0, 1001):
            r = lead.post("/v1/messages", json={"to": "worker", "text": "x", "link_budget": budget})
            assert "link_budget" in str(_error(r, 422)["message"])
    with srv.client(tokens["worker"]) as w:
        sid = w.post("/v1/sessions", json={}).json()["session_id"]
        w.post(f"/v1/sessions/{sid}/events", json={"kind": "turn_start"}).raise_for_status()
        # free-form JSON has no integer bound: kept exactly as written
        data = {"ns": 1_700_000_000_123_456_789, "big": 2**70, "neg": -(2**64), "f": 1e300}
        r = w.post(
            f"/v1/sessions/{sid}/events", json={"kind": "tool_call", "text": "t", "data": data}
        )
        assert r.status_code == 200, r.text
        events = w.get(f"/v1/sessions/{sid}/transcript").json()["events"]
        assert [e["data"] for e in events if e["kind"] == "tool_call"] == [data]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/timers/9223372036854775808",
        "/v1/timers/99999999999999999999999",
        "/v1/timers/0",
    ],
)
def test_integer_path_out_of_range_is_422(srv: Server, tokens: dict[str, str], path: str) -> None:
    with srv.client(tokens["lead"]) as lead:
        _error(lead.delete(path), 422)
        _error(lead.delete("/v1/timers/9223372036854775807"), 404)


@pytest.mark.parametrize("value", [str(MAX_INT + 1), "1" + "0" * 30, "-1", "1e3", "x"])
def test_integer_query_out_of_range_is_422(srv: Server, tokens: dict[str, str], value: str) -> None:
    with srv.client(tokens["worker"]) as w:
        sid = w.post("/v1/sessions", json={}).json()["session_id"]
        for name in ("since", "until"):
            _error(w.get(f"/v1/sessions/{sid}/transcript", params={name: value}), 422)
        _error(w.get("/v1/teams/crew/events", params={"after": value}), 422)
        assert w.get(f"/v1/sessions/{sid}/transcript", params={"since": MAX_INT}).status_code == 200
    with srv.client() as admin:
        _error(admin.get("/v1/dashboard/teams/crew/stream?ticket=x", params={"after": value}), 422)


def test_timer_durations_are_bounded(srv: Server, tokens: dict[str, str]) -> None:
    with srv.client(tokens["lead"]) as lead:
        for field, value in (
            ("minutes", 1e300),
            ("seconds", 1e308),
            ("minutes", -1),
            ("seconds", 0.01),  # under a second: a timer re-set on each firing would spin
            ("minutes", 0.001),
        ):
            r = lead.post(
                "/v1/timers", json={"intent": "anchor", field: value, "note": "back to work"}
            )
            err = _error(r, 422)
            assert field in json.dumps(err), err  # refused for its duration, not elsewhere


# -- the text limit counts the text, not its escaping ------------------------------


@pytest.mark.parametrize(
    "char",
    [
        pytest.param("x", id="ascii"),
        pytest.param("é", id="2-byte"),
        pytest.param("語", id="3-byte"),
        pytest.param("😀", id="4-byte"),
        pytest.param("\x01", id="control"),
        pytest.param('"', id="quote"),
    ],
)
def test_text_at_the_limit_passes_however_it_is_escaped(
    srv: Server, tokens: dict[str, str], char: str
) -> None:
    size = len(char.encode())
    text = char * (TEXT_LIMIT // size)
    assert len(text.encode()) <= TEXT_LIMIT
    raw = json.dumps({"to": "worker", "text": text}, ensure_ascii=True).encode()
    assert len(raw) <= body_limit(TEXT_LIMIT)
    with srv.client(tokens["lead"]) as lead:
        r = lead.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text[:300]
        over = json.dumps(
            {"to": "worker", "text": text + "x" * (TEXT_LIMIT - len(text.encode()) + 1)},
            ensure_ascii=True,
        ).encode()
        err = _error(
            lead.post("/v1/messages", content=over, headers={"content-type": "application/json"}),
            413,
        )
        assert f"{TEXT_LIMIT + 1} bytes" in str(err["message"])
        assert err["limit"] == TEXT_LIMIT


def test_a_chunked_body_over_the_limit_is_413_without_a_false_size(
    srv: Server, tokens: dict[str, str]
) -> None:
    limit = body_limit(TEXT_LIMIT)
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        yield b'{"to": "worker", "text": "'
        for _ in range(64):
            sent += 64 * 1024
            yield b"x" * (64 * 1024)
        yield b'"}'

    with srv.client(tokens["lead"]) as lead:
        r = lead.post(
            "/v1/messages", content=chunks(), headers={"content-type": "application/json"}
        )
        err = _error(r, 413)
        assert err["limit"] == limit
        assert "at least" in str(err["message"])


def test_nan_and_infinity_are_named_with_the_way_out_wherever_json_is_read() -> None:
    """Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default: the parser's
    "expected value" would leave a caller guessing, so the literal is named (its line and
    column in bytes, as the parser counts) with what to send instead."""
    from backchannel.interfaces.strict import parse_json

    for raw, literal, where in [
        (b'{"a": NaN}', "NaN", "line 1 column 7"),
        (b'{"\xc3\xa9": [1, Infinity]}', "Infinity", "line 1 column 12"),
        (b'{"a":\n  -Infinity}', "-Infinity", "line 2 column 3"),
        (b'{"a": -NaN}', "-NaN", "line 1 column 7"),
    ]:
        with pytest.raises(json.JSONDecodeError) as exc:
            parse_json(raw)
        assert exc.value.msg == (
            f"{literal} at {where} is not a JSON number (JSON has no NaN or Infinity); "
            "send a finite number, a string or null"
        ), raw
    # other errors keep the parser's own words
    with pytest.raises(json.JSONDecodeError, match="expected value at line 1 column 7"):
        parse_json(b'{"a": Nope}')
    with pytest.raises(json.JSONDecodeError, match="EOF"):
        parse_json(b'{"a": ')


WRONG_TYPES = [
    pytest.param({"content-type": "text/plain"}, id="text-plain"),
    pytest.param({"content-type": "application/x-www-form-urlencoded"}, id="form"),
    pytest.param({"content-type": "multipart/form-data; boundary=x"}, id="multipart"),
    pytest.param({}, id="none"),
]


@pytest.mark.parametrize("headers", WRONG_TYPES)
def test_a_json_body_under_another_content_type_is_refused_on_every_endpoint(
    srv: Server, headers: dict[str, str]
) -> None:
    """The fast paths (a send, an ack, a receive, their batches) refuse a JSON body sent
    as text or a form as the documented routes do: 422 naming the content type to use,
    and nothing done (no message kept, none leased, none acked)."""
    team = "typed-" + (headers.get("content-type", "none").split(";")[0].replace("/", "-"))
    team = team.replace(".", "-")[:60]
    tok = srv.team(team, "a", "b")
    mid = f"typed-{team}"
    with srv.client(tok["a"]) as a:
        r = a.post("/v1/messages", json={"to": "b", "text": "held", "message_id": mid})
        assert r.status_code == 201, r.text
    refused = "send one with Content-Type: application/json"
    with srv.client(tok["b"]) as b:
        documented = _error(
            b.post("/v1/sessions", content=json.dumps({"session_id": "s-1"}), headers=headers),
            422,
        )
        assert refused in str(documented["message"])
        bodies = {
            "/v1/messages": {"to": "a", "text": "hi", "message_id": mid + "-x"},
            "/v1/messages/batch": {
                "messages": [{"to": "a", "text": "hi", "message_id": mid + "-y"}]
            },
            "/v1/inbox/receive": {"limit": 10},
            "/v1/inbox/ack": {"message_ids": [mid]},
            "/v1/inbox/ack/batch": {"message_ids": [mid]},
        }
        for path, body in bodies.items():
            err = _error(b.post(path, content=json.dumps(body), headers=headers), 422)
            assert err == documented, (path, err)
        assert b.get(f"/v1/messages/{mid}-x").status_code == 404  # nothing was sent
        assert b.get(f"/v1/messages/{mid}-y").status_code == 404
        # the message is neither leased nor acked: a receive in JSON gets it
        r = b.post("/v1/inbox/receive", json={"limit": 10})
        assert r.status_code == 200, r.text
        assert [m["message_id"] for m in r.json()["messages"]] == [mid]
        # JSON with parameters, and a +json type, pass
        for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
            r = b.post(
                "/v1/inbox/ack",
                content=json.dumps({"message_ids": [mid]}),
                headers={"content-type": kind},
            )
            assert r.status_code == 200, (kind, r.text)
