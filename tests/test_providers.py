"""The model providers against local servers that speak the providers' wire formats."""

from __future__ import annotations

import email.utils
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backchannel.runner.models import ChatMessage, ModelError, ToolCall, ToolSpec
from backchannel.runner.providers import AnthropicModel, OpenAIModel
from tests.peers import Peer, QuietHandler

Answer = Callable[[dict[str, Any], int], tuple[int, dict[str, Any], dict[str, str]]]


#: The status an :data:`Answer` gives for a connection closed with no answer at all.
DROP = 0


class FakeProvider(Peer):
    """A model API on 127.0.0.1: ``answer(body, n)`` (``n`` counts the requests, from 1)
    gives the status, body and headers of each answer, or :data:`DROP`."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(
                    (self.path, body, {k.lower(): v for k, v in self.headers.items()})
                )
                status, payload, headers = answer(body, len(outer.requests))
                if status == DROP:  # the connection closed with no answer
                    self.close_connection = True
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.serve(Handler)


@pytest.fixture
def provider() -> Iterator[Callable[[Answer], FakeProvider]]:
    made: list[FakeProvider] = []

    def make(answer: Answer) -> FakeProvider:
        made.append(FakeProvider(answer))
        return made[-1]

    yield make
    for p in made:
        p.close()


TOOLS = [
    ToolSpec(
        "send_message",
        "Send a message.",
        {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
    )
]
CONVO = [
    ChatMessage("user", "[From user] say hi to b"),
    ChatMessage("assistant", "calling", (ToolCall("toolu_0", "send_message", {"to": "b"}),)),
    ChatMessage("tool", "sent m1 to b", call_id="toolu_0"),
]

ANTHROPIC_TOOL_USE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-5-5",
    "content": [
        {"type": "text", "text": "Sending it."},
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "send_message",
            "input": {"to": "b", "message": "hi"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 120,
        "output_tokens": 30,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 0,
    },
}
RATE_LIMIT = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}


async def test_anthropic_tool_use_after_a_rate_limit(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(
        lambda body, n: (
            (429, RATE_LIMIT, {"retry-after-ms": "10"}) if n == 1 else (200, ANTHROPIC_TOOL_USE, {})
        )
    )
    model = AnthropicModel("claude-sonnet-5-5", base_url=srv.url)
    with pytest.raises(ModelError, match=r"asks to wait 0\.01 s") as limited:
        await model.complete("You are terse.", CONVO, TOOLS)
    assert limited.value.details == {"retryable": True, "retry_after": 0.01}
    assert len(srv.requests) == 1, "the SDK does not try again: the runner does"
    reply = await model.complete("You are terse.", CONVO, TOOLS)
    assert reply.text == "Sending it."
    assert reply.tool_calls == (ToolCall("toolu_1", "send_message", {"to": "b", "message": "hi"}),)
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cache_read_tokens) == (
        120,
        30,
        100,
    )
    assert reply.stop_reason == "tool_use"
    path, body, headers = srv.requests[-1]
    assert path == "/v1/messages"
    assert headers["authorization"] == "Bearer test-key"
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}  # prompt caching
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][0]["input_schema"]["required"] == ["to"]
    assert body["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_0",
        "name": "send_message",
        "input": {"to": "b"},
    }
    assert body["messages"][2]["content"][0]["type"] == "tool_result"
    assert body["messages"][2]["content"][0]["tool_use_id"] == "toolu_0"


async def test_anthropic_error_is_a_model_error(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    bad = {"type": "error", "error": {"type": "invalid_request_error", "message": "messages: bad"}}
    srv = provider(lambda body, n: (400, bad, {}))
    with pytest.raises(ModelError, match="messages: bad"):
        await AnthropicModel("claude-sonnet-5-5", base_url=srv.url).complete("", CONVO, TOOLS)
    assert len(srv.requests) == 1, "a 400 is not retried"


def test_missing_api_key_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ModelError, match="set ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-5-5")


OPENAI_TOOL_CALLS = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "llama3.1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "send_message",
                            "arguments": '{"to": "b", "message": "hi"}',
                        },
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
}


async def test_openai_compatible_tool_calls_after_a_server_error(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    srv = provider(
        lambda body, n: (
            (503, {"error": {"message": "overloaded"}}, {"retry-after-ms": "10"})
            if n == 1
            else (200, OPENAI_TOOL_CALLS, {})
        )
    )
    model = OpenAIModel("llama3.1", base_url=srv.url + "/v1")
    with pytest.raises(ModelError, match="overloaded") as busy:
        await model.complete("You are terse.", CONVO, TOOLS)
    assert busy.value.details == {"retryable": True, "retry_after": 0.01}
    assert len(srv.requests) == 1, "the SDK does not try again: the runner does"
    reply = await model.complete("You are terse.", CONVO, TOOLS)
    assert reply.tool_calls == (ToolCall("call_1", "send_message", {"to": "b", "message": "hi"}),)
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (50, 12)
    assert len(srv.requests) == 2
    path, body, _ = srv.requests[-1]
    assert path == "/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert body["messages"][2]["tool_calls"][0]["function"]["name"] == "send_message"
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "toolu_0",
        "content": "sent m1 to b",
    }
    assert body["tools"][0]["function"]["parameters"]["required"] == ["to"]


async def test_openai_error_is_a_model_error(provider: Callable[[Answer], FakeProvider]) -> None:
    srv = provider(
        lambda body, n: (
            401,
            {"error": {"message": "bad key", "type": "invalid_request_error"}},
            {},
        )
    )
    with pytest.raises(ModelError, match="bad key"):
        await OpenAIModel("gpt-4o", base_url=srv.url + "/v1").complete("", CONVO, TOOLS)


REVOKED = {
    "type": "error",
    "error": {"type": "authentication_error", "message": "invalid x-api-key"},
}


async def test_a_key_refused_mid_run_names_where_the_key_came_from(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key revoked mid-run (401), or one without access (403), stops the agent for
    good; the stop said only what the API said, not which key to fix. It names the
    variable the key came from, and, for an OpenAI-compatible server given no key (the
    placeholder a local server takes), that none was set."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("TEAM_KEY", "test-key")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    srv = provider(lambda body, n: (401 if n < 4 else 403, REVOKED, {}))
    with pytest.raises(ModelError) as anthropic:
        await AnthropicModel("claude-sonnet-5-5", base_url=srv.url).complete("", CONVO, TOOLS)
    assert "invalid x-api-key" in anthropic.value.message
    assert "the key in ANTHROPIC_API_KEY" in anthropic.value.message, anthropic.value.message
    assert anthropic.value.details == {"retryable": False}
    with pytest.raises(ModelError) as named:
        await OpenAIModel("m", base_url=srv.url + "/v1", api_key_env="TEAM_KEY").complete(
            "", CONVO, TOOLS
        )
    assert "the key in TEAM_KEY" in named.value.message, named.value.message
    with pytest.raises(ModelError) as unset:
        await OpenAIModel("m", base_url=srv.url + "/v1").complete("", CONVO, TOOLS)
    assert "OPENAI_API_KEY is not set" in unset.value.message, unset.value.message
    with pytest.raises(ModelError) as forbidden:
        await AnthropicModel("claude-sonnet-5-5", base_url=srv.url).complete("", CONVO, TOOLS)
    assert "the key in ANTHROPIC_API_KEY" in forbidden.value.message, forbidden.value.message
    assert len(srv.requests) == 4, "a refused key is not tried again"


def test_the_network_guard_stops_a_real_model_call() -> None:
    sock = socket.socket()
    try:
        with pytest.raises(AssertionError, match="tests may only use loopback"):
            sock.connect(("203.0.113.7", 443))  # stands for api.anthropic.com: never reached
    finally:
        sock.close()


def _not_an_api_answer(body: dict[str, Any], n: int) -> tuple[int, Any, dict[str, str]]:
    """A 200 whose body is no answer of the API: what a proxy or a captive portal in
    the way sends (the fake server writes a JSON string, which parses to a str)."""
    return 200, "<html>502 Bad Gateway</html>", {}


async def test_an_answer_that_is_not_the_apis_is_a_model_error(
    provider: Callable[[Answer], FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner closes a turn on a ModelError and keeps what it owes; any other
    exception out of a provider crashes the session instead."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    srv = provider(_not_an_api_answer)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="not an answer of the Messages API"):
        await AnthropicModel("claude-sonnet-5-5", base_url=srv.url).complete("", CONVO, TOOLS)
    with pytest.raises(ModelError, match="not an answer of the Chat Completions API"):
        await OpenAIModel("gpt-4o", base_url=srv.url + "/v1").complete("", CONVO, TOOLS)


async def test_a_body_cut_short_is_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 200 whose JSON ends mid-way (a proxy that cut the body but set its length)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    class Cut(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            data = b'{"id": "msg_1", "type": "message", "content": [{"type": "te'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    peer = Peer()
    peer.serve(Cut)
    url = peer.url
    try:
        with pytest.raises(ModelError, match="not an answer of the Messages API"):
            await AnthropicModel("claude-sonnet-5-5", base_url=url).complete("", CONVO, TOOLS)
        with pytest.raises(ModelError, match="not an answer of the Chat Completions API"):
            await OpenAIModel("gpt-4o", base_url=url + "/v1").complete("", CONVO, TOOLS)
    finally:
        peer.close()


async def test_a_wait_asked_as_a_date_or_a_no_to_retrying_is_heard(
    provider: Callable[[Answer], FakeProvider],
) -> None:
    """With the SDK's own retries off, what the SDK heard in an API's answer is the
    providers' to hear: a ``retry-after`` given as an HTTP date (an hour away: the
    runner gives up at once rather than call again in a second), and an API's
    ``x-should-retry: false`` on a 500 (no call made again)."""
    in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
    script = {
        1: (429, {"error": {"message": "slow down"}}, {"retry-after": in_an_hour}),
        2: (500, {"error": {"message": "no use"}}, {"x-should-retry": "false"}),
    }
    srv = provider(lambda body, n: script[n])
    model = OpenAIModel("gpt-4o", base_url=srv.url + "/v1")
    with pytest.raises(ModelError) as dated:
        await model.complete("", CONVO, TOOLS)
    assert dated.value.details["retryable"] is True
    assert 3500 < dated.value.details["retry_after"] <= 3600
    with pytest.raises(ModelError, match="no use") as refused:
        await model.complete("", CONVO, TOOLS)
    assert refused.value.details == {"retryable": False}
