"""Context assembly: what a session's model call sees, in the fixed order of the design.

Child session: system prompt -> identity line -> insight -> compression summary -> L3 -> turn.
Main session:  system prompt -> synthesis -> compression summary -> L3 -> turn.

The system parts are joined into ONE leading `SystemMessage` (sections in that order), because
several providers and chat templates refuse system messages anywhere but first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

__all__ = [
    "identity_line",
    "message_text",
    "sanitize_history",
    "system_message",
]


def identity_line(label: str) -> str | None:
    """The line that tells a child session which branch it is; `None` for an empty label."""
    if not label.strip():
        return None
    return f'<session_identity>\nYou are in the branch session "{label}".\n</session_identity>'


def insight_block(insight: str) -> str:
    return f"<insight>\nGuidance for this branch from the session above it:\n{insight}\n</insight>"


def synthesis_block(synthesis: str) -> str:
    return f"<synthesis>\nWhat is known across all branches so far:\n{synthesis}\n</synthesis>"


def branch_block(synthesis: str) -> str:
    return (
        "<branch_synthesis>\nWhat the sessions branching from this one have found:\n"
        f"{synthesis}\n</branch_synthesis>"
    )


def summary_block(summary: str) -> str:
    return f"<earlier_conversation_summary>\n{summary}\n</earlier_conversation_summary>"


def system_message(parts: Iterable[str | None]) -> SystemMessage | None:
    """Join the non-empty system parts into one `SystemMessage` (or `None` if all are empty)."""
    text = "\n\n".join(p for p in parts if p)
    return SystemMessage(content=text) if text else None


def sanitize_history(records: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Drop incomplete tool-call groups and orphan tool results.

    An assistant message with tool calls (parsed or not) is kept only together with *all* of
    its tool results, which must follow it directly; tool results that answer no preceding
    call are dropped. The result is a history every provider accepts.
    """
    out: list[BaseMessage] = []
    i, n = 0, len(records)
    while i < n:
        msg = records[i]
        if isinstance(msg, AIMessage) and (msg.tool_calls or msg.invalid_tool_calls):
            j = i + 1
            while j < n and isinstance(records[j], ToolMessage):
                j += 1
            # Providers send unparsable calls back as tool calls too: they need results.
            wanted = {call.get("id") for call in [*msg.tool_calls, *msg.invalid_tool_calls]}
            answered = {t.tool_call_id for t in records[i + 1 : j] if isinstance(t, ToolMessage)}
            if None not in wanted and wanted <= answered:
                out.append(msg)
                out.extend(t for t in records[i + 1 : j] if t.tool_call_id in wanted)  # type: ignore[attr-defined]
            i = j
            continue
        if not isinstance(msg, ToolMessage):
            out.append(msg)
        i += 1
    return out


def is_clean(records: Sequence[BaseMessage]) -> bool:
    """Whether `sanitize_history` would keep every record (no open tool-call group)."""
    return len(sanitize_history(records)) == len(records)


def message_text(content: str | list[str | dict[str, object]]) -> str:
    """The text of a message content: the string itself, or its text blocks joined."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def transcript(records: Sequence[BaseMessage]) -> str:
    """A plain-text transcript of records, for summarising models."""
    lines: list[str] = []
    for msg in records:
        text = message_text(msg.content)
        if isinstance(msg, AIMessage) and msg.tool_calls:
            calls = ", ".join(f"{c['name']}({c['args']})" for c in msg.tool_calls)
            text = f"{text}\n[called tools: {calls}]" if text else f"[called tools: {calls}]"
        role = {"human": "user", "ai": "assistant"}.get(msg.type, msg.type)
        if isinstance(msg, ToolMessage):
            role = f"tool {msg.name}" if msg.name else "tool"
        lines.append(f"{role}: {text}")
    return "\n".join(lines)
