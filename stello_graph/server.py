"""Deploy the stello graph on LangGraph Server: `amake_graph`, the factory `langgraph.json` names.

```json
{"dependencies": ["."], "graphs": {"stello": "stello_graph.server:amake_graph"}}
```

The server enters `amake_graph(config)` for each run (and each read of a thread's state),
compiles the graph it yields with its own checkpointer and store, and leaves it when the run
ends. `make_graph` returns the graph itself, for use in process. The factories read their
environment once per process:

* `STELLO_DATABASE_URI`: where the trees live, a SQLite path (default `stello.db`) or a
  `postgresql://` DSN, opened as `StelloAgent(storage=...)` opens such a string.
* `STELLO_MODEL`: `scripted` for an offline model that quotes the user (and calls a tool
  for a message `/call NAME {"arg": ...}`: see `scripted_model`); a `provider:model` name
  (`anthropic:claude-sonnet-4-5`, `openai:gpt-4o-mini`), built by LangChain's
  `init_chat_model` with the provider's own variables (`ANTHROPIC_API_KEY`, ...);
  otherwise a model name for `ChatOpenAI`, which reads `OPENAI_BASE_URL` and
  `OPENAI_API_KEY` (see `_env_model`).
* `STELLO_TOOLS` (optional): tools every session's model is given, as comma-separated
  `module:attribute` paths, each attribute a tool or a list of tools.
* `STELLO_CONSOLIDATE_EVERY` (optional, default `8`): consolidate a session every N user
  turns on it; `STELLO_INTEGRATE_EVERY` (optional, default `0`): also integrate every N user
  turns of the tree. `0` turns a trigger off, both `0` turn background memory off. With a
  schedule, archived sessions are consolidated too, and every consolidation is followed by
  an integration (see `server_schedule`).
* `STELLO_MAX_OPEN_TREES` (optional, default `64`): how many trees a process keeps open (a
  positive whole number; see below).

Background memory runs in each worker process, on threads beside the server's event loop.
Nothing due is kept only in memory: each worker scans the tree for due work when it opens
it and every minute, and each job runs under a claim stored with the tree, so across
workers and restarts every due consolidation runs, and never twice at once
(`stello_graph.schedule`).

`tree_id` chooses the tree (one per user: give each user's threads their own); its main
session is created on first use. A thread is a conversation: its first `{"messages": [...]}`
run binds it to the session the run names (`session_id`), else to a new child of the main
session, and its later runs continue it (`stello_graph.nodes.entry`); a `{"session_id",
"input"}` run names its own. Both keys are read from the run's context (`StelloContext`,
LangGraph v1's `context=`) or from `configurable`.

A tree is opened on its first run in the process and kept open for the next ones, up to
`STELLO_MAX_OPEN_TREES` trees (each open tree holds database connections and a scheduler
thread). Opening one more closes the least recently used trees that no run uses. A server
run uses its tree from the moment the server enters `amake_graph` until the run ends; a run
of a graph `make_graph` returned uses it while the run is in flight. A closed tree finishes
its queued background jobs first (the due ones not queued yet are stored, as ever) and
reopens on its next run with nothing lost. When every other tree has a run in flight, none
is closed and the count goes over the limit until a later opening finds idle ones. A graph
`make_graph` returned may be closed between the call and its run's start when that many
other trees open meanwhile: the server uses `amake_graph`, which holds its tree from the
call on.

Opening and closing trees is blocking I/O, which `amake_graph` runs in a worker thread it
awaits: the server's event loop runs no database call and keeps serving other runs
meanwhile (a sync `make_graph` called on a running loop also opens the tree in a worker
thread, but waits for it there). `close_trees` closes every tree.

Example:
    >>> import os, tempfile
    >>> os.environ["STELLO_MODEL"] = "scripted"
    >>> os.environ["STELLO_DATABASE_URI"] = os.path.join(tempfile.mkdtemp(), "trees.db")
    >>> graph = make_graph({"configurable": {"tree_id": "alice"}}).compile()
    >>> graph.invoke({"messages": [{"role": "user", "content": "Hello"}]})["content"]
    '(scripted) You said: Hello'
    >>> close_trees()
    >>> del os.environ["STELLO_MODEL"], os.environ["STELLO_DATABASE_URI"]
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from stello_graph._cancelled import running_loop
from stello_graph._context import message_text
from stello_graph._validate import (
    MODEL_PROVIDERS,
    check_chat_model,
    check_tools,
    check_tree_id,
    model_provider,
)
from stello_graph.agent import DEFAULT_DB, _open_tree
from stello_graph.config import StelloConfig
from stello_graph.errors import InvalidInputError, ModelNotConfiguredError
from stello_graph.graph import StelloGraph, build_graph
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.schedule import Schedule

__all__ = [
    "CONSOLIDATE_ENV",
    "DATABASE_ENV",
    "INTEGRATE_ENV",
    "MAX_OPEN_TREES_ENV",
    "MODEL_ENV",
    "TOOLS_ENV",
    "close_trees",
    "amake_graph",
    "make_graph",
    "open_tree",
    "scripted_model",
    "server_schedule",
]

DATABASE_ENV = "STELLO_DATABASE_URI"
"""The environment variable naming the database (a SQLite path or a `postgresql://` DSN)."""
MODEL_ENV = "STELLO_MODEL"
"""The environment variable naming the model (`scripted`, `provider:model`, or a `ChatOpenAI`
model name)."""
TOOLS_ENV = "STELLO_TOOLS"
"""The environment variable listing the sessions' tools (`module:attribute`, comma-separated)."""

