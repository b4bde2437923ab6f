"""stello-graph: session topology for LangGraph.

A conversation becomes a tree of independent `Session`s under one `MainSession`. Each child
keeps its raw history (L3) and an outward summary (L2, made by `consolidate`); the main
session reads only the children's L2, `integrate`s them into a synthesis and pushes insights
back to single children.

Every name but the error classes (which need the standard library only) is imported lazily,
on first use: `import stello_graph` alone loads neither LangChain nor LangGraph (the session
core loads LangChain's messages; the orchestration layer, LangGraph).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stello_graph import errors as _errors
from stello_graph.errors import *  # noqa: F403 (every error class; the standard library only)

if TYPE_CHECKING:
    # What type checkers and IDEs read: `X as X` re-exports each name, as `__all__` (built from
    # `_EXPORTS` at run time) cannot tell them. The errors are imported above, eagerly.
    from stello_graph._base import TurnContext as TurnContext
    from stello_graph._stream import AsyncSessionStream as AsyncSessionStream
    from stello_graph._stream import SessionStream as SessionStream
    from stello_graph._topology_slot import TopologySlot as TopologySlot
    from stello_graph._topology_slot import TopologyView as TopologyView
    from stello_graph.agent import StelloAgent as StelloAgent
    from stello_graph.agent import TurnResult as TurnResult
    from stello_graph.checkpoints import InMemoryMainStorage as InMemoryMainStorage
    from stello_graph.checkpoints import SqliteMainStorage as SqliteMainStorage
    from stello_graph.compression import CompressionPolicy as CompressionPolicy
    from stello_graph.config import StelloConfig as StelloConfig
    from stello_graph.digest import SessionDigest as SessionDigest
    from stello_graph.events import StelloEvent as StelloEvent
    from stello_graph.events import StoredEvent as StoredEvent
    from stello_graph.events import StoredEvents as StoredEvents
    from stello_graph.export import export_tree as export_tree
    from stello_graph.graph import StelloState as StelloState
    from stello_graph.graph import build_stello_graph as build_stello_graph
    from stello_graph.lineage import ForkPoint as ForkPoint
    from stello_graph.main_session import MainSession as MainSession
    from stello_graph.memory import CompressFn as CompressFn
    from stello_graph.memory import ConsolidateFn as ConsolidateFn
    from stello_graph.memory import IntegrateFn as IntegrateFn
    from stello_graph.memory import llm_compressor as llm_compressor
    from stello_graph.memory import llm_consolidator as llm_consolidator
    from stello_graph.memory import llm_integrator as llm_integrator
    from stello_graph.middleware import StelloMiddleware as StelloMiddleware
    from stello_graph.models import ChildL2 as ChildL2
    from stello_graph.models import Compression as Compression
    from stello_graph.models import IntegrationResult as IntegrationResult
    from stello_graph.models import SendResult as SendResult
    from stello_graph.models import SessionMeta as SessionMeta
    from stello_graph.models import TopologyNode as TopologyNode
    from stello_graph.models import TreeIntegration as TreeIntegration
    from stello_graph.nodes.state import StelloContext as StelloContext
    from stello_graph.profiles import ForkProfile as ForkProfile
    from stello_graph.profiles import SplitGuard as SplitGuard
    from stello_graph.schedule import BackgroundFailure as BackgroundFailure
    from stello_graph.schedule import Schedule as Schedule
    from stello_graph.session import Session as Session
    from stello_graph.skills import Skill as Skill
    from stello_graph.skills import load_skills as load_skills
    from stello_graph.storage import MainStorage as MainStorage
    from stello_graph.storage import SessionStorage as SessionStorage
    from stello_graph.topology import Topology as Topology

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    # the session core (loads LangChain's messages)
    "stello_graph._base": ("TurnContext",),
    "stello_graph._stream": ("AsyncSessionStream", "SessionStream"),
    "stello_graph._topology_slot": ("TopologySlot", "TopologyView"),
    "stello_graph.compression": ("CompressionPolicy",),
    "stello_graph.digest": ("SessionDigest",),
    "stello_graph.lineage": ("ForkPoint",),
    "stello_graph.main_session": ("MainSession",),
    "stello_graph.memory": (
        "CompressFn",
        "ConsolidateFn",
        "IntegrateFn",
        "llm_compressor",
        "llm_consolidator",
        "llm_integrator",
    ),
    "stello_graph.models": (
        "ChildL2",
        "Compression",
        "IntegrationResult",
        "SendResult",
        "SessionMeta",
        "TopologyNode",
        "TreeIntegration",
    ),
    "stello_graph.profiles": ("ForkProfile", "SplitGuard"),
    "stello_graph.session": ("Session",),
    "stello_graph.storage": ("MainStorage", "SessionStorage"),
    "stello_graph.checkpoints": ("InMemoryMainStorage", "SqliteMainStorage"),
    # orchestration (loads LangGraph)
    "stello_graph.agent": ("StelloAgent", "TurnResult"),
    "stello_graph.middleware": ("StelloMiddleware",),
    "stello_graph.config": ("StelloConfig",),
    "stello_graph.graph": ("build_stello_graph", "StelloState"),
    "stello_graph.nodes.state": ("StelloContext",),
    "stello_graph.schedule": ("Schedule", "BackgroundFailure"),
    "stello_graph.events": ("StelloEvent", "StoredEvent", "StoredEvents"),
    "stello_graph.topology": ("Topology",),
    "stello_graph.export": ("export_tree",),
    # skills (load YAML)
    "stello_graph.skills": ("Skill", "load_skills"),
}
"""Where each public name lives: `import stello_graph` loads none of them (the command line's
`--version` starts without LangChain); a name is imported on first use (PEP 562)."""

_LAZY = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [*_LAZY, *_errors.__all__, "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stello_graph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
