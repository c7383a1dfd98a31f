"""The lean path of ``backchannel hook``: a runtime runs it around every turn and tool
call, so it must cost next to nothing.

It imports only the standard library and the runtime's payload module, reads the hook
JSON, POSTs it to the hub's ``/v1/hooks/{runtime}`` and prints the answer. When the hub
is not a running server (the CLI then applies hooks on the data directory's store), or
the arguments are anything but the plain form, :func:`run` returns ``None`` and the full
CLI takes over, with the same behaviour as ever: always exit 0, print a JSON object,
say on stderr why a call had no effect.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUNTIMES = ("claude-code", "codex", "gemini")
PROBLEM_HEADER = "Backchannel-Hook-Problem"  # the same as runtimes.common.PROBLEM_HEADER
_OPTIONS = {"--as": "as", "--url": "url", "--token": "token", "--home": "home"}


def _parse(argv: Sequence[str]) -> dict[str, str] | None:
    """``RUNTIME [PAYLOAD] [--as X] [--url U] [--token T] [--home H]``, else ``None``."""
    out: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in _OPTIONS:
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
        return url if url.startswith(("http://", "https://")) else None
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


def _enrich(runtime: str, raw: str) -> tuple[bytes, str | None]:
    """The payload with the closing text read from this machine's transcript when it
    lacks it (the hub never reads a file a hook names), and why it could not be."""
    from backchannel.runtimes.transcripts import enrich

    try:
        payload = json.loads(raw)
    except ValueError:  # a bad payload goes as it is: the hub says what is wrong with it
        return raw.encode("utf-8", "surrogateescape"), None
    filled, note = enrich(runtime, payload)
    body = raw if filled is payload else json.dumps(filled)
    return body.encode("utf-8", "surrogateescape"), note


def _post(url: str, runtime: str, body: bytes, token: str, expect: str | None) -> Any:
    """POST the payload; returns ``(status, body, problem header)``. A few lines of
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
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    sock = socket.create_connection((host, port), timeout=30.0)
    try:
        if secure:
            import ssl

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.sendall(head.encode("latin-1") + body)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    finally:
        sock.close()
    return _response(b"".join(chunks))


def _response(raw: bytes) -> tuple[int, bytes, str | None]:
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
    return status, body, headers.get(PROBLEM_HEADER.lower())


def answer(opts: dict[str, str], url: str, stdin: Any) -> tuple[dict[str, Any], str | None]:
    """Forward one hook call; returns the answer to print and why it had no effect."""
    runtime = opts["runtime"]
    if runtime not in RUNTIMES:
        return {}, f"unknown runtime {runtime!r}; use one of: {', '.join(RUNTIMES)}"
    token = opts.get("token") or os.environ.get("BACKCHANNEL_TOKEN")
    if not token:
        return {}, "BACKCHANNEL_TOKEN is not set; export this agent's member token"
    raw = opts["payload"] if "payload" in opts else stdin.read()
    payload, note = _enrich(runtime, raw)
    try:
        status, body, problem = _post(url, runtime, payload, token, opts.get("as"))
    except (OSError, ValueError, IndexError) as exc:
        return {}, f"cannot reach the hub at {url}: {exc}"
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if status >= 400:
        error = data.get("error", {}) if isinstance(data, dict) else {}
        detail = error.get("message") if isinstance(error, dict) else None
        return {}, f"hub answered {status}: {detail or body[:200].decode('utf-8', 'replace')}"
    return (data if isinstance(data, dict) else {}), problem or note


def run(argv: Sequence[str]) -> bool:
    """Handle ``backchannel hook ...`` here if it can be; False hands it to the full CLI."""
    opts = _parse(argv)
    if opts is None:
        return False
    url = _hub_url(opts)
    if url is None:
        return False
    try:
        result, problem = answer(opts, url, sys.stdin)
    except Exception as exc:  # a broken hook must never block the agent
        result, problem = {}, f"internal error: {type(exc).__name__}: {exc}"
    print(json.dumps(result), flush=True)
    if problem:
        print(f"backchannel hook {opts['runtime']}: {problem}", file=sys.stderr, flush=True)
    return True
