"""`--model scripted` for `chat`: a model that echoes, and memory made without a model.

Everything stays deterministic and offline, so the whole chat (turns, forks, consolidation,
integration, insights) can be tried, and tested, with no provider.
"""

from __future__ import annotations

from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph.cli._common import clip
from stello_graph.models import ChildL2, IntegrationResult
from stello_graph.testing import ScriptedChatModel

__all__ = ["echo_model", "integrate", "summarise"]

_L2_CHARS = 400


def _echo(messages: list[BaseMessage]) -> str:
    said = clip(messages[-1].text, 200)
    system = " ".join(m.text for m in messages if isinstance(m, SystemMessage))
    if "<insight>" in system:
        return f"(scripted) Noted, with the main session's insight in mind: {said}"
    return f"(scripted) You said: {said}"


def echo_model() -> ScriptedChatModel:
    """The offline chat model: answers every message by quoting it."""
    return ScriptedChatModel(respond=_echo, name="scripted-echo")


def summarise(current: str | None, records: list[BaseMessage]) -> str:
    """A `ConsolidateFn`: the L2 lists what the user brought up (the newest part kept)."""
    said = [clip(m.text, 60) for m in records if m.type == "human" and m.text.strip()]
    if not said:
        return current or "Nothing discussed yet."
    summary = f"{current} " if current else ""
    summary += "Discussed: " + "; ".join(said) + "."
    return summary if len(summary) <= _L2_CHARS else "…" + summary[-(_L2_CHARS - 1) :]


def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
    """An `IntegrateFn`: the synthesis lines up every branch's L2; each branch is told which
    other branches exist."""
    labels = [child.label for child in children]
    insights = {
        child.session_id: "Related branches: "
        + ", ".join(other for other in labels if other != child.label)
        for child in children
        if len(set(labels)) > 1
    }
    synthesis = " | ".join(f"{child.label}: {child.l2}" for child in children)
    return IntegrationResult(synthesis=synthesis, insights=insights)
