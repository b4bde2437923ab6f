"""Figure 6: context economy. The same conversation (topics x turns) runs as a topology (one
branch per topic, consolidation every few turns with integration after it, both on the
`Schedule`), as one linear thread, and, at one prompt budget, as a topology with that budget
(`CompressionPolicy(budget=...)`) beside LangMem's `SummarizationNode` on one thread with the
same budget (`max_tokens`); every model call's prompt is measured.

Prompt size is the characters of the messages sent (texts plus tool-call arguments; tool
schemas are left out on every side); tokens are estimated at 4 characters each, so their
ratio is the same. Every summary (L2, synthesis, compression memo, LangMem's running summary)
is the same size on every side. "Off-topic" is the share of a turn prompt's user messages
that belong to another topic than the one the turn is about.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, MessagesState, StateGraph

with warnings.catch_warnings():
    # LangMem's dependency trustcall imports `Send` from its old place in LangGraph
    warnings.filterwarnings("ignore", message="Importing Send from langgraph.constants")
    from langmem.short_term import SummarizationNode
from stello_graph import CompressionPolicy, Schedule, StelloAgent
from stello_graph.memory import (
    DEFAULT_COMPRESS_PROMPT,
    DEFAULT_CONSOLIDATE_PROMPT,
    DEFAULT_INTEGRATE_PROMPT,
)
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale
from tests.benchmarks._workload import prompt_chars, text

__all__ = ["BUDGET", "context_figures"]

BUDGET = 2048
"""The prompt budget (tokens) of figures 6d-6f, on both sides."""
SUMMARY_CHARS = 600
"""Every summary's size: L2, compression memo, LangMem's running summary (~150 tokens)."""
_LANGMEM_ASKS = ("Create a summary of the conversation above", "This is summary of the")

KINDS = ("turn", "consolidate", "integrate", "compress", "summarize")


def _kind(messages: list[BaseMessage]) -> str:
    first = messages[0] if messages else None
    system = first.text if isinstance(first, SystemMessage) else ""
    if system.startswith(DEFAULT_CONSOLIDATE_PROMPT):
        return "consolidate"
    if system.startswith(DEFAULT_INTEGRATE_PROMPT):
        return "integrate"
    if system.startswith(DEFAULT_COMPRESS_PROMPT):
        return "compress"
    if messages and messages[-1].text.startswith(_LANGMEM_ASKS):
        return "summarize"
    return "turn"


def _respond(messages: list[BaseMessage]) -> str:
    kind, seed = _kind(messages), str(len(messages[-1].text))
    if kind in ("consolidate", "compress", "summarize"):
        return text(f"{kind}-{seed}", SUMMARY_CHARS)
    if kind == "integrate":
        ids = [part.split('"')[0] for part in messages[-1].text.split('session_id="')[1:]]
        insights = {sid: text(f"insight-{sid}", 200) for sid in ids}
        return json.dumps({"synthesis": text(f"synthesis-{seed}", 800), "insights": insights})
    return text(f"reply-{seed}")


@dataclass(frozen=True, slots=True)
class _Calls:
    chars: dict[str, list[int]]
    off_topic: float
    """Share of the turn prompts' user-message characters from another topic."""

    @classmethod
    def of(cls, model: ScriptedChatModel, topics: list[int], users: dict[str, int]) -> _Calls:
        chars: dict[str, list[int]] = {kind: [] for kind in KINDS}
        turns = 0
        own = other = 0
        for call in model.calls:
            kind = _kind(call.messages)
            chars[kind].append(prompt_chars(call.messages))
            if kind != "turn":
                continue
            topic = topics[turns]
            turns += 1
            for message in call.messages:
                found = users.get(message.text) if isinstance(message, HumanMessage) else None
                if found is not None:
                    own, other = (
                        (own + len(message.text), other)
                        if found == topic
                        else (own, other + len(message.text))
                    )
        return cls(chars, other / (own + other) if own + other else 0.0)

    def mean(self, *kinds: str) -> float:
        values = [c for kind in kinds or KINDS for c in self.chars[kind]]
        return sum(values) / len(values)

    def total(self) -> int:
        return sum(sum(v) for v in self.chars.values())

    def count(self, kind: str) -> int:
        return len(self.chars[kind])


