"""A scripted stand-in for the Gemini API on 127.0.0.1, for driving the real Gemini CLI
offline (``GOOGLE_GEMINI_BASE_URL``): ``models/{model}:generateContent`` and
``:streamGenerateContent`` (server-sent events) are answered by the first rule of the
script that matches (the rules of :mod:`.fake_anthropic`)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from .fake_anthropic import Reply, Request, ScriptedApi

__all__ = ["FakeGemini", "last_user_text", "texts", "tool_names"]


def _parts_text(parts: Any) -> list[str]:
    out: list[str] = []
    for part in parts or []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            out.append(part["text"])
        elif isinstance(part.get("functionResponse"), dict):
            out.append(json.dumps(part["functionResponse"].get("response")))
    return out


def texts(req: Request) -> list[str]:
    out: list[str] = []
    system = req.get("systemInstruction")
    if isinstance(system, dict):
        out += _parts_text(system.get("parts"))
    for content in req.get("contents", []) or []:
        out += _parts_text(content.get("parts") if isinstance(content, dict) else None)
    return out


def last_user_text(req: Request) -> str:
    users = [c for c in req.get("contents", []) or [] if c.get("role") == "user"]
    return "\n".join(_parts_text(users[-1].get("parts"))) if users else ""


def tool_names(req: Request) -> list[str]:
    names: list[str] = []
    for tool in req.get("tools", []) or []:
        for decl in tool.get("functionDeclarations", []) if isinstance(tool, dict) else []:
            names.append(str(decl.get("name", "")))
    return names


def _named(req: Request, tool: str) -> str:
    """The declared name of ``tool`` (given as ``mcp__server__name``: Gemini CLI names
    MCP tools its own way)."""
    declared = tool_names(req)
    if tool in declared:
        return tool
    short = tool.rsplit("__", 1)[-1]
    for name in declared:
        if name == short or name.endswith(("__" + short, "_" + short)):
            return name
    return tool


class FakeGemini(ScriptedApi):
    """``with FakeGemini(rules) as api:`` then set ``GOOGLE_GEMINI_BASE_URL=api.url``."""

    @staticmethod
    def response(req: Request, reply: Reply) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if reply.text:
            parts.append({"text": reply.text})
        if reply.tool:
            parts.append({"functionCall": {"name": _named(req, reply.tool), "args": reply.args}})
        return {
            "candidates": [
                {"content": {"role": "model", "parts": parts or [{"text": ""}]},
                 "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20,
                              "totalTokenCount": 120},
            "modelVersion": "gemini-test",
        }  # fmt: skip

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
                path = self.path.split("?")[0]
                if path.endswith(":countTokens"):
                    self._send("application/json", json.dumps({"totalTokens": 100}).encode())
                    return
                if not path.endswith((":generateContent", ":streamGenerateContent")):
                    self._send("application/json", b"{}", 404)
                    return
                out = api.response(req, api.answer(req))
                if path.endswith(":streamGenerateContent"):
                    self._send("text/event-stream", f"data: {json.dumps(out)}\r\n\r\n".encode())
                else:
                    self._send("application/json", json.dumps(out).encode())

            def do_GET(self) -> None:
                self._send("application/json", json.dumps({"models": []}).encode())

            def _send(self, kind: str, data: bytes, status: int = 200) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
