"""The inspector's writes (`--write`): each validates its JSON body, then goes through a
`StelloAgent` (fork, consolidate, integrate, archive, system prompt) or the storage's own
insight methods, so the library's rules hold whoever clicks."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stello_graph.errors import InvalidInputError

if TYPE_CHECKING:
    from stello_graph.agent import StelloAgent

__all__ = ["WRITES"]


def _text(body: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        kind = "a non-empty string or null" if optional else "a non-empty string"
        raise InvalidInputError(f"{key!r} must be {kind}, got {value!r}.")
    return value


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise InvalidInputError(
            f"Unknown field(s) {', '.join(map(repr, extra))}; expected some of {sorted(allowed)}."
        )


def fork(agent: StelloAgent, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, {"label", "context", "at_turn", "system_prompt"})
    label = _text(body, "label")
    assert label is not None
    context: Any = body.get("context", "none")
    at_turn = body.get("at_turn")
    if at_turn is not None:
        if isinstance(at_turn, bool) or not isinstance(at_turn, int) or at_turn < 1:
            raise InvalidInputError(f"'at_turn' must be an int >= 1, got {at_turn!r}.")
        context = "inherit"
    elif context not in ("none", "inherit"):
        raise InvalidInputError(f"'context' must be 'none' or 'inherit', got {context!r}.")
    options: dict[str, Any] = {"context": context}
    if at_turn is not None:
        options["at_turn"] = at_turn
    prompt = _text(body, "system_prompt", optional=True)
    if prompt is not None:
        options["system_prompt"] = prompt
    node = agent.fork(session_id, label, **options)
    return {"node": node.model_dump(mode="json")}


def consolidate(agent: StelloAgent, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, set())
    return {"l2": agent.consolidate(session_id)}


def archive(agent: StelloAgent, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, set())
    return {"meta": agent.archive(session_id).model_dump(mode="json")}


def insight(agent: StelloAgent, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, {"insight"})
    text = _text(body, "insight", optional=True)
    session = agent.session(session_id)  # refuses an unknown id
    if session.meta.role == "main":
        raise InvalidInputError("The main session has no insight; it has a synthesis.")
    if text is None:
        agent.storage.clear_insight(session_id)
    else:
        agent.storage.put_insight(session_id, text)
    return {"insight": text}


def system_prompt(agent: StelloAgent, session_id: str, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, {"system_prompt"})
    text = _text(body, "system_prompt", optional=True)
    agent.session(session_id).set_system_prompt(text)
    return {"system_prompt": text}


def integrate(agent: StelloAgent, body: dict[str, Any]) -> dict[str, Any]:
    _only(body, {"mode"})
    mode = body.get("mode", "flat")
    if mode == "flat":
        flat = agent.integrate("flat")
        return {"mode": mode, "synthesis": flat.synthesis, "insights": sorted(flat.insights)}
    if mode == "tree":
        tree = agent.integrate("tree")
        return {"mode": mode, "synthesis": tree.synthesis, "calls": tree.calls}
    raise InvalidInputError(f"'mode' must be 'flat' or 'tree', got {mode!r}.")


WRITES: dict[str, Callable[[StelloAgent, str, dict[str, Any]], dict[str, Any]]] = {
    "fork": fork,
    "consolidate": consolidate,
    "archive": archive,
    "insight": insight,
    "system_prompt": system_prompt,
}
"""The per-session writes, by the last segment of their path."""
