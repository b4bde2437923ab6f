"""The inspector's web app: the page, its JSON API and the live event stream.

`create_app(storage)` builds a Starlette app over any `MainStorage`, so tests run it in
process (Starlette's `TestClient`) and `stello-graph inspect` serves it with uvicorn. The
API reads without changing anything; the writes exist only with `write=True` and are
otherwise refused with 403.

It is a local tool, guarded against the web pages its user visits: a request whose `Host`
is not the address served is refused (421: a DNS-rebinding page reaches the server under its
own name), and a write needs `Content-Type: application/json`, the `Origin` of the page the
server serves and the app's token (`X-Stello-Token`, from the URL the command prints), which
no other site's page can send. Served off loopback with `write=True`, reads need the token too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from stello_graph._topology_slot import TopologySlot, check_topology_slot
from stello_graph.compression import CompressionPolicy
from stello_graph.errors import (
    IntegrationSupersededError,
    InvalidInputError,
    LeaseLostError,
    NodeNotFoundError,
    SessionArchivedError,
    SessionBusyError,
    SessionNotFoundError,
    StelloError,
    StelloUsageError,
)
from stello_graph.inspector import _views, _writes
from stello_graph.inspector._events import EventSource, PollingEventSource
from stello_graph.storage import MainStorage

if TYPE_CHECKING:
    from stello_graph.agent import StelloAgent

__all__ = ["LOOPBACK_NAMES", "STATIC", "TOKEN_HEADER", "Inspector", "create_app", "is_loopback"]

STATIC = Path(__file__).with_name("static")
"""The page: plain HTML, CSS and ES modules, served as they are (no build step)."""
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names a `Host` header may give besides the address served (with its port)."""
TOKEN_HEADER = "X-Stello-Token"
"""The header a write carries the app's token in (reads too, when they need it: or `?token=`)."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, an IPv6 one with or without brackets) is this
    machine's loopback: `localhost` or an address of 127.0.0.0/8 or ::1."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """`host` as a `Host` header names it: lower case, an IPv6 address in brackets."""
    name = host.strip().lower()
    return f"[{name}]" if ":" in name and not name.startswith("[") else name


def _split_host(value: str) -> tuple[str, str | None] | None:
    """A `Host` header's name and port (`None`: none given); `None` if it is malformed."""
    value = value.strip().lower()
    end = value.find("]") + 1 if value.startswith("[") else len(value.partition(":")[0])
    if end == 0:
        return None
    name, rest = value[:end], value[end:]
    if not rest:
        return name, None
    port = rest[1:]
    if not rest.startswith(":") or not (port.isascii() and port.isdigit()):
        return None
    return name, port


