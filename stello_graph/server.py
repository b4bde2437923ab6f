"""Deploy the stello graph on LangGraph Server: `make_graph`, the factory `langgraph.json` names.

```json
{"dependencies": ["."], "graphs": {"stello": "stello_graph.server:make_graph"}}
```

The server calls `make_graph(config)` for each run and compiles what it returns with its
own checkpointer and store. The factory reads its environment once per process:

* `STELLO_DATABASE_URI`: where the trees live, a SQLite path (default `stello.db`) or a
  `postgresql://` DSN, opened as `StelloAgent(storage=...)` opens such a string.
* `STELLO_MODEL`: `scripted` for an offline model that quotes the user (and calls a tool
  for a message `/call NAME {"arg": ...}`: see `scripted_model`), otherwise a model name
  for `ChatOpenAI`, which reads `OPENAI_BASE_URL` and `OPENAI_API_KEY`.
* `STELLO_TOOLS` (optional): tools every session's model is given, as comma-separated
  `module:attribute` paths, each attribute a tool or a list of tools.

`configurable.tree_id` chooses the tree (one per user: give each user's threads their own);
its main session is created on first use. `configurable.session_id` is the session of a
`{"messages": [...]}` run (default: the main session); a `{"session_id", "input"}` run
names its own.

Each tree is opened once per process and kept open (`close_trees` closes them). Opening one
is blocking I/O; inside a running event loop (the server's) it runs in a worker thread,
so the loop never runs a database call itself.

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from stello_graph._context import message_text
from stello_graph._validate import check_id, check_tools
from stello_graph.agent import DEFAULT_DB, _open_storage
from stello_graph.config import StelloConfig
from stello_graph.errors import InvalidInputError, ModelNotConfiguredError
from stello_graph.graph import StelloGraph, build_graph
from stello_graph.main_session import MainSession
from stello_graph.nodes.deps import StelloRuntime
from stello_graph.storage import MainStorage

__all__ = [
    "DATABASE_ENV",
    "MODEL_ENV",
    "TOOLS_ENV",
    "close_trees",
    "make_graph",
    "open_tree",
    "scripted_model",
]

DATABASE_ENV = "STELLO_DATABASE_URI"
"""The environment variable naming the database (a SQLite path or a `postgresql://` DSN)."""
MODEL_ENV = "STELLO_MODEL"
"""The environment variable naming the model (`scripted`, or a `ChatOpenAI` model name)."""
TOOLS_ENV = "STELLO_TOOLS"
"""The environment variable listing the sessions' tools (`module:attribute`, comma-separated)."""

_T = TypeVar("_T")
_CALL = re.compile(r"^/call\s+([A-Za-z_][\w-]*)\s*(\{.*\})?\s*$", re.DOTALL)


# -- the offline model ----------------------------------------------------------------------
def _scripted_reply(messages: list[BaseMessage]) -> str | dict[str, Any]:
    from stello_graph.cli._offline import _echo

    last = messages[-1] if messages else None
    if isinstance(last, ToolMessage):
        return f"(scripted) {last.name} returned: {message_text(last.content)}"
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
    `(scripted) NAME returned: ...`. It streams word by word, like a provider.
    """
    from stello_graph.testing import ScriptedChatModel

    return ScriptedChatModel(respond=_scripted_reply, name="scripted-server")


# -- the environment ------------------------------------------------------------------------
def _env_model() -> tuple[BaseChatModel, dict[str, Any]]:
    """The model `STELLO_MODEL` names, and the memory functions that go with it."""
    name = os.environ.get(MODEL_ENV, "").strip()
    if not name:
        raise ModelNotConfiguredError(
            f"Set {MODEL_ENV}: 'scripted' for the offline model, or a model name for "
            "ChatOpenAI (with OPENAI_BASE_URL / OPENAI_API_KEY)."
        )
    if name == "scripted":
        from stello_graph.cli._offline import integrate, summarise

        return scripted_model(), {"consolidate_fn": summarise, "integrate_fn": integrate}
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


@dataclass(frozen=True, slots=True)
class _Settings:
    uri: str
    config: StelloConfig


_settings: _Settings | None = None
_lock = threading.Lock()


def _env_settings() -> _Settings:
    """What the environment says, read once per process."""
    global _settings
    with _lock:
        if _settings is None:
            model, memory = _env_model()
            tools = _load_tools(os.environ.get(TOOLS_ENV, ""))
            config = StelloConfig(model=model, tools=tools, **memory)
            _settings = _Settings(os.environ.get(DATABASE_ENV) or DEFAULT_DB, config)
        return _settings


# -- the trees ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Tree:
    storage: MainStorage
    runtime: StelloRuntime
    graph: StelloGraph


_trees: dict[tuple[str, str], _Tree] = {}
_opening = threading.Lock()


def _open(uri: str, tree_id: str, config: StelloConfig) -> _Tree:
    storage = _open_storage(uri, tree_id)
    try:
        if storage.get_main_session() is None:
            MainSession.create(storage, label=config.main_label, system_prompt=config.system_prompt)
        runtime = StelloRuntime(storage, config)
        return _Tree(storage, runtime, build_graph(runtime))
    except BaseException:
        getattr(storage, "close", lambda: None)()
        raise


def _off_the_loop(func: Callable[[], _T]) -> _T:
    """`func()`, in a worker thread when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return func()
    with ThreadPoolExecutor(1, thread_name_prefix="stello-open") as pool:
        return pool.submit(func).result()


def open_tree(tree_id: str, uri: str | None = None) -> StelloRuntime:
    """The runtime of a tree of the server's database (opened on first use, then kept).

    Args:
        tree_id: the tree (one per user).
        uri: the database (default: `STELLO_DATABASE_URI`, else `stello.db`).
    """
    settings = _env_settings()
    key = (uri or settings.uri, check_id(tree_id, "tree_id"))
    found = _trees.get(key)
    if found is None:
        with _opening:
            found = _trees.get(key)
            if found is None:
                found = _off_the_loop(lambda: _open(key[0], key[1], settings.config))
                _trees[key] = found
    return found.runtime


def _tree_id(config: RunnableConfig | None) -> str:
    found = ((config or {}).get("configurable") or {}).get("tree_id")
    return StelloConfig().tree_id if found is None else str(found)


def make_graph(config: RunnableConfig) -> StelloGraph:
    """The stello graph of the tree `configurable.tree_id` names, uncompiled.

    LangGraph Server compiles it with its own checkpointer and store (the store receives
    the L2, syntheses and insights, see `StelloConfig.store`). The tree is opened on its
    first run in the process and kept; its main session is created then if it has none.

    Args:
        config: the run's config; `configurable.tree_id` names the tree (default
            `"default"`).

    Raises:
        ModelNotConfiguredError: `STELLO_MODEL` is not set.
        InvalidInputError: a bad `tree_id` or `STELLO_TOOLS`.
    """
    tree_id = _tree_id(config)
    open_tree(tree_id)
    return _trees[(_env_settings().uri, tree_id)].graph


def close_trees() -> None:
    """Close every tree this process opened, and forget the environment read.

    Finishes their background work first. The next `make_graph` reads the environment
    again and reopens what it needs.
    """
    global _settings
    with _opening:
        trees = list(_trees.values())
        _trees.clear()
        with _lock:
            _settings = None
    for tree in trees:
        if tree.runtime.scheduler is not None:
            tree.runtime.scheduler.close(wait=True)
        getattr(tree.storage, "close", lambda: None)()


atexit.register(close_trees)
