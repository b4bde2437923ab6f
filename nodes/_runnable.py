"""`StelloNode`: the runnable every `make_*_node` returns.

A node is a pair of functions of the state (sync and async), optionally taking the run's
config as a second argument. Inside a LangGraph graph the node's run is already traced by the
graph (one run per task, named after the node) and its config is already the context of the
call, so the node calls its function directly: no nested run, no signature inspection per
call. Invoked on its own, it is a run of its own, as any runnable is, and its config
(callbacks, tags) reaches the model call it makes.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config

__all__ = ["StelloNode"]

State = Mapping[str, Any]  # each node's own TypedDict (`stello_graph.nodes.state`)


def _takes_config(func: Callable[..., Any]) -> bool:
    return "config" in inspect.signature(func).parameters


class StelloNode(Runnable[Any, Any]):
    """A LangGraph node with a sync and an async path (`invoke` / `ainvoke`)."""

    def __init__(
        self,
        name: str,
        func: Callable[..., State],
        afunc: Callable[..., Awaitable[State]],
    ) -> None:
        self.name = name
        self.func = func
        self.afunc = afunc
        self._config = _takes_config(func)
        self._aconfig = _takes_config(afunc)

    def __repr__(self) -> str:
        return f"StelloNode({self.name!r})"

    def _call(self, input: State, config: RunnableConfig) -> State:
        return self.func(input, config) if self._config else self.func(input)

    async def _acall(self, input: State, config: RunnableConfig) -> State:
        return await (self.afunc(input, config) if self._aconfig else self.afunc(input))

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if config is not None and var_child_runnable_config.get() is config:
            return self._call(input, config)  # a graph's task: its config is the context
        # LangChain passes `config=` to a function that takes one (its annotation omits it)
        return self._call_with_config(self._call, input, config)  # type: ignore[arg-type]

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if config is not None and var_child_runnable_config.get() is config:
            return await self._acall(input, config)
        return await self._acall_with_config(self._acall, input, config)  # type: ignore[arg-type]