class Inspector:
    """What the app's handlers share: the storage, the event source, the write agent.

    Attributes:
        storage: the tree shown.
        write: whether writes are allowed (`--write`).
        events: where `/api/events` reads from.
        stopping: set when the server shuts down; open event streams then end.
        poll_interval: seconds between two reads of the event source per stream.
        host / port: the address served (`port` `None`: not checked).
        token: the secret a write must carry (and a read, when `token_reads`).
        token_reads: reads need the token too (writes allowed, served off loopback).
    """

    def __init__(
        self,
        storage: MainStorage,
        *,
        write: bool,
        agent: Callable[[], StelloAgent] | None,
        events: EventSource | None,
        policy: CompressionPolicy | None,
        poll_interval: float,
        label: str,
        host: str,
        port: int | None,
        topology_slot: TopologySlot | None = None,
    ) -> None:
        self.storage = storage
        self.write = write
        self.host = host
        self.port = port
        self.token = secrets.token_urlsafe(32)
        self.token_reads = write and not is_loopback(host)
        self._names = frozenset((*LOOPBACK_NAMES, _host_name(host)))
        self.events = events if events is not None else PollingEventSource(storage)
        self.policy = policy
        self.topology_slot = topology_slot
        self.poll_interval = poll_interval
        self.label = label
        self.stopping = threading.Event()
        self.feed = Feed()
        self.polling = False
        """Whether the server's poll loop runs (the app's lifespan starts it)."""
        self._tree: dict[bool, tuple[int, bytes]] = {}
        self._agent_factory = agent
        self._agent: StelloAgent | None = None
        self._write_lock = threading.Lock()

    def serves(self, host: str | None) -> bool:
        """Whether a request's `Host` header names this server: the address served or a
        loopback name, with the port served (any port while `port` is `None`)."""
        split = _split_host(host or "")
        if split is None or split[0] not in self._names:
            return False
        port = split[1]
        if self.port is None:
            return True
        return port == str(self.port) if port is not None else self.port == 80

    def has_token(self, given: str | None) -> bool:
        """Whether `given` is this app's token (compared in constant time)."""
        return given is not None and secrets.compare_digest(given.encode(), self.token.encode())

    def agent(self) -> StelloAgent:
        """The agent writes go through, made on first use."""
        if self._agent is None:
            if self._agent_factory is None:
                from stello_graph.agent import StelloAgent
                from stello_graph.cli import _offline

                self._agent = StelloAgent(
                    model=_offline.echo_model(),
                    storage=self.storage,
                    consolidate_fn=_offline.summarise,
                    integrate_fn=_offline.integrate,
                )
            else:
                self._agent = self._agent_factory()
        return self._agent

    def run_write(self, fn: Callable[[StelloAgent], dict[str, Any]]) -> dict[str, Any]:
        with self._write_lock:  # one write at a time: the page is one person's
            try:
                return fn(self.agent())
            finally:
                self._tree = {}

    def refresh(self) -> float:
        """Read the events after the feed's cursor into the feed; return the seconds it took.

        Runs in a worker thread (the event source reads the storage)."""
        started = time.perf_counter()
        found, newest = self.events.events_after(self.feed.seq)
        self.feed.add(found, newest)
        return time.perf_counter() - started

    def tree_json(self, compact: bool = True) -> bytes:
        """`GET /api/tree`, encoded. While the poll loop runs, an encoding is reused until
        the loop sees a change (or a write is made here): the tree is then as fresh as the
        last poll. Without the loop, every call reads the storage."""
        kept = self._tree.get(compact)
        if self.polling and kept is not None and kept[0] == self.feed.seq:
            return kept[1]
        seq = self.feed.seq
        view = _views.tree_view(self.storage, compact=compact)
        body = json.dumps(view, separators=(",", ":")).encode()
        if self.polling:
            self._tree[compact] = (seq, body)
        return body

    async def poll_loop(self) -> None:
        """Refresh the feed until the server stops, and encode the tree again whenever it
        changed (so `GET /api/tree` is served ready-made); pause at least `poll_interval` and
        at least four times as long as that work took (a large tree is polled less often)."""
        self.polling = True
        try:
            while not self.stopping.is_set():
                seq = self.feed.seq
                took = await run_in_threadpool(self.refresh)
                if not self._tree or self.feed.seq != seq:  # prepare the next GETs
                    started = time.perf_counter()
                    for compact in (True, False):
                        await run_in_threadpool(self.tree_json, compact)
                    took += time.perf_counter() - started
                await _sleep_unless(self.stopping, max(self.poll_interval, 4 * took))
        finally:
            self.polling = False

    def close(self) -> None:
        self.stopping.set()
        if self._agent is not None:
            self._agent.close()


class Feed:
    """The events read so far (the newest `KEPT`), for every open stream to follow."""

    KEPT = 5000

    def __init__(self) -> None:
        self.seq = 0
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, events: list[dict[str, Any]], newest: int) -> None:
        with self._lock:
            self._events = (self._events + events)[-self.KEPT :]
            self.seq = max(self.seq, newest)

    def after(self, cursor: int) -> list[dict[str, Any]]:
        with self._lock:
            return [event for event in self._events if event["seq"] > cursor]


