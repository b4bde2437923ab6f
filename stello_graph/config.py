"""`StelloConfig`: every setting of a stello graph or agent, defined and documented once.

`StelloAgent` and `build_stello_graph` take one (`config=`), and each of its fields as a
keyword argument too (the keywords override the config's fields). A config is frozen:
what changes at run time (cached sessions, per-session overrides, the event bus, the
scheduler) lives in the `StelloRuntime` the graph's nodes share, never here.

Example:
    >>> from stello_graph import StelloConfig
    >>> from stello_graph.testing import ScriptedChatModel
    >>> config = StelloConfig(model=ScriptedChatModel(default="Hi"), max_tool_rounds=3)
    >>> config.replace(max_tool_rounds=5).max_tool_rounds
    5
    >>> StelloConfig(max_tool_rounds=-1)
    Traceback (most recent call last):
    ...
    stello_graph.errors.InvalidInputError: max_tool_rounds must be an int >= 0, got -1.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore
from langgraph.types import Durability, RetryPolicy
from typing_extensions import TypedDict

from stello_graph._topology_slot import TopologySlot, check_topology_slot
from stello_graph._validate import (
    check_chat_model,
    check_model_timeout,
    check_tools,
    check_tree_id,
)
from stello_graph.compression import CompressionPolicy
from stello_graph.errors import InvalidInputError
from stello_graph.lease import DEFAULT_LEASE_TTL
from stello_graph.memory import ConsolidateFn, IntegrateFn
from stello_graph.profiles import ForkProfile, SplitGuard
from stello_graph.schedule import Schedule
from stello_graph.skills import Skill, load_skills

if TYPE_CHECKING:
    from typing import Self

__all__ = ["BUILTIN_TOOLS", "StelloConfig", "StelloSettings", "check_retry_policy"]

BUILTIN_TOOLS = ("create_session", "activate_skill")
"""Built-in tools: `create_session` (forks), `activate_skill` (offered whenever skills exist)."""


def check_retry_policy(value: object) -> RetryPolicy | None:
    """`None`, or a LangGraph `RetryPolicy` (`model_retry`)."""
    if value is None or isinstance(value, RetryPolicy):
        return value
    raise InvalidInputError(
        f"model_retry must be a langgraph.types.RetryPolicy, got {type(value).__name__}."
    )


def _by_name(items: Sequence[Any] | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if items is None:
        return {}
    values = list(items.values()) if isinstance(items, Mapping) else list(items)
    found: dict[str, Any] = {}
    for item in values:
        name = getattr(item, "name", None)
        if not isinstance(name, str) or name in found:
            raise InvalidInputError(f"Each {what} needs a unique name; got {item!r:.80}.")
        found[name] = item
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class StelloConfig:
    """The settings of a stello graph (`build_stello_graph`) or agent (`StelloAgent`).

    Every field is checked when the config is made; a bad value raises `InvalidInputError`
    naming it. The last group of fields only means something to `StelloAgent`, which
    compiles the graph and opens the storage itself.
    """

    model: BaseChatModel | str | None = None
    """The default chat model of every session: any LangChain chat model, or its name as
    `init_chat_model` takes it (`"openai:gpt-4o-mini"`, `"anthropic:claude-sonnet-4-5"`),
    built when the config is made (reading it back gives the model). An unknown provider is
    an `InvalidInputError`; a provider whose integration package is not installed
    (`pip install langchain-anthropic`) or whose client cannot be built (no API key) a
    `ModelNotConfiguredError`."""
    tools: Sequence[Any] = ()
    """Tools every session's model is given (LangChain tools or functions, sync or async:
    an async-only tool, such as an MCP tool, runs on sync turns too, on a private event
    loop in a worker thread)."""
    builtin_tools: Sequence[str] = ("create_session",)
    """Built-in tools to add (`"create_session"`; `"activate_skill"` is added whenever
    skills are registered); `()` for none."""
    max_tool_rounds: int = 8
    """Tool rounds one turn may take; one more fails with `ToolRoundLimitError` and stores
    nothing."""
    consolidate_fn: ConsolidateFn | None = None
    """The consolidate function of `consolidate` and the schedule (default, when there is a
    model: `llm_consolidator(model)`)."""
    integrate_fn: IntegrateFn | None = None
    """The integrate function of `integrate` and the schedule (default, when there is a
    model: `llm_integrator(model)`)."""
    schedule: Schedule | None = None
    """Background consolidation / integration after turns (`None`: none)."""
    store: BaseStore | None = None
    """A LangGraph store L2, synthesis and insights are also published to, under
    `("stello", tree_id, "l2" | "synthesis" | "subtree" | "insights")` (with `.` and `%` of
    the tree id percent-escaped: store labels cannot hold a `.`)."""
    profiles: Sequence[ForkProfile] | Mapping[str, ForkProfile] | None = ()
    """Fork profiles the caller (`fork(profile=...)`) and the model
    (`create_session(profile=...)`) can name."""
    skills: Sequence[Skill] | Mapping[str, Skill] | str | os.PathLike[str] | None = ()
    """Skills (or a folder of `SKILL.md` files) the models can activate through
    `activate_skill`, within each session's allow-list."""
    split_guard: SplitGuard | None = None
    """Limits on the forks the model makes itself."""
    compression: CompressionPolicy | None = None
    """Automatic context compression of every session's prompt (off when `None`);
    `CompressionPolicy(budget=...)` caps every prompt at a number of tokens."""
    model_timeout: float | None = None
    """Seconds each model call of a turn may take; a call that takes longer fails the turn
    with `ModelCallError` (or is retried, see `model_retry`). `None`: no limit."""
    model_retry: RetryPolicy | None = None
    """A LangGraph `RetryPolicy` for a turn's failed model calls; its `retry_on` judges the
    provider's exception. Timed-out calls are retried."""
    unique_labels: bool = False
    """Refuse a fork (yours or the model's `create_session`) whose label another child of
    its source already has, with `DuplicateLabelError` (labels compared without case and
    surrounding spaces); the model is told and can continue the existing branch."""
    topology_slot: TopologySlot | bool | None = None
    """Show each child session where it stands in the tree, in its system message after the
    identity line (`TopologySlot`: its size limit and hook). `True`: the default slot.
    Off by default."""
    lease_ttl: float = DEFAULT_LEASE_TTL
    """Seconds a turn's session lease lasts without renewal. Turns on one session run one
    at a time through it, from threads, graphs, agents and processes alike (see
    `stello_graph.lease`); a holder that died is taken over after this (at once when it was
    a process of this machine)."""

    # -- StelloAgent only -------------------------------------------------------------------
    checkpointer: BaseCheckpointSaver[Any] | Literal[False] | None = None
    """Where the agent keeps in-flight turns. Default: a saver on the same SQLite file (in
    memory for in-memory storage). `False`: none (no interrupts)."""
    system_prompt: str | None = None
    """The main session's system prompt, when the agent creates it."""
    main_label: str = "Main Session"
    """The main session's label, when the agent creates it."""
    tree_id: str = "default"
    """Which tree of the storage file, when the agent's `storage` is a path: a non-empty
    line of at most 256 characters, no control characters."""
    durability: Durability | None = None
    """LangGraph checkpoint durability of the agent's turns. Default: `"async"`, or `"exit"`
    on a checkpointer of your own that is not pruned, where a finished turn then keeps one
    checkpoint (its last) instead of one per step and the steps' writes. On a pruned
    checkpointer, unless `"sync"`, a turn's first model round runs without it (a reply
    without tool calls is committed and never checkpointed): a crash in that round keeps
    nothing of the turn (send it again); once the reply asks for tools, the turn is written
    and, with `"async"`, keeps every completed tool round. `"exit"` writes a turn when it
    ends or waits on an interrupt; `"sync"` writes every step before the next one starts
    (BENCHMARKS.md, "What a crash keeps")."""
    prune_checkpoints: bool | None = None
    """Drop a turn's checkpoints once it is committed (default: when the agent made the
    checkpointer itself)."""

    def __post_init__(self) -> None:
        if self.model is not None:
            _set(self, "model", check_chat_model(self.model))
        rounds = self.max_tool_rounds
        if not isinstance(rounds, int) or rounds < 0:
            raise InvalidInputError(f"max_tool_rounds must be an int >= 0, got {rounds!r}.")
        _set(self, "tools", tuple(check_tools(self.tools)))
        _set(self, "model_timeout", check_model_timeout(self.model_timeout))
        check_tree_id(self.tree_id)
        if not isinstance(self.unique_labels, bool):
            raise InvalidInputError(f"unique_labels must be a bool, got {self.unique_labels!r}.")
        _set(self, "topology_slot", check_topology_slot(self.topology_slot))
        check_retry_policy(self.model_retry)
        if isinstance(self.builtin_tools, str):
            raise InvalidInputError(
                f"builtin_tools must be a list of names, got {self.builtin_tools!r}."
            )
        unknown = [name for name in self.builtin_tools if name not in BUILTIN_TOOLS]
        if unknown:
            raise InvalidInputError(
                f"Unknown built-in tool(s) {unknown!r}; available: {list(BUILTIN_TOOLS)}."
            )
        _set(self, "builtin_tools", tuple(self.builtin_tools))
        _by_name(self.profiles, "profile")
        if isinstance(self.skills, str | os.PathLike):
            _set(self, "skills", tuple(load_skills(self.skills)))
        _by_name(self.skills, "skill")  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` applied (checked like a new config)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def merge(cls, config: StelloConfig | None, settings: Mapping[str, Any]) -> StelloConfig:
        """`config` (or the defaults) with the keyword `settings` applied on top."""
        if config is not None and not isinstance(config, StelloConfig):
            raise InvalidInputError(f"config must be a StelloConfig, got {type(config).__name__}.")
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) {unknown}; see StelloConfig.")
        if config is None:
            return cls(**settings)
        return config.replace(**settings) if settings else config

    def profile_map(self) -> dict[str, ForkProfile]:
        """The profiles, by name."""
        return _by_name(self.profiles, "profile")

    def skill_map(self) -> dict[str, Skill]:
        """The skills, by name."""
        return _by_name(self.skills, "skill")  # type: ignore[arg-type]


def _set(config: StelloConfig, name: str, value: object) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen config while it is made


class StelloSettings(TypedDict, total=False):
    """The fields of `StelloConfig`, as keyword arguments (`**settings: Unpack[...]`).

    Documented on `StelloConfig`; a test holds the two to the same names and types.
    """

    model: BaseChatModel | str | None
    tools: Sequence[Any]
    builtin_tools: Sequence[str]
    max_tool_rounds: int
    consolidate_fn: ConsolidateFn | None
    integrate_fn: IntegrateFn | None
    schedule: Schedule | None
    store: BaseStore | None
    profiles: Sequence[ForkProfile] | Mapping[str, ForkProfile] | None
    skills: Sequence[Skill] | Mapping[str, Skill] | str | os.PathLike[str] | None
    split_guard: SplitGuard | None
    compression: CompressionPolicy | None
    model_timeout: float | None
    model_retry: RetryPolicy | None
    unique_labels: bool
    topology_slot: TopologySlot | bool | None
    lease_ttl: float
    checkpointer: BaseCheckpointSaver[Any] | Literal[False] | None
    system_prompt: str | None
    main_label: str
    tree_id: str
    durability: Durability | None
    prune_checkpoints: bool | None
