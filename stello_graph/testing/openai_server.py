"""A scripted OpenAI-compatible chat server on 127.0.0.1, speaking the real wire format.

`FakeOpenAI` serves `POST /v1/chat/completions` (and `GET /v1/models`) from a stdlib
`ThreadingHTTPServer` on a free loopback port. Each request takes the next scripted `Reply`
(or asks a `respond` function) and answers it as OpenAI does:

* non-streaming: one `chat.completion` JSON object, with `usage`;
* streaming (`"stream": true`): server-sent events - a role chunk, `delta.content` tokens,
  `delta.tool_calls` fragments (the first with `index`, `id`, `type` and `function.name`, the
  next ones with `index` and pieces of `function.arguments`), a chunk with `finish_reason`, a
  usage chunk with empty `choices` when `stream_options.include_usage` is set, `data: [DONE]`;
* errors: an HTTP status with OpenAI's `{"error": {...}}` body, a stream cut off after some
  chunks, or a reply slower than the client's timeout;
* slow streams (`chunk_delay` seconds between chunks), as a real model generates them.

Every request is recorded (`server.requests`), so a test can check the messages, tools and
`tool_choice` a real client sent; `server.aborted` counts the streams the client closed before
their end.

Example:
    >>> from langchain_openai import ChatOpenAI  # doctest: +SKIP
    >>> with FakeOpenAI([Reply(content="Hi there")]) as server:  # doctest: +SKIP
    ...     model = ChatOpenAI(base_url=server.base_url, api_key="x", model="fake")
    ...     model.invoke("Hello").content
    'Hi there'
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FakeOpenAI", "Reply", "Request", "ToolCallSpec", "words"]

Json = dict[str, Any]


def words(text: str) -> list[str]:
    """Split `text` into word tokens that keep their leading space (`"a b"` -> `["a", " b"]`)."""
    return re.findall(r"\s*\S+|\s+$", text)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCallSpec:
    """A tool call in a scripted reply.

    Attributes:
        name: the function name.
        args: the arguments (sent as a JSON string, as OpenAI does).
        id: the call id (default: a fresh `call_...`).
    """

    name: str
    args: Json = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")

    @property
    def arguments(self) -> str:
        return json.dumps(self.args, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Reply:
    """One scripted answer of the server.

    Attributes:
        content: the assistant text (`None` in the JSON when empty and there are tool calls).
        tool_calls: tool calls the assistant asks for.
        usage: `(prompt_tokens, completion_tokens)`; default: counted from the words.
        status: an HTTP status other than 200 answers with an OpenAI error body.
        error: the message of that error.
        cut_after: streaming only: drop the connection after this many chunks.
        delay: seconds to wait before answering (to exercise client timeouts).
        chunk_delay: streaming only: seconds to wait before each chunk (a slow model).
        id: the completion id (default: a fresh `chatcmpl-...`).
    """

    content: str = ""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    usage: tuple[int, int] | None = None
    status: int = 200
    error: str = "The server had an error while processing your request."
    cut_after: int | None = None
    delay: float = 0.0
    chunk_delay: float = 0.0
    id: str | None = None

    @classmethod
    def calls(cls, *calls: ToolCallSpec | tuple[str, Json], content: str = "") -> Reply:
        """A reply asking for tools: `Reply.calls(("add", {"a": 1}), ("mul", {...}))`."""
        specs = tuple(
            c if isinstance(c, ToolCallSpec) else ToolCallSpec(name=c[0], args=c[1]) for c in calls
        )
        return cls(content=content, tool_calls=specs)


Responder = Callable[[Json], Reply]


def _prompt_tokens(body: Json) -> int:
    total = 0
    for message in body.get("messages", []):
        content = message.get("content")
        total += 4 + (len(words(content)) if isinstance(content, str) else 0)
    return total


def _usage(reply: Reply, body: Json) -> Json:
    if reply.usage is not None:
        prompt, completion = reply.usage
    else:
        calls = sum(len(words(c.arguments)) + 1 for c in reply.tool_calls)
        prompt, completion = _prompt_tokens(body), len(words(reply.content)) + calls
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish_reason(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _completion(reply: Reply, body: Json, cid: str) -> Json:
    message: Json = {"role": "assistant", "content": reply.content or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": _finish_reason(reply),
    }
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [choice],
        "usage": _usage(reply, body),
    }


def _split(text: str, parts: int) -> list[str]:
    step = max(1, -(-len(text) // parts))
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


def _deltas(reply: Reply) -> Iterator[tuple[Json, str | None]]:
    """The `(delta, finish_reason)` pairs of a streamed reply, in OpenAI's order."""
    yield {"role": "assistant", "content": "", "refusal": None}, None
    for token in words(reply.content):
        yield {"content": token}, None
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield {"tool_calls": [head]}, None
        for piece in _split(call.arguments, 3):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None
    yield {}, _finish_reason(reply)


