"""stello-graph: session topology for LangGraph.

A conversation becomes a tree of independent `Session`s under one `MainSession`. Each child
keeps its raw history (L3) and an outward summary (L2, made by `consolidate`); the main
session reads only the children's L2, `integrate`s them into a synthesis and pushes insights
back to single children.

The session core imported here does not load LangGraph. Names of the storage backends and of
the orchestration layer are imported lazily, on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stello_graph._base import TurnContext
from stello_graph._stream import AsyncSessionStream, SessionStream
from stello_graph._topology_slot import TopologySlot, TopologyView
from stello_graph.compression import CompressionPolicy
from stello_graph.digest import SessionDigest
from stello_graph.errors import (
    ConsolidationError,
    DuplicateLabelError,
    DuplicateSessionError,
    ForeignDatabaseError,
    FunctionCallError,
    FunctionNotConfiguredError,
    IntegrationError,
    InvalidInputError,
    LeaseLostError,
    MainSessionExistsError,
    MainSessionForkError,
    MainSessionNotFoundError,
    ModelCallError,
    ModelNotConfiguredError,
    NodeHasChildrenError,
    NodeNotFoundError,
    NotADatabaseError,
    NothingToIntegrateError,
    SchemaVersionError,
    SessionArchivedError,
    SessionBusyError,
    SessionError,
    SessionNotFoundError,
    SkillLoadError,
    SplitGuardError,
    StelloError,
    StelloUsageError,
    StorageError,
    StorageUnavailableError,
    StreamNotFinishedError,
    TimeTravelError,
    ToolRoundLimitError,
    TopologyCycleError,
    TopologyError,
    TurnOutOfRangeError,
    UnknownProfileError,
)
from stello_graph.lineage import ForkPoint
from stello_graph.main_session import MainSession
from stello_graph.memory import (
    CompressFn,
    ConsolidateFn,
    IntegrateFn,
    llm_compressor,
    llm_consolidator,
    llm_integrator,
)
from stello_graph.models import (
    ChildL2,
    Compression,
    IntegrationResult,
    SendResult,
    SessionMeta,
    TopologyNode,
    TreeIntegration,
)
from stello_graph.profiles import ForkProfile, SplitGuard
from stello_graph.session import Session
from stello_graph.storage import MainStorage, SessionStorage

if TYPE_CHECKING:
    from stello_graph.agent import StelloAgent, TurnResult
    from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
    from stello_graph.config import StelloConfig
    from stello_graph.events import StelloEvent, StoredEvent, StoredEvents
    from stello_graph.export import export_tree
    from stello_graph.graph import StelloState, build_stello_graph
    from stello_graph.schedule import BackgroundFailure, Schedule
    from stello_graph.skills import Skill, load_skills
    from stello_graph.topology import Topology

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "InMemoryMainStorage": "stello_graph.checkpoints",
    "SqliteMainStorage": "stello_graph.checkpoints",
    # orchestration (loads LangGraph)
    "StelloAgent": "stello_graph.agent",
    "TurnResult": "stello_graph.agent",
    "StelloConfig": "stello_graph.config",
    "build_stello_graph": "stello_graph.graph",
    "StelloState": "stello_graph.graph",
    "Schedule": "stello_graph.schedule",
    "BackgroundFailure": "stello_graph.schedule",
    "StelloEvent": "stello_graph.events",
    "StoredEvent": "stello_graph.events",
    "StoredEvents": "stello_graph.events",
    "Topology": "stello_graph.topology",
    "export_tree": "stello_graph.export",
    # skills (load YAML)
    "Skill": "stello_graph.skills",
    "load_skills": "stello_graph.skills",
}

__all__ = [
    # orchestration
    "StelloAgent",
    "StelloConfig",
    "TurnResult",
    "build_stello_graph",
    "StelloState",
    "Schedule",
    "BackgroundFailure",
    "StelloEvent",
    "StoredEvent",
    "StoredEvents",
    "Topology",
    "export_tree",
    "TreeIntegration",
    "ForkProfile",
    "SplitGuard",
    "Skill",
    "load_skills",
    "CompressionPolicy",
    "Compression",
    "TopologySlot",
    "TopologyView",
    # sessions
    "Session",
    "MainSession",
    "SessionStream",
    "AsyncSessionStream",
    "TurnContext",
    # models
    "SessionMeta",
    "TopologyNode",
    "SendResult",
    "ChildL2",
    "IntegrationResult",
    "ForkPoint",
    "SessionDigest",
    # memory functions
    "ConsolidateFn",
    "IntegrateFn",
    "CompressFn",
    "llm_consolidator",
    "llm_integrator",
    "llm_compressor",
    # storage
    "SessionStorage",
    "MainStorage",
    "SqliteMainStorage",
    "InMemoryMainStorage",
    # errors
    "StelloError",
    "StelloUsageError",
    "InvalidInputError",
    "ModelNotConfiguredError",
    "FunctionNotConfiguredError",
    "MainSessionForkError",
    "NothingToIntegrateError",
    "StreamNotFinishedError",
    "TimeTravelError",
    "ToolRoundLimitError",
    "SessionError",
    "SessionNotFoundError",
    "MainSessionNotFoundError",
    "SessionArchivedError",
    "DuplicateSessionError",
    "MainSessionExistsError",
    "SessionBusyError",
    "LeaseLostError",
    "TopologyError",
    "NodeNotFoundError",
    "NodeHasChildrenError",
    "TopologyCycleError",
    "ModelCallError",
    "FunctionCallError",
    "ConsolidationError",
    "IntegrationError",
    "StorageError",
    "SchemaVersionError",
    "NotADatabaseError",
    "ForeignDatabaseError",
    "StorageUnavailableError",
    "UnknownProfileError",
    "SplitGuardError",
    "SkillLoadError",
    "TurnOutOfRangeError",
    "DuplicateLabelError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stello_graph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
