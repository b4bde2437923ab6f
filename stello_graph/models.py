"""The data the session core and the storage exchange.

`SessionMeta` and `TopologyNode` are kept apart on purpose: a session does not know where it
sits in the tree, and the tree can be drawn without loading any session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.messages.ai import UsageMetadata
    from langchain_core.messages.tool import ToolCall

__all__ = [
    "ChildL2",
    "Compression",
    "IntegrationResult",
    "Lease",
    "SendResult",
    "SessionMeta",
    "SessionRole",
    "SessionSnapshot",
    "SessionStats",
    "SessionStatus",
    "TopologyNode",
    "TreeIntegration",
    "utcnow",
]

SessionRole = Literal["standard", "main"]
SessionStatus = Literal["active", "archived"]


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (the only kind of time stored)."""
    return datetime.now(UTC)


class SessionMeta(BaseModel):
    """What is known about a session, apart from its records and memory.

    A session has no parent id and no depth: where it sits in the tree is kept by
    `TopologyNode`, in the `MainStorage`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    """Unique id of the session (unique within one tree)."""
    label: str
    """Human-readable name; also the session's identity line in its prompt when non-empty."""
    role: SessionRole = "standard"
    """`"main"` for the root of a tree, `"standard"` for every other session."""
    status: SessionStatus = "active"
    """`"archived"` sessions refuse new turns, forks, consolidations and updates."""
    tags: tuple[str, ...] = ()
    """Organising tags."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON-serialisable data of the application."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    """When the session last changed: its meta, or records appended to its L3."""
    damaged: tuple[str, ...] = Field(default=(), exclude=True, repr=False)
    """The stored columns that could not be decoded, when this meta is a whole-tree read's
    placeholder for a damaged row (see `DamagedDataError`): each shows a stand-in (the label
    `"(undecodable)"`, no tags, ...). Empty for every sound row; never stored."""


class TopologyNode(BaseModel):
    """One node of the topology tree; `id` is the id of the session it stands for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    parent_id: str | None = None
    """`None` marks the root (the main session)."""
    label: str = ""
    """A copy of the session's label, so the tree can be drawn without loading sessions."""
    damaged: tuple[str, ...] = Field(default=(), exclude=True, repr=False)
    """The stored columns that could not be decoded (the label of a damaged row), or
    `"parent_id"` for a node whose parents make a cycle: a whole-tree read shows such a
    node as a root (`parent_id=None`) after the tree. Empty for every sound node."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A turn's hold on its session, as stored with the session (see `stello_graph.lease`).

    Attributes:
        session_id: the session held.
        owner: who holds it (a process and a run, `host/pid/nonce`).
        token: the fencing token: it grows each time another owner takes the session, so a
            holder that lost its lease can tell (its token is no longer the stored one).
        expires_at: when the lease lapses unless renewed (seconds since the epoch).
    """

    session_id: str
    owner: str
    token: int
    expires_at: float


class ChildL2(BaseModel):
    """One child's outward summary, as given to an `IntegrateFn`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    label: str
    l2: str


class IntegrationResult(BaseModel):
    """What an `IntegrateFn` returns: the new synthesis and insights addressed by session id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    synthesis: str
    insights: dict[str, str] = Field(default_factory=dict)
    """Session id -> insight text. Insights for ids that were not among the inputs are dropped."""


class TreeIntegration(BaseModel):
    """The outcome of a tree-mode integration: one `IntegrationResult` per internal node.

    `results[node_id]` holds what that node made of its direct children (its subtree
    synthesis; the main session's synthesis for the root) and the insights it pushed to them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    root_id: str
    results: dict[str, IntegrationResult] = Field(default_factory=dict)
    levels: int = 0
    """How many levels of the tree had something to integrate."""

    @property
    def calls(self) -> int:
        """How many integrate calls ran (one per internal node whose children have L2)."""
        return len(self.results)

    @property
    def synthesis(self) -> str | None:
        """The root's new synthesis, if the root had anything to integrate."""
        root = self.results.get(self.root_id)
        return root.synthesis if root is not None else None

    @property
    def insights(self) -> dict[str, str]:
        """Every insight pushed, at every level, by session id."""
        return {
            sid: text for result in self.results.values() for sid, text in result.insights.items()
        }


class Compression(BaseModel):
    """A summary that stands for a session's oldest records in its prompts.

    `through` is how many records, from the first, the summary covers; the prompt shows the
    summary, then the records from `through` on. Kept in storage so a reloaded session does
    not summarise again.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: str
    through: int = Field(ge=0)


@dataclass(frozen=True, slots=True)
class SessionStats:
    """What a view of a large tree shows of one session, read for every session at once
    (`list_session_stats`): one query instead of several per session, and no full
    `SessionMeta` to build.

    Attributes:
        id / label / role / status / updated_at: from the session's meta.
        parent_id: its topology node's parent (`None` for the root).
        in_tree: whether the session has a topology node.
        turns: its user turns (`get_turn_count`).
        records: its L3 records (`count_records`).
        memory_through: how many records its L2 (or synthesis) covers.
        turns_since_memory: user turns among the records after `memory_through`: how stale
            the L2 is (every turn, when there is no L2).
        has_memory / has_insight / has_subtree_synthesis: whether each is stored.
        damaged: the columns of a damaged row (see `DamagedDataError`); empty when sound.
    """

    id: str
    label: str
    role: SessionRole
    status: SessionStatus
    updated_at: datetime
    parent_id: str | None
    in_tree: bool
    turns: int
    records: int
    memory_through: int
    turns_since_memory: int
    has_memory: bool
    has_insight: bool
    has_subtree_synthesis: bool
    damaged: tuple[str, ...] = ()
    """The columns of the session's row that could not be decoded (stand-ins are shown)."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """The reply of one model call made by `Session.send` (or a stream, once it is done)."""

    content: str
    """The text of the reply (text blocks joined when the provider returns a list)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Tool calls the model asked for; the caller decides whether to run them."""
    usage: UsageMetadata | None = None
    """Token usage reported by the provider, when it reports any."""
    message: AIMessage | None = None
    """The full reply as stored in L3."""


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """Everything a turn reads of its session, read at once (`SessionStorage.read_session`).

    Attributes:
        meta: the session's meta.
        settings: its orchestration settings (empty when none).
        system_prompt: its own system prompt.
        insight: the pending insight.
        memory: the L2 (the synthesis, for the main session).
        subtree_synthesis: what tree integration last made of the node's children.
        compression: the summary that replaces the oldest records in prompts.
        turn_count: user turns committed.
        records: every L3 record in order, shared as `shared_records` returns them (never
            change them); empty when the read did not ask for them.
    """

    meta: SessionMeta
    settings: Mapping[str, Any]
    system_prompt: str | None
    insight: str | None
    memory: str | None
    subtree_synthesis: str | None
    compression: Compression | None
    turn_count: int
    records: Sequence[BaseMessage]