CONSOLIDATE_ENV = "STELLO_CONSOLIDATE_EVERY"
"""The environment variable: consolidate a session every N user turns (default 8; 0: never)."""
INTEGRATE_ENV = "STELLO_INTEGRATE_EVERY"
"""The environment variable: integrate every N user turns of the tree (default 0: never)."""
MAX_OPEN_TREES_ENV = "STELLO_MAX_OPEN_TREES"
"""The environment variable: how many trees a process keeps open (default 64)."""
DEFAULT_MAX_OPEN_TREES = 64
"""Trees a process keeps open when `STELLO_MAX_OPEN_TREES` is unset: two database
connections and a scheduler thread each, well within the usual limit of 1,024 open files."""
DEFAULT_CONSOLIDATE_EVERY = 8
"""User turns between a session's consolidations when `STELLO_CONSOLIDATE_EVERY` is unset:
about a screen of conversation, so the L2 stays close to the session without a model call
for memory on most turns."""

_T = TypeVar("_T")
_CALL = re.compile(r"^/call\s+([A-Za-z_][\w-]*)\s*(\{.*\})?\s*$", re.DOTALL)


# -- the offline model ----------------------------------------------------------------------
def _scripted_reply(messages: list[BaseMessage]) -> str | dict[str, Any]:
    from stello_graph.cli._offline import _echo

    last = messages[-1] if messages else None
    if isinstance(last, ToolMessage):
        return f"(scripted) {last.name} returned: {message_text(last.content)}"
    if last is not None and last.text.strip() == "/prompt":
        said = [m.text for m in messages[:-1] if isinstance(m, HumanMessage)]
        return f"(scripted) I was sent: {' | '.join(said) or 'nothing before this'}"
    called = _CALL.match(last.text) if last is not None else None
    if called is None:
        return _echo(messages)
    try:
        args = json.loads(called[2] or "{}")
    except ValueError:
        return f"(scripted) The arguments of /call are not JSON: {called[2]!r}."
    return {"content": "", "tool_calls": [{"name": called[1], "args": args}]}