async def _sleep_unless(stop: threading.Event, seconds: float) -> None:
    waited, step = 0.0, min(0.1, seconds)
    while waited < seconds and not stop.is_set():
        await asyncio.sleep(step)
        waited += step


# -- errors ----------------------------------------------------------------------------------
def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


class _Guard:
    """Before any route: refuses a request whose `Host` is not the server's (421), and an
    API read without the token when reads need it (403)."""

    def __init__(self, app: ASGIApp, inspector: Inspector) -> None:
        self.app = app
        self.inspector = inspector

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = _guard(self.inspector, Request(scope))
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _guard(inspector: Inspector, request: Request) -> Response | None:
    host = request.headers.get("host")
    if not inspector.serves(host):
        port = f":{inspector.port}" if inspector.port is not None else ""
        served = _host_name(inspector.host) + port
        return _error(
            421,
            f"This inspector serves {served} (or a loopback name), not Host {host!r}; "
            "to serve it under another name, start it with --host NAME.",
        )
    reading = request.method in ("GET", "HEAD") and request.url.path.startswith("/api/")
    if inspector.token_reads and reading:  # writes: `_refuse`
        given = request.headers.get(TOKEN_HEADER) or request.query_params.get("token")
        if not inspector.has_token(given):
            return _error(
                403,
                f"Served off loopback with --write, reads need the token too: open the URL "
                f"`stello-graph inspect` printed (?token=...), or send it in {TOKEN_HEADER}.",
            )
    return None


_CONFLICTS = (SessionArchivedError, SessionBusyError, LeaseLostError, IntegrationSupersededError)
"""What another writer (a turn, an integration, an archive) did first: 409, try again."""


def _stello_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, SessionNotFoundError | NodeNotFoundError):
        return _error(404, str(exc), type=type(exc).__name__)
    if isinstance(exc, _CONFLICTS):
        return _error(409, str(exc), type=type(exc).__name__)
    if isinstance(exc, InvalidInputError | StelloUsageError):
        return _error(400, str(exc), type=type(exc).__name__)
    return _error(500, f"{type(exc).__name__}: {exc}", type=type(exc).__name__)


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, exc.detail)


def _state(request: Request) -> Inspector:
    inspector: Inspector = request.app.state.inspector
    return inspector


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    return _integer(name, request.query_params.get(name), default, low, high)


def _integer(name: str, raw: str | None, default: int, low: int, high: int) -> int:
    """`raw` as an integer in [low, high]: ASCII digits only (no sign, space, `_` or other
    scripts' digits, which `int` would take); absent or empty: `default`."""
    if raw is None or raw == "":
        return default
    digits = raw.isascii() and raw.isdigit() and len(raw) <= 18
    value = int(raw) if digits else low - 1
    if not low <= value <= high:
        raise InvalidInputError(
            f"{name!r} must be an integer in [{low}, {high}] (ASCII digits), got {raw!r}."
        )
    return value


def _session_id(request: Request) -> str:
    sid = request.query_params.get("id")
    if sid is None:
        raise InvalidInputError(
            f"Name the session with the query parameter 'id': {request.url.path}?id=SESSION_ID."
        )
    return sid


# -- read handlers -----------------------------------------------------------------------------
async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def info(request: Request) -> Response:
    from stello_graph import __version__

    inspector = _state(request)
    return JSONResponse(
        {
            "tree_id": inspector.storage.tree_id,
            "write": inspector.write,
            "database": inspector.label,
            "version": __version__,
            "chars_per_token": _views.CHARS_PER_TOKEN,
        }
    )


async def tree(request: Request) -> Response:
    compact = request.query_params.get("compact", "") not in ("", "0", "false")
    body = await run_in_threadpool(_state(request).tree_json, compact)
    return Response(body, media_type="application/json")


