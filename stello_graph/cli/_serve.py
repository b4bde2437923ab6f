"""`stello-graph inspect`: serve the inspector page over a stored tree, on this machine only.

Starlette and uvicorn are imported here, on first use, so the other commands never pay for
them; without the `inspector` extra the command says how to install it.
"""

from __future__ import annotations

import argparse
import errno
import socket
import threading
import webbrowser
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from stello_graph.cli._common import CliError, Console, open_storage

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from stello_graph.agent import StelloAgent
    from stello_graph.storage import MainStorage

__all__ = ["DEFAULT_PORT", "listen", "run_inspect"]

DEFAULT_PORT = 8321
"""The port `inspect` listens on unless told otherwise (`--port 0`: any free port)."""
_EXTRA = 'the inspector needs its extra: pip install "stello-graph[inspector]"'


def _check_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CliError(f"{_EXTRA} ({exc.name} is missing).") from None


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (0: a free port), with Nagle's algorithm off
    on the connections it accepts (a response's headers and body are written apart: with it
    on, keep-alive requests waited 40 ms for a delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"port {port} on {host} is in use; pick another with --port N "
                "(--port 0 takes a free one)."
            ) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
    sock.listen(64)
    sock.setblocking(False)
    return sock


def _agent_factory(
    args: argparse.Namespace, env: Mapping[str, str], model: BaseChatModel | None
) -> Callable[[MainStorage], StelloAgent]:
    """How writes get their agent: the given model, the one `--model` / `STELLO_MODEL` name,
    or the offline scripted one (with offline consolidation and integration). A named model
    is built here, when the command starts with `--write`: a name that cannot be built stops
    the command at once, not at the page's first write."""
    from stello_graph.cli._provider import ProviderSettings, build_chat_model

    settings = ProviderSettings.from_env(env, model=args.model, base_url=args.base_url)
    chosen = model
    if chosen is None and args.write and settings.model is not None and not settings.offline:
        chosen = build_chat_model(settings)

    def make(storage: MainStorage) -> StelloAgent:
        from stello_graph.agent import StelloAgent
        from stello_graph.cli import _offline

        if chosen is None:
            return StelloAgent(
                model=_offline.echo_model(),
                storage=storage,
                consolidate_fn=_offline.summarise,
                integrate_fn=_offline.integrate,
            )
        return StelloAgent(model=chosen, storage=storage)

    return make


def _check_address(host: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise CliError(f"--port must be in [0, 65535], got {port!r}.")
    if not host.strip():
        raise CliError("--host must name an address, e.g. 127.0.0.1.")


def run_inspect(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    """Serve the inspector until Ctrl-C or SIGTERM; print its URL on a line of its own."""
    _check_extra()
    _check_address(args.host, args.port)
    storage, label = open_storage(args.db, args.tree_id)
    try:
        sock = listen(args.host, args.port)
    except BaseException:
        _close(storage)
        raise
    try:
        return _serve(args, console, env, model, storage, label, sock)
    finally:
        sock.close()
        _close(storage)


def _close(storage: object) -> None:
    close = getattr(storage, "close", None)
    if close is not None:
        close()


def _serve(
    args: argparse.Namespace,
    console: Console,
    env: Mapping[str, str],
    model: BaseChatModel | None,
    storage: MainStorage,
    label: str,
    sock: socket.socket,
) -> int:
    import uvicorn

    from stello_graph.inspector.app import Inspector, create_app, is_loopback

    make = _agent_factory(args, env, model)
    port = sock.getsockname()[1]
    app = create_app(
        storage,
        write=args.write,
        agent=lambda: make(storage),
        label=label,
        host=args.host,
        port=port,
    )
    inspector: Inspector = app.state.inspector
    shown = f"[{args.host}]" if ":" in args.host else args.host  # the name the server answers to
    url = f"http://{shown}:{port}/"
    if args.write:  # the page takes the token from its URL; no other site's page has it
        url += f"?token={inspector.token}"
    mode = "read-write (--write)" if args.write else "read-only"
    console.say(f"stello-graph inspector: tree {args.tree_id!r} of {label}, {mode}")
    if not is_loopback(args.host):
        needs = " with the token of the URL below (writes need it too)" if args.write else ""
        console.stderr.write(
            f"stello-graph: warning: --host {args.host} is not a loopback address: whoever "
            f"reaches this machine on port {port} can read the tree{needs}.\n"
        )
    console.say(url)
    console.say(console.dim("Ctrl-C stops it."))
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        loop="asyncio",
        timeout_graceful_shutdown=3,
        access_log=False,
    )
    server = _make_server(config, inspector.stopping)
    if not args.no_browser:
        threading.Timer(0.5, webbrowser.open, (url,)).start()
    server.run(sockets=[sock])
    console.say("stopped.")
    return 0


def _make_server(config: Any, stopping: threading.Event) -> Any:
    """A uvicorn server whose Ctrl-C / SIGTERM also ends the open event streams, and that
    returns normally afterwards (uvicorn would raise the signal again once stopped)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            stopping.set()
            if self.should_exit:
                self.force_exit = True  # a second Ctrl-C: stop now
            self.should_exit = True

    return Server(config)
