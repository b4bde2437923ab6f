"""Figure 6: context economy. The same conversation (topics x turns) runs once as a topology
(one branch per topic, consolidation every few turns with integration after it, both on the
`Schedule`) and once as one linear thread; every model call's prompt is measured.

Prompt size is the characters of the messages sent (texts plus tool-call arguments; tool
schemas are left out on both sides); tokens are estimated at 4 characters each, so their
ratio is the same.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph import Schedule, StelloAgent
from stello_graph.memory import DEFAULT_CONSOLIDATE_PROMPT, DEFAULT_INTEGRATE_PROMPT
from stello_graph.testing import ScriptedChatModel
from tests.benchmarks._harness import Figure, Scale
from tests.benchmarks._workload import prompt_chars, text

__all__ = ["context_figures"]


def _kind(messages: list[BaseMessage]) -> str:
    first = messages[0] if messages else None
    system = first.text if isinstance(first, SystemMessage) else ""
    if system.startswith(DEFAULT_CONSOLIDATE_PROMPT):
        return "consolidate"
    if system.startswith(DEFAULT_INTEGRATE_PROMPT):
        return "integrate"
    return "turn"


def _respond(messages: list[BaseMessage]) -> str:
    kind, seed = _kind(messages), str(len(messages[-1].text))
    if kind == "consolidate":
        return text(f"l2-{seed}", 600)
    if kind == "integrate":
        ids = [part.split('"')[0] for part in messages[-1].text.split('session_id="')[1:]]
        insights = {sid: text(f"insight-{sid}", 200) for sid in ids}
        return json.dumps({"synthesis": text(f"synthesis-{seed}", 800), "insights": insights})
    return text(f"reply-{seed}")


@dataclass(frozen=True, slots=True)
class _Calls:
    chars: dict[str, list[int]]

    @classmethod
    def of(cls, model: ScriptedChatModel) -> _Calls:
        chars: dict[str, list[int]] = {"turn": [], "consolidate": [], "integrate": []}
        for call in model.calls:
            chars[_kind(call.messages)].append(prompt_chars(call.messages))
        return cls(chars)

    def mean(self, *kinds: str) -> float:
        values = [c for kind in kinds for c in self.chars[kind]]
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


def _topology(scale: Scale, path: Path) -> _Calls:
    model = ScriptedChatModel(respond=_respond)
    schedule = Schedule(
        consolidate_every_n_turns=scale.consolidate_every, integrate_after_consolidate=True
    )
    with StelloAgent(model=model, storage=path, schedule=schedule) as agent:
        branches = [agent.fork(agent.main_session_id, f"Topic {t}").id for t in range(scale.topics)]
        for topic, user in _conversation(scale):
            agent.turn(branches[topic], user)
            agent.drain()  # deterministic: background work finishes before the next turn
        assert not agent.failures()
    return _Calls.of(model)


def _linear(scale: Scale, path: Path) -> _Calls:
    model = ScriptedChatModel(respond=_respond)
    with StelloAgent(model=model, storage=path) as agent:
        thread = agent.fork(agent.main_session_id, "Everything").id
        for _, user in _conversation(scale):
            agent.turn(thread, user)
    return _Calls.of(model)


def context_figures(scale: Scale) -> list[Figure]:
    """Figures 6a-6c."""
    with tempfile.TemporaryDirectory(prefix="stello-bench-") as tmp:
        topo = _topology(scale, Path(tmp) / "topology.db")
        linear = _linear(scale, Path(tmp) / "linear.db")
    shape = f"{scale.topics} topics x {scale.topic_turns} turns"
    calls = {
        "turn_calls": topo.count("turn"),
        "consolidate_calls": topo.count("consolidate"),
        "integrate_calls": topo.count("integrate"),
        "linear_calls": linear.count("turn"),
    }
    every = topo.mean("turn", "consolidate", "integrate")
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
    ]