async def session(request: Request) -> Response:
    sid = _session_id(request)
    data = await run_in_threadpool(_views.session_view, _state(request).storage, sid)
    return JSONResponse(data)


async def records(request: Request) -> Response:
    sid = _session_id(request)
    offset = _int_param(request, "offset", 0, 0, 10**9)
    limit = _int_param(request, "limit", 200, 1, _views.MAX_PAGE)
    storage = _state(request).storage
    data = await run_in_threadpool(
        lambda: _views.records_page(storage, sid, offset=offset, limit=limit)
    )
    return JSONResponse(data)


async def context(request: Request) -> Response:
    sid = _session_id(request)
    inspector = _state(request)
    data = await run_in_threadpool(
        lambda: _views.context_view(
            inspector.storage, sid, policy=inspector.policy, topology_slot=inspector.topology_slot
        )
    )
    return JSONResponse(data)


async def event_stream(request: Request) -> Response:
    inspector = _state(request)
    resumed = request.headers.get("last-event-id")  # an EventSource reconnecting
    cursor = _integer("Last-Event-ID", resumed, 0, 0, 10**18)
    if resumed is None:
        cursor = _int_param(request, "after", 0, 0, 10**18)

    async def stream() -> AsyncIterator[str]:
        nonlocal cursor
        if cursor > inspector.feed.seq:  # a cursor of a previous server: start over
            cursor = 0
        yield "retry: 2000\n\n"
        idle = 0.0
        while not inspector.stopping.is_set():
            if not inspector.polling:  # no poll loop (an app run without its lifespan)
                await run_in_threadpool(inspector.refresh)
            found = inspector.feed.after(cursor)
            for event in found:
                yield f"id: {event['seq']}\nevent: stello\ndata: {json.dumps(event)}\n\n"
                cursor = event["seq"]
            idle = 0.0 if found else idle + inspector.poll_interval
            if idle >= 15:  # a comment now and then keeps proxies from closing the stream
                idle = 0.0
                yield ": keep-alive\n\n"
            await _sleep_unless(inspector.stopping, inspector.poll_interval)
            if await request.is_disconnected():
                break

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


