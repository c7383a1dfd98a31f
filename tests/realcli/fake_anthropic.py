"""A scripted stand-in for the Anthropic Messages API on 127.0.0.1, for driving the real
Claude Code CLI offline: each request is answered by the first rule of the script that
matches it, streamed the way the real API streams (server-sent events)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

Request = dict[str, Any]


def texts(req: Request) -> list[str]:
    """Every text the model is shown in ``req`` (system, user and tool results), in order."""
    out: list[str] = []
    system = req.get("system")
    if isinstance(system, str):
        out.append(system)
    elif isinstance(system, list):
        out += [b.get("text", "") for b in system if isinstance(b, dict)]
    for msg in req.get("messages", []):
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
            continue
        for block in content or []:
            if block.get("type") == "text":
                out.append(block.get("text", ""))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    out.append(inner)
                else:
                    out += [b.get("text", "") for b in inner or [] if isinstance(b, dict)]
    return out


def last_user_text(req: Request) -> str:
    """The text of the last user turn (its text and tool-result blocks joined)."""
    msgs = [m for m in req.get("messages", []) if m.get("role") == "user"]
    if not msgs:
        return ""
    return "\n".join(texts({"messages": [msgs[-1]]}))


def tool_names(req: Request) -> list[str]:
    return [t.get("name", "") for t in req.get("tools", []) or []]


@dataclass
class Reply:
    text: str = ""
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


def say(text: str) -> Reply:
    return Reply(text=text)


def call(tool: str, **args: Any) -> Reply:
    return Reply(tool=tool, args=args)


@dataclass
class Rule:
    when: Callable[[Request], bool]
    reply: Reply | Callable[[Request], Reply]
    times: int | None = None  # how often it may answer (None: always)
    used: int = 0


class ScriptedApi:
    """A model API on 127.0.0.1 answered by a script: each request by the first rule that
    matches it (``times`` limits how often a rule answers), else ``fallback``. Use as
    ``with Api(rules) as api:``; every request body is kept in ``api.requests``.
    Subclasses say how the wire looks (:meth:`_handler`)."""

    def __init__(self, rules: list[Rule], fallback: str = "Done.") -> None:
        self.rules = rules
        self.fallback = fallback
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket.settimeout(1.0)  # see harness.never_stuck_in_accept
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, req: Request) -> Reply:
        chosen: Reply | Callable[[Request], Reply] = say(self.fallback)
        with self._lock:
            self.requests.append(req)
            for rule in self.rules:
                if (rule.times is None or rule.used < rule.times) and rule.when(req):
                    rule.used += 1
                    chosen = rule.reply
                    break
        # a scripted reply may wait (for the test to act mid-turn): not under the lock
        return chosen(req) if callable(chosen) else chosen

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError


class FakeAnthropic(ScriptedApi):
    """``with FakeAnthropic(rules) as api:`` then point ``ANTHROPIC_BASE_URL`` at
    ``api.url``. Every request is kept in ``api.requests`` (the parsed JSON body)."""

    def model_requests(self) -> list[Request]:
        """Requests that asked the model for a turn (not token counting)."""
        return [r for r in self.requests if r.get("messages") and "max_tokens" in r]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    req = json.loads(body)
                except ValueError:
                    req = {}
                if "count_tokens" in self.path:
                    self._json({"input_tokens": 100})
                    return
                reply = api.answer(req)
                if req.get("stream"):
                    self._stream(req, reply)
                else:
                    self._json(_message(req, reply))

            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def _json(self, data: Any) -> None:
                out = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _stream(self, req: Request, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                for event, data in _events(req, reply):
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

        return Handler


_ids = iter(range(1, 1 << 30))


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    if reply.tool:
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": reply.tool,
             "input": reply.args}
        )  # fmt: skip
    return blocks or [{"type": "text", "text": ""}]


def _message(req: Request, reply: Reply) -> dict[str, Any]:
    blocks = _blocks(reply)
    return {
        "id": f"msg_{next(_ids):06d}", "type": "message", "role": "assistant",
        "model": req.get("model", "claude"), "content": blocks,
        "stop_reason": "tool_use" if reply.tool else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 20},
    }  # fmt: skip


def _events(req: Request, reply: Reply) -> Iterator[tuple[str, dict[str, Any]]]:
    msg = _message(req, reply)
    blocks = msg.pop("content")
    yield "message_start", {"type": "message_start", "message": {**msg, "content": [],
                            "stop_reason": None}}  # fmt: skip
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": i,
                                          "content_block": {"type": "text", "text": ""}}  # fmt: skip
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": i,
                                          "content_block": {**block, "input": {}}}  # fmt: skip
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": i}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"],
                            "stop_sequence": None}, "usage": {"output_tokens": 20}}  # fmt: skip
    yield "message_stop", {"type": "message_stop"}