def _chunks(reply: Reply, body: Json, cid: str) -> Iterator[Json]:
    base = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "system_fingerprint": "fp_fake",
    }
    for delta, finish in _deltas(reply):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        yield {**base, "choices": [choice]}
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": _usage(reply, body)}


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 as real providers speak it: keep-alive, and streams in chunked encoding, so a
    # stream that is cut off is an incomplete body the client notices (not a clean EOF).
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        self.server.track(self.connection, add=False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read `FakeOpenAI.requests`, not a log."""

    def _send_json(self, status: int, payload: Json) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "x"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body: Json = json.loads(self.rfile.read(length) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "x"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.owner.next_reply(body, headers)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.status != 200:
            error = {"message": reply.error, "type": "server_error", "param": None, "code": None}
            self._send_json(reply.status, {"error": error})
        elif body.get("stream"):
            self._stream(reply, body)
        else:
            self._send_json(200, _completion(reply, body, reply.id or _new_id()))

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, reply: Reply, body: Json) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cid = reply.id or _new_id()
        try:
            for n, chunk in enumerate(_chunks(reply, body, cid)):
                if reply.cut_after is not None and n >= reply.cut_after:
                    self.close_connection = True
                    return  # the connection drops mid-body: no [DONE], no last chunk
                if reply.chunk_delay:
                    time.sleep(reply.chunk_delay)
                self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")
        except ConnectionError:  # the client closed the stream before its end
            self.close_connection = True
            self.server.owner.count_aborted()


def _new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeOpenAI

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def track(self, conn: socket.socket, *, add: bool) -> None:
        with self._open_lock:
            if add:
                self._open.add(conn)
            else:
                self._open.discard(conn)

    def drop_connections(self) -> None:
        """End the kept-alive connections, so their handler threads finish."""
        with self._open_lock:
            conns, self._open = list(self._open), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Keep the fake's own failures for the test; a client that went away is not one."""
        error = sys.exc_info()[1]
        if error is not None and not isinstance(error, ConnectionError):
            self.owner.errors.append(error)


@dataclass(frozen=True, slots=True)
class Request:
    """A request the server received: its JSON body and headers (names in lower case)."""

    body: Json
    headers: dict[str, str]

    @property
    def messages(self) -> list[Json]:
        return list(self.body.get("messages", []))

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.body.get("tools") or []]

    @property
    def streamed(self) -> bool:
        return bool(self.body.get("stream"))


class FakeOpenAI:
    """A scripted OpenAI-compatible server on a free port of 127.0.0.1.

    Args:
        script: replies given to the requests in order.
        respond: called with the request body when the script is empty (or instead of it).
        default: the reply once both are exhausted (else HTTP 500 "script exhausted").
    """

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        respond: Responder | None = None,
        default: Reply | None = None,
    ) -> None:
        self._script: deque[Reply] = deque(script)
        self._respond = respond
        self._default = default
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        """Exceptions raised while serving (a bug of the fake, or a request it cannot read)."""
        self._aborted = 0
        self._server = _Server(("127.0.0.1", 0))
        self._server.owner = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-openai",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. `ChatOpenAI(base_url=server.base_url)`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    def next_reply(self, body: Json, headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append(Request(body=body, headers=headers))
            if self._script:
                return self._script.popleft()
        if self._respond is not None:
            return self._respond(body)
        if self._default is not None:
            return self._default
        return Reply(status=500, error="FakeOpenAI: script exhausted")

    def count_aborted(self) -> None:
        with self._lock:
            self._aborted += 1

    @property
    def aborted(self) -> int:
        """Streams the client closed before their end (the server noticed when writing)."""
        with self._lock:
            return self._aborted

    @property
    def remaining(self) -> int:
        """Scripted replies not used yet."""
        with self._lock:
            return len(self._script)

    def start(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port (waits for the serving thread)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.drop_connections()
        self._server.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
