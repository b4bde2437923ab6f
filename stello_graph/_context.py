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
    "SanitizedHistory",
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
    # Runs over the whole history at every model call: the loop is kept tight, and the usual
    # group (one call, its one result) skips building the id sets.
    out: list[BaseMessage] = []
    append = out.append
    i, n = 0, len(records)
    while i < n:
        msg = records[i]
        i += 1
        if isinstance(msg, AIMessage):
            calls = msg.tool_calls
            if msg.invalid_tool_calls:  # unparsable calls are sent back too: they need results
                calls = [*calls, *msg.invalid_tool_calls]  # type: ignore[list-item]
            if not calls:
                append(msg)
                continue
            j = i
            while j < n and isinstance(records[j], ToolMessage):
                j += 1
            results = records[i:j]
            if len(calls) == 1 and len(results) == 1:
                call_id = calls[0].get("id")
                if call_id is not None and results[0].tool_call_id == call_id:  # type: ignore[attr-defined]
                    append(msg)
                    append(results[0])
            else:
                wanted = {call.get("id") for call in calls}
                answered = {t.tool_call_id for t in results if isinstance(t, ToolMessage)}
                if None not in wanted and wanted <= answered:
                    append(msg)
                    out.extend(t for t in results if t.tool_call_id in wanted)  # type: ignore[attr-defined]
            i = j
        elif not isinstance(msg, ToolMessage):
            append(msg)
    return out


class SanitizedHistory:
    """`sanitize_history` of one session's history, reusing its previous result.

    A session's history only grows between turns (and is the same for every model call of
    one turn), so the result for the records seen last time is kept and only what was
    appended since is sanitised. The previous result is reused when the new records start
    with the same records (same first and last message ids, which L3 keeps unique) and the
    first appended record is not a tool result (which could complete a group the previous
    result dropped); anything else (a trim, a compression cut, records without ids) is
    sanitised from scratch. Safe to share between threads: the kept state is replaced whole.
    """

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: tuple[str, str, int, tuple[BaseMessage, ...]] | None = None

    def __call__(self, records: Sequence[BaseMessage]) -> tuple[BaseMessage, ...]:
        n = len(records)
        if n == 0:
            return ()
        first, last = records[0].id, records[-1].id
        if first is None or last is None:
            return tuple(sanitize_history(records))
        kept = self._kept
        done = kept[2] if kept is not None else 0
        # the records seen last time (same first and last), then none or a non-tool record
        if (
            kept is not None
            and done <= n
            and (first, records[done - 1].id) == kept[:2]
            and (done == n or not isinstance(records[done], ToolMessage))
        ):
            clean = kept[3]
            if done == n:
                return clean
            result = clean + tuple(sanitize_history(records[done:]))
        else:
            result = tuple(sanitize_history(records))
        self._kept = (first, last, n, result)
        return result


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