def _conversation(scale: Scale) -> list[tuple[int, str]]:
    """(topic, user message) in the order the user sends them: blocks of a few turns per topic."""
    every, out = scale.consolidate_every, []
    for block in range(scale.topic_turns // every):
        for topic in range(scale.topics):
            for k in range(every):
                out.append((topic, text(f"topic{topic}-user-{block * every + k}")))
    return out


def _calls(model: ScriptedChatModel, scale: Scale) -> _Calls:
    conversation = _conversation(scale)
    users = {user: topic for topic, user in conversation}
    return _Calls.of(model, [topic for topic, _ in conversation], users)


def _topology(scale: Scale, path: Path, compression: CompressionPolicy | None = None) -> _Calls:
    model = ScriptedChatModel(respond=_respond)
    schedule = Schedule(
        consolidate_every_n_turns=scale.consolidate_every, integrate_after_consolidate=True
    )
    with StelloAgent(
        model=model, storage=path, schedule=schedule, compression=compression
    ) as agent:
        branches = [agent.fork(agent.main_session_id, f"Topic {t}").id for t in range(scale.topics)]
        for topic, user in _conversation(scale):
            agent.turn(branches[topic], user)
            agent.drain()  # deterministic: background work finishes before the next turn
        assert not agent.failures()
        l3 = sum(len(agent.session(b).messages()) for b in branches)
    assert l3 == 2 * len(_conversation(scale)), "L3 keeps every record"
    return _calls(model, scale)


def _linear(scale: Scale, path: Path) -> _Calls:
    model = ScriptedChatModel(respond=_respond)
    with StelloAgent(model=model, storage=path) as agent:
        thread = agent.fork(agent.main_session_id, "Everything").id
        for _, user in _conversation(scale):
            agent.turn(thread, user)
    return _calls(model, scale)


class _LangMemState(MessagesState):
    context: dict[str, Any]
    summarized_messages: list[BaseMessage]


def _langmem(scale: Scale, budget: int) -> _Calls:
    """LangMem's documented set-up: `SummarizationNode` before the model node, one thread."""
    model = ScriptedChatModel(respond=_respond)
    summarize = SummarizationNode(
        model=model, max_tokens=budget, max_summary_tokens=SUMMARY_CHARS // 4 + 16
    )

    def call_model(state: _LangMemState) -> dict[str, list[BaseMessage]]:
        reply: AIMessage = model.invoke(state["summarized_messages"])
        return {"messages": [reply]}

    graph = StateGraph(_LangMemState)
    graph.add_node("summarize", summarize)
    graph.add_node("call_model", call_model)
    graph.add_edge(START, "summarize")
    graph.add_edge("summarize", "call_model")
    running = ("langmem.short_term.summarization", "RunningSummary")  # its state, as LangMem says
    serde = JsonPlusSerializer(allowed_msgpack_modules=[running])
    app: Any = graph.compile(checkpointer=InMemorySaver(serde=serde))
    config: Any = {"configurable": {"thread_id": "langmem"}}
    for _, user in _conversation(scale):
        app.invoke({"messages": [HumanMessage(user)]}, config)
    return _calls(model, scale)


def context_figures(scale: Scale) -> list[Figure]:
    """Figures 6a-6f."""
    budget = CompressionPolicy(budget=BUDGET)
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        topo = _topology(scale, Path(tmp) / "topology.db")
        linear = _linear(scale, Path(tmp) / "linear.db")
        bounded = _topology(scale, Path(tmp) / "budget.db", budget)
    langmem = _langmem(scale, BUDGET)
    shape = f"{scale.topics} topics x {scale.topic_turns} turns"
    calls = {
        "turn_calls": topo.count("turn"),
        "consolidate_calls": topo.count("consolidate"),
        "integrate_calls": topo.count("integrate"),
        "linear_calls": linear.count("turn"),
    }
    every = topo.mean("turn", "consolidate", "integrate")
    at = f"{BUDGET:,}-token budget"
    return [
        Figure(
            key="6a",
            name=f"mean prompt per turn call, {shape}",
            value=topo.mean("turn") / linear.mean("turn"),
            unit="x linear",
            target=0.35,
            stello=topo.mean("turn"),
            baseline=linear.mean("turn"),
            side_unit="chars",
            detail={**calls, "mean_tokens_est": round(topo.mean("turn") / 4)},
        ),
        Figure(
            key="6b",
            name="mean prompt per model call, consolidation + integration included",
            value=every / linear.mean("turn"),
            unit="x linear",
            target=0.35,
            stello=every,
            baseline=linear.mean("turn"),
            side_unit="chars",
            detail={
                "consolidate_mean_chars": topo.mean("consolidate"),
                "integrate_mean_chars": topo.mean("integrate"),
            },
        ),
        Figure(
            key="6c",
            name="all prompt characters of the conversation",
            value=topo.total() / linear.total(),
            unit="x linear",
            stello=topo.total() / 1000,
            baseline=linear.total() / 1000,
            side_unit="k chars",
        ),
        Figure(
            key="6d",
            name=f"mean prompt per turn call, {at}, vs LangMem SummarizationNode",
            value=bounded.mean("turn") / langmem.mean("turn"),
            unit="x LangMem",
            target=1.0,
            stello=bounded.mean("turn"),
            baseline=langmem.mean("turn"),
            side_unit="chars",
            detail={
                "stello_max_turn_chars": max(bounded.chars["turn"]),
                "langmem_max_turn_chars": max(langmem.chars["turn"]),
                "compress_calls": bounded.count("compress"),
                "langmem_summarize_calls": langmem.count("summarize"),
                "stello_off_topic": round(bounded.off_topic, 4),
                "langmem_off_topic": round(langmem.off_topic, 4),
            },
        ),
        Figure(
            key="6e",
            name=f"mean prompt per model call, {at}, every call on both sides",
            value=bounded.mean() / langmem.mean(),
            unit="x LangMem",
            target=1.0,
            stello=bounded.mean(),
            baseline=langmem.mean(),
            side_unit="chars",
            detail={
                "stello_calls": {k: bounded.count(k) for k in KINDS if bounded.count(k)},
                "langmem_calls": {k: langmem.count(k) for k in KINDS if langmem.count(k)},
                "stello_mean_chars": {k: round(bounded.mean(k)) for k in KINDS if bounded.count(k)},
                "langmem_mean_chars": {
                    k: round(langmem.mean(k)) for k in KINDS if langmem.count(k)
                },
            },
        ),
        Figure(
            key="6f",
            name=f"off-topic share of turn prompts' user messages, {at}",
            value=bounded.off_topic,
            unit="share",
            target=0.0,
            stello=bounded.off_topic * 100,
            baseline=langmem.off_topic * 100,
            side_unit="%",
        ),
    ]
