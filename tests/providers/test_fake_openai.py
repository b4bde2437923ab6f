"""The fake server itself, read with a raw HTTP client: it must speak OpenAI's wire format."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from stello_graph.testing.openai_server import FakeOpenAI, Json, Reply, ToolCallSpec, words


def post(server: FakeOpenAI, body: Json) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        conn.close()


def events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body; `[DONE]` stays a string."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_words_keep_their_spaces() -> None:
    assert words("Hello big  world") == ["Hello", " big", "  world"]
    assert "".join(words(" a b ")) == " a b "


def test_non_streaming_completion(server: FakeOpenAI) -> None:
    call = ToolCallSpec(name="add", args={"a": 1}, id="call_1")
    server.add(Reply(content="Hi you", usage=(3, 2)), Reply(tool_calls=(call,)))
    status, headers, raw = post(
        server, {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert (status, headers["content-type"]) == (200, "application/json")
    body = json.loads(raw)
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["content"] == "Hi you" and choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    _, _, raw = post(server, {"model": "m", "messages": []})
    message = json.loads(raw)["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    ]
    assert json.loads(raw)["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("usage", [True, False])
def test_streaming_chunks(server: FakeOpenAI, usage: bool) -> None:
    calls = (ToolCallSpec(name="a", args={"x": "long value"}), ToolCallSpec(name="b"))
    server.add(Reply(content="One two", tool_calls=calls))
    body: Json = {"model": "m", "messages": [], "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    status, headers, raw = post(server, body)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    got = events(raw)
    assert got[-1] == "[DONE]"
    chunks: list[Json] = got[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    if usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
        chunks = chunks[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    assert [d["content"] for d in deltas if d.get("content")] == ["One", " two"]
    fragments = [tc for d in deltas for tc in d.get("tool_calls", [])]
    heads = [f for f in fragments if "id" in f]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [(0, "a"), (1, "b")]
    for index, call in enumerate(calls):
        pieces = [f["function"]["arguments"] for f in fragments if f["index"] == index]
        assert "".join(pieces) == call.arguments
    assert len([f for f in fragments if f["index"] == 0]) > 2  # arguments split across chunks
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}


def test_errors_script_end_and_routes(server: FakeOpenAI) -> None:
    server.add(Reply(status=429, error="slow down"))
    status, _, raw = post(server, {"model": "m", "messages": []})
    assert status == 429 and json.loads(raw)["error"]["message"] == "slow down"
    status, _, raw = post(server, {"model": "m", "messages": []})
    assert status == 500 and "script exhausted" in json.loads(raw)["error"]["message"]
    assert len(server.requests) == 2 and server.remaining == 0
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/v1/models")
    assert json.loads(conn.getresponse().read())["data"][0]["id"] == "fake"
    conn.request("POST", "/v1/embeddings", "{}")
    assert conn.getresponse().status == 404
    conn.close()


def test_respond_function_and_default() -> None:
    seen: list[Json] = []

    def respond(body: Json) -> Reply:
        seen.append(body)
        return Reply(content=f"echo {len(body['messages'])}")

    with FakeOpenAI([Reply(content="scripted")], respond=respond) as server:
        replies = [post(server, {"model": "m", "messages": [{}] * n})[2] for n in (1, 2)]
    texts = [json.loads(r)["choices"][0]["message"]["content"] for r in replies]
    assert texts == ["scripted", "echo 2"] and len(seen) == 1
    with FakeOpenAI(default=Reply(content="always")) as server:
        raw = post(server, {"model": "m", "messages": []})[2]
    assert json.loads(raw)["choices"][0]["message"]["content"] == "always"