def scripted_model() -> BaseChatModel:
    """The offline model of `STELLO_MODEL=scripted`: deterministic, no provider.

    It answers `(scripted) You said: ...`; a user message `/call NAME {"arg": ...}` makes it
    call the tool `NAME` with those arguments, and a tool's result is answered with
    `(scripted) NAME returned: ...`; a user message `/prompt` is answered with the user
    messages of the prompt before it (`(scripted) I was sent: a | b`), which shows what a
    session's context holds. It streams word by word, like a provider.
    """
    from stello_graph.testing import ScriptedChatModel

    return ScriptedChatModel(respond=_scripted_reply, name="scripted-server")


# -- the environment ------------------------------------------------------------------------
def _env_model() -> tuple[BaseChatModel, dict[str, Any]]:
    """The model `STELLO_MODEL` names, and the memory functions that go with it.

    A `provider:model` name whose provider LangChain's `init_chat_model` knows is built by it.
    Any other name is a model name for `ChatOpenAI`, as it always was: a bare one
    (`gpt-4o-mini`), an OpenAI fine-tune (`ft:...`), or, with `OPENAI_BASE_URL` set, any
    name of that server, colons included (Ollama's `llama3.2:1b`). Without `OPENAI_BASE_URL`
    a name with another prefix is refused: it would reach OpenAI as a model name.

    Raises:
        ModelNotConfiguredError: `STELLO_MODEL` is not set, or names a provider whose
            integration package is not installed (`pip install langchain-anthropic`).
        InvalidInputError: a `prefix:model` name of no known provider.
    """
    name = os.environ.get(MODEL_ENV, "").strip()
    if not name:
        raise ModelNotConfiguredError(
            f"Set {MODEL_ENV}: 'scripted' for the offline model, 'provider:model' for "
            "LangChain's init_chat_model ('anthropic:claude-sonnet-4-5'), or a model name "
            "for ChatOpenAI (with OPENAI_BASE_URL / OPENAI_API_KEY)."
        )
    if name == "scripted":
        from stello_graph.cli._offline import integrate, summarise

        return scripted_model(), {"consolidate_fn": summarise, "integrate_fn": integrate}
    if model_provider(name) is not None:
        return check_chat_model(name, MODEL_ENV), {}
    prefix, colon, _ = name.partition(":")
    if colon and prefix != "ft" and not os.environ.get("OPENAI_BASE_URL"):
        raise InvalidInputError(
            f"{MODEL_ENV}={name!r}: {prefix!r} is no provider LangChain's init_chat_model "
            f"knows (one of {', '.join(MODEL_PROVIDERS)}). Write 'provider:model', a bare "
            "OpenAI model name, or set OPENAI_BASE_URL to the OpenAI-compatible server "
            "that serves this name."
        )
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=name), {}


def _load_tools(spec: str) -> list[Any]:
    tools: list[Any] = []
    for path in filter(None, (part.strip() for part in spec.split(","))):
        module, _, attribute = path.partition(":")
        if not module or not attribute:
            raise InvalidInputError(f"{TOOLS_ENV}: {path!r} is not of the form module:attribute.")
        found = getattr(importlib.import_module(module), attribute)
        tools.extend(found if isinstance(found, Sequence) else [found])
    return check_tools(tools, TOOLS_ENV)


