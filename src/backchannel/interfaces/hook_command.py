"""The lean path of ``backchannel hook``: a runtime runs it around every turn and tool
call, so it must cost next to nothing.

It imports only the standard library and the runtime's payload module, reads the hook
JSON, adds the session's record of what hook answers showed it
(:mod:`backchannel.runtimes.seen`), POSTs it to the hub's ``/v1/hooks/{runtime}``, prints
the answer, and only then records the ids the answer handed over. When the hub
is not a running server (the CLI then applies hooks on the data directory's store), or
the arguments are anything but the plain form, :func:`run` returns ``None`` and the full
CLI takes over, with the same behaviour as ever: always exit 0, print a JSON object,
say on stderr why a call had no effect.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

RUNTIMES = ("claude-code", "codex", "gemini")
PROBLEM_HEADER = "Backchannel-Hook-Problem"  # the same as runtimes.common.PROBLEM_HEADER
DELIVERED_HEADER = "Backchannel-Delivered"  # the same as runtimes.seen.DELIVERED_HEADER
_OPTIONS = {"--as": "as", "--url": "url", "--token": "token", "--home": "home"}
#: The flag that has the hook make sure a keeper beats for its runtime
#: (:mod:`backchannel.runtimes.keeper`; the same as ``keeper.FLAG``).
KEEP_ALIVE = "--keep-alive"
#: How long one hook call waits for the hub, connecting and answering together. A
#: runtime kills a hook at its timeout (``backchannel attach`` gives 30 s) and shows the
#: agent an error; a hub that answers a hook at all does so in milliseconds, so a hub
#: that has not answered by then is wedged, and the hook answers ``{}`` and says so. What
#: the hub may have handed out meanwhile is never printed, so it is not recorded, and the
#: session's next hook call gives it back.
DEADLINE_S = 10.0


def _parse(argv: Sequence[str]) -> dict[str, str] | None:
    """``RUNTIME [PAYLOAD] [--as X] [--url U] [--token T] [--home H] [--keep-alive]``,
    else ``None``."""
    out: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if arg == KEEP_ALIVE:
            out["keep_alive"] = "1"
        elif key in _OPTIONS:
            if not eq:
                if not args:
                    return None
                value = args.pop(0)
            out[_OPTIONS[key]] = value
        elif arg.startswith("-"):
            return None  # --help and friends: the full CLI
        elif "runtime" not in out:
            out["runtime"] = arg
        elif "payload" not in out:
            out["payload"] = arg
        else:
            return None
    return out if "runtime" in out else None


def _hub_url(opts: dict[str, str]) -> str | None:
    url = opts.get("url") or os.environ.get("BACKCHANNEL_URL")
    if url:
        return url if url[:8].lower().startswith(("http://", "https://")) else None
    home = Path(opts.get("home") or os.environ.get("BACKCHANNEL_HOME") or ".backchannel")
    try:
        info = json.loads((home.absolute() / "server.json").read_text())
        pid = info.get("pid")
        if isinstance(pid, int):
            os.kill(pid, 0)  # a server.json left by a server that died does not count
    except (OSError, ValueError, AttributeError):
        return None
    found = info.get("url")
    return found if isinstance(found, str) and found.startswith("http") else None


def _through_proxy(url: str) -> bool:
    """The hub at ``url`` is reached through the proxy the environment names: a hub
    elsewhere, with ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` set. The few lines of
    HTTP here go straight to the hub, so the full CLI (httpx, which honours the proxy and
    ``NO_PROXY``) takes such a call; a hub on this machine is never reached through a
    proxy (:mod:`backchannel.reach`)."""
    if not any(k.lower() in ("http_proxy", "https_proxy", "all_proxy") for k in os.environ):
        return False  # the usual case, told without importing anything
    from backchannel.reach import loopback, proxy_named

    return proxy_named(url) and not loopback(url)


def _enrich(runtime: str, raw: str, payload: Any) -> tuple[bytes, str | None, str | None]:
    """The payload (``raw``, parsed) with the closing text read from this machine's
    transcript when it lacks it (the hub never reads a file a hook names) and the
    session's record of what it was shown and the runtime process it runs under
    (:mod:`backchannel.runtimes.liveness`); why the text could not be read; the runtime
    session id."""
    from backchannel.runtimes import liveness, seen
    from backchannel.runtimes.transcripts import enrich

    if payload is _UNPARSED:  # a bad payload goes as it is: the hub says what is wrong
        return raw.encode("utf-8", "surrogateescape"), None, None
    filled, note = enrich(runtime, payload)
    _taken_back(runtime, filled)
    _lost_with_process(runtime, filled)
    filled = liveness.add_runtime(seen.add_record(runtime, filled))
    body = raw if filled is payload else json.dumps(filled)
    sid = filled.get("session_id") if isinstance(filled, dict) else None
    return body.encode("utf-8", "surrogateescape"), note, sid if isinstance(sid, str) else None


def _taken_back(runtime: str, payload: Any) -> None:
    """For Claude Code's ``UserPromptSubmit``: when the session's last answer was the
    previous prompt's, and the transcript shows that prompt taken back before the model
    answered (Esc), its ids leave the session's record, so the hub hands them over again
    rather than ack copies the model never saw. Never raises."""
    if runtime != "claude-code" or not isinstance(payload, dict):
        return
    sid, path = payload.get("session_id"), payload.get("transcript_path")
    if payload.get("hook_event_name") != "UserPromptSubmit" or not isinstance(sid, str):
        return
    from backchannel.runtimes import seen

    try:
        if not seen.prompt_ids(runtime, sid) or not isinstance(path, str) or not path:
            return
        from backchannel.runtimes.transcripts import prompt_taken_back

        if prompt_taken_back(path):
            seen.forget_prompt(runtime, sid)
    except Exception:  # what this machine's files add is a help; the event goes on
        return


def _lost_with_process(runtime: str, payload: Any) -> None:
    """For Claude Code's ``SessionStart`` of a process taking a conversation up (source
    ``resume`` or ``startup``): when the session's last answer was a ``Stop`` hook's
    continuation and the transcript does not keep it (the process was killed while its
    model worked on it), its ids leave the session's record, so the hub hands them over
    again rather than ack copies the resumed conversation never had. Never raises."""
    if runtime != "claude-code" or not isinstance(payload, dict):
        return
    sid, path = payload.get("session_id"), payload.get("transcript_path")
    if payload.get("hook_event_name") != "SessionStart" or not isinstance(sid, str):
        return
    if payload.get("source") not in ("resume", "startup"):
        return
    from backchannel.runtimes import seen

    try:
        ids, digest = seen.stop_ids(runtime, sid)
        if not ids or not digest or not isinstance(path, str) or not path:
            return
        from backchannel.runtimes.transcripts import stop_context_kept

        if not stop_context_kept(path, digest):
            seen.forget_stop(runtime, sid)
    except Exception:  # what this machine's files add is a help; the event goes on
        return


def _post(url: str, runtime: str, body: bytes, token: str, expect: str | None) -> Any:
    """POST the payload; returns ``(status, body, problem header, delivered header)``. A few lines of
    HTTP/1.1 on a socket: ``urllib`` and ``http.client`` would cost the hook more to
    import than the whole round trip to a local hub takes."""
    if any(c in token for c in "\r\n") or (expect and any(c in expect for c in "\r\n")):
        raise ValueError("the token or --as holds a line break")
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    query = "?" + urllib.parse.urlencode({"as": expect}) if expect else ""
    path = f"{parts.path.rstrip('/')}/v1/hooks/{runtime}{query}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
        f"Authorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    deadline = time.monotonic() + DEADLINE_S

    def left() -> float:  # a timeout per step would let a hub that trickles hold us
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    try:
        sock = socket.create_connection((host, port), timeout=left())
        try:
            if secure:
                import ssl

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            sock.settimeout(left())
            sock.sendall(head.encode("latin-1") + body)
            chunks = []
            while True:
                sock.settimeout(left())
                if not (data := sock.recv(65536)):
                    break
                chunks.append(data)
        finally:
            sock.close()
    except TimeoutError:
        raise HubTooSlow(f"the hub at {url} did not answer within {DEADLINE_S:g} s") from None
    return _response(b"".join(chunks))


class HubTooSlow(Exception):
    """The hub took the call and did not answer within :data:`DEADLINE_S`."""


def _response(raw: bytes) -> tuple[int, bytes, str | None, str | None]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    return status, body, headers.get(PROBLEM_HEADER.lower()), headers.get(DELIVERED_HEADER.lower())


def read_payload(stdin: Any) -> str:
    """The hook JSON on ``stdin``, read as UTF-8 (JSON's encoding) whatever the locale
    says: a runtime started under ``PYTHONIOENCODING=ascii``, or the C locale with UTF-8
    mode off, made the first accented prompt a UnicodeDecodeError, and the hook answered
    ``{}``. Bytes that are not UTF-8 are kept as they came (``surrogateescape``) for the
    hub to refuse by name."""
    buffer = getattr(stdin, "buffer", None)
    if buffer is None:  # already text (a test's StringIO)
        return str(stdin.read())
    return bytes(buffer.read()).decode("utf-8", "surrogateescape")


class Answer(NamedTuple):
    """One forwarded hook call: what to print, why it had no effect, and what to record
    once it is printed (the ids it hands over to runtime session ``session``)."""

    result: dict[str, Any]
    problem: str | None
    session: str | None = None
    delivered: str | None = None


_UNPARSED = object()


def answer(opts: dict[str, str], url: str, stdin: Any, hold: contextlib.ExitStack) -> Answer:
    """Forward one hook call; ``hold`` keeps the session's hook lock
    (:func:`~backchannel.runtimes.seen.session_lock`) until the answer is printed and
    recorded."""
    runtime = opts["runtime"]
    if runtime not in RUNTIMES:
        return Answer({}, f"unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}")
    token = opts.get("token") or os.environ.get("BACKCHANNEL_TOKEN")
    if not token:
        return Answer({}, "BACKCHANNEL_TOKEN is not set; export this agent's member token")
    raw = opts["payload"] if "payload" in opts else read_payload(stdin)
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = _UNPARSED
    sid = parsed.get("session_id") if isinstance(parsed, dict) else None
    if isinstance(sid, str) and sid:
        from backchannel.runtimes import seen

        hold.enter_context(seen.session_lock(runtime, sid, wait=DEADLINE_S))
    payload, note, session = _enrich(runtime, raw, parsed)
    try:
        status, body, problem, delivered = _post(url, runtime, payload, token, opts.get("as"))
    except HubTooSlow as exc:
        return Answer({}, f"{exc}; the agent goes on without it")
    except (OSError, ValueError, IndexError) as exc:
        return Answer({}, unreachable(url, exc))
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if status >= 400 or not isinstance(data, dict):
        from backchannel.reach import not_the_hub

        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return Answer({}, f"hub answered {status}: {error['message']}")
        return Answer({}, f"the hub at {url} did not answer the hook: {not_the_hub(status, body)}")
    return Answer(data, problem or note, session, delivered)


def unreachable(url: str, exc: BaseException) -> str:
    """Why the hub at ``url`` could not be had, and the way out."""
    from backchannel.reach import untrusted_certificate

    why = untrusted_certificate(exc)
    if why is not None:
        return f"the hub at {url} was not used: {why}"
    return f"cannot reach the hub at {url}: {exc}; is `backchannel serve` running there?"


def run(argv: Sequence[str]) -> bool:
    """Handle ``backchannel hook ...`` here if it can be; False hands it to the full CLI."""
    opts = _parse(argv)
    if opts is None:
        return False
    url = _hub_url(opts)
    if url is None or _through_proxy(url):
        return False
    with contextlib.ExitStack() as hold:
        try:
            got = answer(opts, url, sys.stdin, hold)
        except Exception as exc:  # a broken hook must never block the agent
            got = Answer({}, f"internal error: {type(exc).__name__}: {exc}")
        print(json.dumps(got.result), flush=True)
        if got.session and got.delivered:  # printed: now the session has them
            from backchannel.runtimes import seen

            spec = got.result.get("hookSpecificOutput")
            prompt = isinstance(spec, dict) and spec.get("hookEventName") == "UserPromptSubmit"
            ids = seen.delivered_ids(got.delivered)
            stop_text = _stop_text(opts["runtime"], got.result)
            seen.remember(opts["runtime"], got.session, ids, prompt=prompt, stop_text=stop_text)
    if "keep_alive" in opts:  # after the answer: the runtime need not wait for it
        keep_alive(url, opts.get("token") or os.environ.get("BACKCHANNEL_TOKEN"))
    if got.problem:
        print(f"backchannel hook {opts['runtime']}: {got.problem}", file=sys.stderr, flush=True)
    return True


def _stop_text(runtime: str, result: Any) -> str | None:
    """The text a Claude Code ``Stop`` answer printed (its continuation's context), for
    :func:`_lost_with_process`; ``None`` for any other answer."""
    if runtime != "claude-code" or not isinstance(result, dict):
        return None
    spec = result.get("hookSpecificOutput")
    if isinstance(spec, dict) and spec.get("hookEventName") == "Stop":
        text = spec.get("additionalContext")
        return text if isinstance(text, str) else None
    reason = result.get("reason")
    return reason if result.get("decision") == "block" and isinstance(reason, str) else None


def keep_alive(url: str, token: str | None) -> None:
    """``--keep-alive``: make sure a keeper beats for the runtime this hook runs under
    (:mod:`backchannel.runtimes.keeper`), for a runtime with no ``backchannel mcp`` of
    its own to beat for it. Never raises."""
    if not token:
        return
    try:
        from backchannel.runtimes import keeper, liveness

        key = liveness.runtime_key()
        if key is not None:
            keeper.ensure(key, url, token)
    except Exception:  # a broken hook must never block the agent; the rule ends it
        return
