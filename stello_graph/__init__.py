"""stello-graph: session topology for LangGraph.

A conversation becomes a tree of independent `Session`s under one `MainSession`. Each child
keeps its raw history (L3) and an outward summary (L2, made by `consolidate`); the main
session reads only the children's L2, `integrate`s them into a synthesis and pushes insights
back to single children.

Every name is imported lazily, on first use: `import stello_graph` alone loads neither
LangChain nor LangGraph (the session core loads LangChain's messages; the orchestration
layer, LangGraph).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stello_graph._base import TurnContext
    from stello_graph._stream import AsyncSessionStream, SessionStream
    from stello_graph._topology_slot import TopologySlot, TopologyView
    from stello_graph.agent import StelloAgent, TurnResult
    from stello_graph.checkpoints import InMemoryMainStorage, SqliteMainStorage
    from stello_graph.compression import CompressionPolicy
    from stello_graph.config import StelloConfig
    from stello_graph.digest import SessionDigest
    from stello_graph.errors import (
        ConsolidationError,
        DamagedDataError,
        DuplicateLabelError,
        DuplicateSessionError,
        ForeignDatabaseError,
        FunctionCallError,
        FunctionNotConfiguredError,
        IntegrationError,
        IntegrationSupersededError,
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
    from stello_graph.events import StelloEvent, StoredEvent, StoredEvents
    from stello_graph.export import export_tree
    from stello_graph.graph import StelloState, build_stello_graph
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
    from stello_graph.middleware import StelloMiddleware
    from stello_graph.models import (
        ChildL2,
        Compression,
        IntegrationResult,
        SendResult,
        SessionMeta,
        TopologyNode,
        TreeIntegration,
    )
    from stello_graph.nodes.state import StelloContext
    from stello_graph.profiles import ForkProfile, SplitGuard
    from stello_graph.schedule import BackgroundFailure, Schedule
    from stello_graph.session import Session
    from stello_graph.skills import Skill, load_skills
    from stello_graph.storage import MainStorage, SessionStorage
    from stello_graph.topology import Topology

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    # the session core (loads LangChain's messages)
    "TurnContext": "stello_graph._base",
    "AsyncSessionStream": "stello_graph._stream",
    "SessionStream": "stello_graph._stream",
    "TopologySlot": "stello_graph._topology_slot",
    "TopologyView": "stello_graph._topology_slot",
    "CompressionPolicy": "stello_graph.compression",
    "SessionDigest": "stello_graph.digest",
    "ConsolidationError": "stello_graph.errors",
    "DamagedDataError": "stello_graph.errors",
    "DuplicateLabelError": "stello_graph.errors",
    "DuplicateSessionError": "stello_graph.errors",
    "ForeignDatabaseError": "stello_graph.errors",
    "FunctionCallError": "stello_graph.errors",
    "FunctionNotConfiguredError": "stello_graph.errors",
    "IntegrationError": "stello_graph.errors",
    "InvalidInputError": "stello_graph.errors",
    "IntegrationSupersededError": "stello_graph.errors",
    "LeaseLostError": "stello_graph.errors",
    "MainSessionExistsError": "stello_graph.errors",
    "MainSessionForkError": "stello_graph.errors",
    "MainSessionNotFoundError": "stello_graph.errors",
    "ModelCallError": "stello_graph.errors",
    "ModelNotConfiguredError": "stello_graph.errors",
    "NodeHasChildrenError": "stello_graph.errors",
    "NodeNotFoundError": "stello_graph.errors",
    "NotADatabaseError": "stello_graph.errors",
    "NothingToIntegrateError": "stello_graph.errors",
    "SchemaVersionError": "stello_graph.errors",
    "SessionArchivedError": "stello_graph.errors",
    "SessionBusyError": "stello_graph.errors",
    "SessionError": "stello_graph.errors",
    "SessionNotFoundError": "stello_graph.errors",
    "SkillLoadError": "stello_graph.errors",
    "SplitGuardError": "stello_graph.errors",
    "StelloError": "stello_graph.errors",
    "StelloUsageError": "stello_graph.errors",
    "StorageError": "stello_graph.errors",
    "StorageUnavailableError": "stello_graph.errors",
    "StreamNotFinishedError": "stello_graph.errors",
    "TimeTravelError": "stello_graph.errors",
    "ToolRoundLimitError": "stello_graph.errors",
    "TopologyCycleError": "stello_graph.errors",
    "TopologyError": "stello_graph.errors",
    "TurnOutOfRangeError": "stello_graph.errors",
    "UnknownProfileError": "stello_graph.errors",
    "ForkPoint": "stello_graph.lineage",
    "MainSession": "stello_graph.main_session",
    "CompressFn": "stello_graph.memory",
    "ConsolidateFn": "stello_graph.memory",
    "IntegrateFn": "stello_graph.memory",
    "llm_compressor": "stello_graph.memory",
    "llm_consolidator": "stello_graph.memory",
    "llm_integrator": "stello_graph.memory",
    "ChildL2": "stello_graph.models",
    "Compression": "stello_graph.models",
    "IntegrationResult": "stello_graph.models",
    "SendResult": "stello_graph.models",
    "SessionMeta": "stello_graph.models",
    "TopologyNode": "stello_graph.models",
    "TreeIntegration": "stello_graph.models",
    "ForkProfile": "stello_graph.profiles",
    "SplitGuard": "stello_graph.profiles",
    "Session": "stello_graph.session",
    "MainStorage": "stello_graph.storage",
    "SessionStorage": "stello_graph.storage",
    "InMemoryMainStorage": "stello_graph.checkpoints",
    "SqliteMainStorage": "stello_graph.checkpoints",
    # orchestration (loads LangGraph)
    "StelloAgent": "stello_graph.agent",
    "TurnResult": "stello_graph.agent",
    "StelloMiddleware": "stello_graph.middleware",
    "StelloConfig": "stello_graph.config",
    "build_stello_graph": "stello_graph.graph",
    "StelloState": "stello_graph.graph",
    "StelloContext": "stello_graph.nodes.state",
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
"""Where each public name lives: `import stello_graph` loads none of them (the command line's
`--version` starts without LangChain); a name is imported on first use (PEP 562)."""

__all__ = [
    # orchestration
    "StelloAgent",
    "StelloConfig",
    "TurnResult",
    "StelloMiddleware",
    "build_stello_graph",
    "StelloState",
    "StelloContext",
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
    "IntegrationSupersededError",
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
    "DamagedDataError",
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