def _env_number(name: str, default: int, least: int, what: str) -> int:
    """The whole number the variable `name` holds, at least `least` (`default`: unset)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise InvalidInputError(f"{name} must be {what}, got {text!r}.")
    return int(text)


def _every(name: str, default: int) -> int | None:
    return _env_number(name, default, 0, "a whole number of turns (0: off)") or None


def server_schedule() -> Schedule | None:
    """The background memory the environment asks for (`None`: none).

    Consolidate every `STELLO_CONSOLIDATE_EVERY` user turns of a session (default 8) and
    when it is archived, integrate after each consolidation and every
    `STELLO_INTEGRATE_EVERY` user turns of the tree (default: not by turns); scan for due
    work every 60 seconds. Both set to `0`: no schedule.

    Raises:
        InvalidInputError: a value that is not a whole number.
    """
    consolidate = _every(CONSOLIDATE_ENV, DEFAULT_CONSOLIDATE_EVERY)
    integrate = _every(INTEGRATE_ENV, 0)
    if consolidate is None and integrate is None:
        return None
    return Schedule(
        consolidate_every_n_turns=consolidate,
        consolidate_on_archive=True,
        integrate_after_consolidate=True,
        integrate_every_n_turns=integrate,
        recover_every=60.0,
    )


@dataclass(frozen=True, slots=True)
class _Settings:
    uri: str
    config: StelloConfig
    max_open: int


_settings: _Settings | None = None
_lock = threading.Lock()


def _env_settings() -> _Settings:
    """What the environment says, read once per process."""
    global _settings
    with _lock:
        if _settings is None:
            model, memory = _env_model()
            tools = _load_tools(os.environ.get(TOOLS_ENV, ""))
            schedule = server_schedule()
            max_open = _env_number(
                MAX_OPEN_TREES_ENV, DEFAULT_MAX_OPEN_TREES, 1, "a positive whole number of trees"
            )
            config = StelloConfig(model=model, tools=tools, schedule=schedule, **memory)
            _settings = _Settings(os.environ.get(DATABASE_ENV) or DEFAULT_DB, config, max_open)
        return _settings


# -- the trees ------------------------------------------------------------------------------
@dataclass(slots=True)
class _Tree:
    runtime: StelloRuntime
    graph: StelloGraph
    holds: int = 0
    """Server runs that entered `amake_graph` for this tree and have not ended."""


_trees: OrderedDict[tuple[str, str], _Tree] = OrderedDict()
"""The open trees by `(uri, tree_id)`, the least recently used first."""
_registry = threading.Lock()  # `_trees` and the holds: held for dict operations only
_opening = threading.Lock()  # one opening at a time, so a tree is opened once


def _open(uri: str, tree_id: str, config: StelloConfig) -> _Tree:
    with _open_tree(uri, config, tree_id) as (runtime, _):  # the main session: on first use
        return _Tree(runtime, build_graph(runtime))


def _take(key: tuple[str, str], *, hold: bool = False) -> _Tree | None:
    """The open tree of `key` (`None`: not open), now the most recently used; with `hold`,
    held for a server run (`amake_graph` releases it)."""
    with _registry:
        found = _trees.get(key)
        if found is not None:
            _trees.move_to_end(key)
            found.holds += hold
        return found


def _idle_beyond(limit: int) -> list[_Tree]:
    """Forget the least recently used trees no run uses (no server run holds them, no run
    of their graph is in flight) while more than `limit` are open (the newest is kept); the
    caller closes them. Called under `_registry`."""
    oldest = list(_trees.items())[:-1]
    idle = [key for key, tree in oldest if tree.holds <= 0 and tree.runtime.runs <= 0]
    return [_trees.pop(key) for key in idle[: max(0, len(_trees) - limit)]]


def _acquire(key: tuple[str, str], settings: _Settings) -> _Tree:
    """The tree of `key`, opened if it is not (its callers looked first, without the lock);
    opening it closes the idle trees beyond `STELLO_MAX_OPEN_TREES` (blocking I/O: never on
    the event loop)."""
    with _opening:
        found = _take(key)
        if found is not None:
            return found
        opened = _open(*key, settings.config)
        with _registry:
            _trees[key] = opened
            closing = _idle_beyond(settings.max_open)
    for tree in closing:
        tree.runtime.close()  # its queued background jobs first
    return opened


def _off_the_loop(func: Callable[[], _T]) -> _T:
    """`func()`, in a worker thread when this thread runs an event loop."""
    if running_loop() is None:
        return func()
    with ThreadPoolExecutor(1, thread_name_prefix="stello-open") as pool:
        return pool.submit(func).result()


def _get_tree(tree_id: str, uri: str | None = None) -> _Tree:
    """The open tree `tree_id` names, opened if it is not (off the event loop)."""
    settings = _env_settings()
    key = (uri or settings.uri, check_tree_id(tree_id))
    return _take(key) or _off_the_loop(lambda: _acquire(key, settings))


def open_tree(tree_id: str, uri: str | None = None) -> StelloRuntime:
    """The runtime of a tree of the server's database (opened on first use, then kept
    while it is among the `STELLO_MAX_OPEN_TREES` most recently used, or a run uses it).

    Args:
        tree_id: the tree (one per user).
        uri: the database (default: `STELLO_DATABASE_URI`, else `stello.db`).
    """
    return _get_tree(tree_id, uri).runtime


def _tree_id(config: RunnableConfig | None) -> str:
    found = ((config or {}).get("configurable") or {}).get("tree_id")
    return StelloConfig().tree_id if found is None else str(found)


def make_graph(config: RunnableConfig) -> StelloGraph:
    """The stello graph of the tree `configurable.tree_id` names, uncompiled.

    Compile it with any checkpointer and store (the store receives the L2, syntheses and
    insights, see `StelloConfig.store`). The tree is opened on its first run in the
    process, its main session created then if it has none, and kept open while it is
    among the `STELLO_MAX_OPEN_TREES` most recently used or a run of the graph is in
    flight (see the module). On LangGraph Server name `amake_graph`, which holds the
    tree from the call to the run's end.

    Args:
        config: the run's config; `configurable.tree_id` names the tree (default
            `"default"`).

    Raises:
        ModelNotConfiguredError: `STELLO_MODEL` is not set, or names a model that cannot be
            built here (its provider's integration package is not installed, ...).
        InvalidInputError: a bad `tree_id`, `STELLO_MODEL` (a provider LangChain does not
            know), `STELLO_TOOLS` or `STELLO_MAX_OPEN_TREES`.
    """
    return _get_tree(_tree_id(config)).graph


async def _ahold(tree_id: str) -> _Tree:
    """The tree `tree_id` names, held for a run: opened (with the environment, on the
    first call) in a worker thread, awaited; the hold is taken on the loop, so a
    cancelled wait leaves none behind."""
    settings = _settings
    if settings is None:
        settings = await asyncio.to_thread(_env_settings)
    key = (settings.uri, check_tree_id(tree_id))
    while (found := _take(key, hold=True)) is None:
        await asyncio.to_thread(_acquire, key, settings)  # closed again meanwhile: rare
    return found


@asynccontextmanager
async def amake_graph(config: RunnableConfig) -> AsyncIterator[StelloGraph]:
    """The factory `langgraph.json` names: the stello graph of the tree
    `configurable.tree_id` names, uncompiled, held open until the block ends.

    LangGraph Server enters it for each run (and each read of a thread) and leaves it when
    the run ends, so no tree is closed under a run (see the module). Opening a tree for its
    first run never holds up the server's event loop (another tree's transaction, owned by
    a task of that loop, may hold the database's write lock the opening waits for).

    Raises:
        ModelNotConfiguredError: `STELLO_MODEL` is not set, or names a model that cannot be
            built here (its provider's integration package is not installed, ...).
        InvalidInputError: a bad `tree_id`, `STELLO_MODEL` (a provider LangChain does not
            know), `STELLO_TOOLS` or `STELLO_MAX_OPEN_TREES`.
    """
    tree = await _ahold(_tree_id(config))
    try:
        yield tree.graph
    finally:
        with _registry:
            tree.holds -= 1


def close_trees() -> None:
    """Close every tree this process opened, and forget the environment read.

    Finishes their background work first (queued jobs run; due work not queued yet stays
    stored, for the next process to find) and stops their schedulers' threads. The next
    `make_graph` reads the environment again and reopens what it needs.
    """
    global _settings
    with _opening, _registry:
        trees = list(_trees.values())
        _trees.clear()
        with _lock:
            _settings = None
    for tree in trees:
        tree.runtime.close()  # its queued background jobs first


atexit.register(close_trees)