# -- write handlers ------------------------------------------------------------------------------
async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidInputError(f"The request body is not JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise InvalidInputError(f"The request body must be a JSON object, got {body!r:.60}.")
    return body


def _refuse(inspector: Inspector, request: Request) -> Response | None:
    """Why a write is refused (403), if it is: read-only, or not sent by the inspector's own
    page. A JSON content type and the token header make a browser ask first (a CORS
    preflight, which this app never grants); the Origin and the token stop the rest."""
    if not inspector.write:
        return _error(403, "The inspector is read-only; start it with --write to change the tree.")
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        return _error(403, f"A write needs Content-Type: application/json, got {media or None!r}.")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    if origin is None or origin.lower() != own:
        return _error(
            403, f"A write needs the Origin {own!r} of the inspector's page, got {origin!r}."
        )
    if not inspector.has_token(request.headers.get(TOKEN_HEADER)):
        return _error(
            403,
            f"A write needs the inspector's token in {TOKEN_HEADER}: open the URL "
            "`stello-graph inspect` printed (?token=...).",
        )
    return None


async def session_write(request: Request) -> Response:
    inspector = _state(request)
    refused = _refuse(inspector, request)
    if refused is not None:
        return refused
    sid, action = _session_id(request), request.path_params["action"]
    write = _writes.WRITES.get(action)
    if write is None:
        return _error(404, f"No write {action!r}; use one of {sorted(_writes.WRITES)}.")
    body = await _body(request)
    data = await run_in_threadpool(inspector.run_write, lambda agent: write(agent, sid, body))
    return JSONResponse(data, status_code=201 if action == "fork" else 200)


async def integrate(request: Request) -> Response:
    inspector = _state(request)
    refused = _refuse(inspector, request)
    if refused is not None:
        return refused
    body = await _body(request)
    data = await run_in_threadpool(inspector.run_write, lambda a: _writes.integrate(a, body))
    return JSONResponse(data)


async def not_found(request: Request) -> Response:
    return _error(404, f"No API route {request.url.path!r}; see GET /api/tree.")


def create_app(
    storage: MainStorage,
    *,
    write: bool = False,
    agent: Callable[[], StelloAgent] | None = None,
    events: EventSource | None = None,
    policy: CompressionPolicy | None = None,
    poll_interval: float = 0.5,
    label: str = "",
    topology_slot: TopologySlot | bool | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> Starlette:
    """The inspector app over `storage`.

    Its token (`app.state.inspector.token`, new for each app) is what a write must carry in
    the `X-Stello-Token` header; `stello-graph inspect` prints it in the page's URL
    (`http://127.0.0.1:8321/?token=...`), and the page sends it.

    Args:
        storage: the tree to show (read at every request: other processes' changes show).
        write: allow the writes (fork, consolidate, integrate, archive, insight, system
            prompt); without it they answer 403.
        agent: makes the `StelloAgent` writes go through (default: one with the offline
            scripted model and memory functions, as `stello-graph chat --model scripted`).
        events: the source of `/api/events` (default: a `PollingEventSource`).
        policy: the compression policy of the tree's agent, if known: the context view then
            says whether the next turn would compress.
        poll_interval: seconds between two polls of the event source per open stream.
        topology_slot: the topology slot of the tree's agent, if it shows one
            (`StelloConfig.topology_slot`): the context view then shows it too.
        label: how the page names the database (a path).
        host: the address it is served on: a request's `Host` must name it or a loopback
            name (127.0.0.1, localhost, [::1]), else it is refused with 421. In process,
            name the client's host (Starlette's `TestClient`: `host="testserver"`). Off
            loopback with `write`, reads need the token too.
        port: the port it is served on, which a `Host` must give too (`None`: any port).

    Raises:
        InvalidInputError: a `poll_interval` that is not a positive number; a blank `host`
            or a `port` outside [1, 65535].
    """
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float):
        raise InvalidInputError(f"poll_interval must be a number, got {poll_interval!r}.")
    if not 0 < poll_interval <= 60:
        raise InvalidInputError(f"poll_interval must be in (0, 60] seconds, got {poll_interval!r}.")
    if not isinstance(host, str) or not host.strip():
        raise InvalidInputError(f"host must name the address served, got {host!r}.")
    bad_port = isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535
    if port is not None and bad_port:
        raise InvalidInputError(f"port must be an int in [1, 65535] or None, got {port!r}.")
    inspector = Inspector(
        storage,
        write=write,
        agent=agent,
        events=events,
        policy=policy,
        poll_interval=float(poll_interval),
        label=label,
        topology_slot=check_topology_slot(topology_slot),
        host=host,
        port=port,
    )
    routes = [
        Route("/", index),
        Route("/api/info", info),
        Route("/api/tree", tree),
        Route("/api/events", event_stream),
        # the session is `?id=`: every id the library takes (`a/b`, `..`) survives in a query
        Route("/api/session", session),
        Route("/api/session/records", records),
        Route("/api/session/context", context),
        Route("/api/session/{action:str}", session_write, methods=["POST", "PUT"]),
        Route("/api/integrate", integrate, methods=["POST"]),
        Route("/api/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.create_task(inspector.poll_loop())
        try:
            yield
        finally:
            inspector.stopping.set()
            try:
                await loop  # the poll's last read ends before the agent closes
            finally:  # closing waits for the agent's background jobs: not on the loop
                await run_in_threadpool(inspector.close)

    app = Starlette(
        routes=routes,
        middleware=[Middleware(_Guard, inspector=inspector)],
        lifespan=lifespan,
        exception_handlers={StelloError: _stello_error, HTTPException: _http_error},
    )
    app.state.inspector = inspector
    return app
