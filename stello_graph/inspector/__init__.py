"""The inspector: a local web page over a stored tree (`stello-graph inspect`).

It shows the tree as an interactive star map, each session (transcript, L2, insight,
synthesis), the exact prompt its next turn would send, and a live timeline of changes. It
needs the `inspector` extra (`pip install "stello-graph[inspector]"`).

`create_app(storage)` is the Starlette app; `serve` runs it with uvicorn.
"""

from __future__ import annotations

try:  # the extra's web framework: say how to get it rather than fail on the bare import
    import starlette  # noqa: F401
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        'stello_graph.inspector needs its extra: pip install "stello-graph[inspector]" '
        f"({exc.name} is missing).",
        name=exc.name,
    ) from None

from stello_graph.inspector._events import EVENT_TYPES, EventSource, PollingEventSource
from stello_graph.inspector._views import context_view, records_page, session_view, tree_view
from stello_graph.inspector.app import create_app

__all__ = [
    # the app
    "create_app",
    # events
    "EVENT_TYPES",
    "EventSource",
    "PollingEventSource",
    # the API's data
    "context_view",
    "records_page",
    "session_view",
    "tree_view",
]
