"""A scripted stand-in for the OpenAI Responses API on 127.0.0.1, for driving the real
Codex CLI offline: ``POST /v1/responses`` is answered by the first rule of the script
that matches it (the same rules as :mod:`.fake_anthropic`), streamed as the real API
streams (server-sent ``response.*`` events)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from .fake_anthropic import Reply, Request, Rule, ScriptedApi

__all__ = ["FakeOpenAI", "last_user_text", "texts", "tool_names"]


def _content_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


def texts(req: Request) -> list[str]:
    """Every text the model is shown in ``req`` (instructions, messages, tool output)."""
    out: list[str] = []
    if isinstance(req.get("instructions"), str):
        out.append(req["instructions"])
    for item in req.get("input", []) or []:
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") == "message":
            out += _content_text(item.get("content"))
        elif item.get("type") == "function_call_output":
            output = item.get("output")
            out += _content_text(output) if not isinstance(output, dict) else [json.dumps(output)]
    return out


def last_user_text(req: Request) -> str:
    """The text since the model's last output: the last user message, or the tool
    outputs after the last function call."""
    tail: list[str] = []
    for item in reversed(req.get("input", []) or []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "function_call_output":
            tail += texts({"input": [item]})
        elif kind == "message" and item.get("role") == "user":
            tail += _content_text(item.get("content"))
            break
        elif kind in ("function_call", "message"):
            break
    return "\n".join(reversed(tail))


def tool_names(req: Request) -> list[str]:
    names: list[str] = []
    for tool in req.get("tools", []) or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":  # tools grouped under a server's name
            prefix = str(tool.get("name", ""))
            names += [f"{prefix}__{t.get('name', '')}" for t in tool.get("tools", []) or []]
        else:
            names.append(str(tool.get("name", "")))
    return names


def _named(req: Request, tool: str) -> dict[str, str]:
    """A call's ``name`` (and ``namespace`` when the tool is one of a namespace's, as
    Codex offers MCP tools: namespace ``mcp__server``, tool ``send_message``); ``tool``
    is the full name, ``mcp__backchannel__send_message``."""
    for group in req.get("tools", []) or []:
        if isinstance(group, dict) and group.get("type") == "namespace":
            prefix = str(group.get("name", ""))
            for t in group.get("tools", []) or []:
                if tool in (f"{prefix}__{t.get('name')}", f"{prefix}{t.get('name')}"):
                    return {"name": str(t.get("name")), "namespace": prefix}
    return {"name": tool}


class FakeOpenAI(ScriptedApi):
    """``with FakeOpenAI(rules) as api:`` then point a provider's ``base_url`` at
    ``api.url + "/v1"``. Every request body is kept in ``api.requests``."""

    def __init__(self, rules: list[Rule], fallback: str = "Done.") -> None:
        super().__init__(rules, fallback)
        self._ids = iter(range(1, 1 << 30))

    def model_requests(self) -> list[Request]:
        return [r for r in self.requests if "input" in r]

    def _next(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    def events(self, req: Request, reply: Reply) -> Iterator[dict[str, Any]]:
        rid = self._next("resp")
        base = {"id": rid, "object": "response", "model": req.get("model", "gpt-test")}
        yield {"type": "response.created", "response": {**base, "status": "in_progress"}}
        items: list[dict[str, Any]] = []
        if reply.text:
            items.append(
                {"type": "message", "id": self._next("msg"), "role": "assistant",
                 "status": "completed",
                 "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}
            )  # fmt: skip
        if reply.tool:
            items.append(
                {"type": "function_call", "id": self._next("fc"), "call_id": self._next("call"),
                 **_named(req, reply.tool), "arguments": json.dumps(reply.args),
                 "status": "completed"}
            )  # fmt: skip
        for i, item in enumerate(items):
            if item["type"] == "message":
                yield {"type": "response.output_item.added", "output_index": i,
                       "item": {**item, "content": [], "status": "in_progress"}}  # fmt: skip
                yield {"type": "response.output_text.delta", "output_index": i,
                       "content_index": 0, "item_id": item["id"], "delta": reply.text}  # fmt: skip
            else:
                yield {"type": "response.output_item.added", "output_index": i, "item": item}
            yield {"type": "response.output_item.done", "output_index": i, "item": item}
        usage = {
            "input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 120,
        }  # fmt: skip
        yield {"type": "response.completed",
               "response": {**base, "status": "completed", "output": items, "usage": usage}}  # fmt: skip

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    req = json.loads(body)
                except ValueError:
                    req = {}
                if not self.path.rstrip("/").endswith("/responses"):
                    self._empty(404)
                    return
                reply = api.answer(req)
                chunks = [
                    f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
                    for e in api.events(req, reply)
                ]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("content-length", str(sum(len(c) for c in chunks)))
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(chunk)
                self.wfile.flush()

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    out = json.dumps({"object": "list", "data": [], "models": []}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                self._empty(404)

            def _empty(self, status: int) -> None:
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

        return Handler
