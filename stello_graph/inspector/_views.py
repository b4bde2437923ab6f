"""What the inspector's JSON API returns, read from any `MainStorage` without changing it.

Each function here is a pure read: it takes the storage and returns JSON-serialisable data,
so the API is the same whatever serves it (the Starlette app, a test, a notebook).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from stello_graph._context import (
    branch_block,
    identity_line,
    insight_block,
    message_text,
    sanitize_history,
    summary_block,
    synthesis_block,
)
from stello_graph._flow import run
from stello_graph._topology_slot import TopologySlot
from stello_graph._tree_text import tree_order
from stello_graph.compression import CompressionPolicy, plan_cut
from stello_graph.errors import SessionNotFoundError
from stello_graph.models import SessionMeta, SessionStats
from stello_graph.schedule import StorageFailureLog
from stello_graph.storage import MainStorage

__all__ = [
    "CHARS_PER_TOKEN",
    "context_view",
    "records_page",
    "session_stats",
    "session_view",
    "tree_nodes",
    "tree_view",
]

CHARS_PER_TOKEN = 4
"""The size estimate of the context view: about 4 characters per token."""
MAX_PAGE = 1000
"""The largest `limit` of a records page."""


def session_stats(storage: MainStorage) -> list[SessionStats]:
    """Every session's figures, in one read."""
    return storage.list_session_stats()


def _turns_after(storage: MainStorage, session_id: str, through: int) -> int:
    """User turns among the records after the first `through` (the L2's staleness)."""
    return sum(r.type == "human" for r in storage.list_records(session_id, offset=through))


TREE_FIELDS = (
    *("id", "parent_id", "label", "role", "status", "depth", "turns", "records"),
    *("memory_through", "stale_turns", "has_l2", "has_insight", "has_subtree_synthesis"),
    *("failures", "updated_at", "damaged"),
)
"""The columns of each row of `GET /api/tree`, in order (`damaged`: the columns of a
damaged session's row shown with stand-ins, `parent_id` for a node whose parents make a
cycle, shown as a root after the tree; see `DamagedDataError`)."""


def _in_tree_order(stats: list[SessionStats]) -> list[tuple[SessionStats, int]]:
    """The sessions that have a node, in `get_tree` order (depth-first, siblings in creation
    order), each with its depth; a node whose parent is missing counts as a root, and so
    does one whose parents make a cycle (marked `damaged`, after the tree)."""
    detached: set[str] = set()
    ordered = tree_order([s for s in stats if s.in_tree], detached)
    depths: dict[str, int] = {}
    placed: list[tuple[SessionStats, int]] = []
    for s in ordered:
        if s.id in detached:
            s = replace(s, parent_id=None, damaged=(*s.damaged, "parent_id"))
        depth = 0 if s.parent_id is None else depths.get(s.parent_id, -1) + 1
        depths[s.id] = depth
        placed.append((s, depth))
    return placed


def tree_view(storage: MainStorage, *, compact: bool = False) -> dict[str, Any]:
    """`GET /api/tree`: every node with what the page draws and lists, parents first,
    siblings in creation order.

    Each node: `id`, `parent_id`, `label`, `role`, `status`, `depth`, `turns`, `records`,
    `memory_through`, `stale_turns` (user turns since the L2 was made), `has_l2`,
    `has_insight`, `has_subtree_synthesis`, `failures` (stored background failures),
    `updated_at` (`TREE_FIELDS`). With `compact` (`?compact=1`, what the page asks for)
    each node is a row of those values, named once by `fields`: less than half the bytes
    at 10,000 sessions.
    """
    stats = session_stats(storage)
    failures: dict[str | None, int] = {}
    for failure in StorageFailureLog(storage).read():
        failures[failure.session_id] = failures.get(failure.session_id, 0) + 1
    rows = [
        [
            *(s.id, s.parent_id, s.label, s.role, s.status, depth, s.turns, s.records),
            *(s.memory_through, s.turns_since_memory, s.has_memory, s.has_insight),
            *(s.has_subtree_synthesis, failures.get(s.id, 0), s.updated_at.isoformat()),
            list(s.damaged),
        ]
        for s, depth in _in_tree_order(stats)
    ]
    main = next((s.id for s in stats if s.role == "main" and s.in_tree), None)
    head = {
        "tree_id": storage.tree_id,
        "main_session_id": main,
        "count": len(rows),
        "tree_failures": failures.get(None, 0),
    }
    if compact:
        return {**head, "fields": list(TREE_FIELDS), "nodes": rows}
    return {**head, "nodes": [dict(zip(TREE_FIELDS, row, strict=True)) for row in rows]}


def tree_nodes(view: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of a `tree_view`, compact or not, as one dict per node."""
    fields = view.get("fields")
    if fields is None:
        nodes: list[dict[str, Any]] = view["nodes"]
        return nodes
    return [dict(zip(fields, row, strict=True)) for row in view["nodes"]]


def _meta(storage: MainStorage, session_id: str) -> SessionMeta:
    meta = storage.get_session(session_id)
    if meta is None:
        raise SessionNotFoundError(session_id)
    return meta


def session_view(storage: MainStorage, session_id: str) -> dict[str, Any]:
    """`GET /api/session?id=`: meta, place in the tree, lineage, L2 (with the records it
    covers and how stale it is), pending insight, system prompt, subtree synthesis; the
    synthesis for the main session; its stored background failures. `turns` is the
    session's own user-turn count; `fork_turns` the user turns of its whole L3 (inherited
    ones included), the range a fork's `at_turn` can name."""
    meta = _meta(storage, session_id)
    node = storage.get_node(session_id)
    main = meta.role == "main"
    through = storage.get_memory_through(session_id)
    compression = storage.get_compression(session_id)
    memory = storage.get_memory(session_id)
    return {
        "meta": meta.model_dump(mode="json"),
        "parent_id": node.parent_id if node else None,
        "ancestors": [a.model_dump(mode="json") for a in storage.get_ancestors(session_id)]
        if node
        else [],
        "children": [c.model_dump(mode="json") for c in storage.get_children(session_id)]
        if node
        else [],
        "turns": storage.get_turn_count(session_id),
        "fork_turns": _turns_after(storage, session_id, 0),
        "records": storage.count_records(session_id),
        "system_prompt": storage.get_system_prompt(session_id),
        "l2": None if main else memory,
        "memory_through": through,
        "stale_turns": _turns_after(storage, session_id, through),
        "insight": None if main else storage.get_insight(session_id),
        "synthesis": memory if main else None,
        "subtree_synthesis": storage.get_subtree_synthesis(session_id),
        "compression": compression.model_dump(mode="json") if compression else None,
        "settings": storage.get_settings(session_id),
        "failures": [f.as_dict() for f in StorageFailureLog(storage).read(session_id)],
        "lineage": _lineage(storage, session_id),
    }


def _lineage(storage: MainStorage, session_id: str) -> dict[str, Any] | None:
    """Where a forked session came from: its source (and that one's label, if it still
    exists) and the source's turn it starts from."""
    point = storage.get_lineage(session_id)
    if point is None:
        return None
    source = storage.get_session(point.source_id)
    return {
        "forked_from": point.source_id,
        "source_label": source.label if source is not None else None,
        "forked_at_turn": point.at_turn,
    }


def _tool_calls(message: BaseMessage) -> list[dict[str, Any]]:
    if not isinstance(message, AIMessage):
        return []
    calls: list[dict[str, Any]] = [
        {"id": c.get("id"), "name": c["name"], "args": c["args"]} for c in message.tool_calls
    ]
    calls += [
        {"id": c.get("id"), "name": c.get("name"), "args": c.get("args"), "invalid": True}
        for c in message.invalid_tool_calls
    ]
    return calls


def record_dict(message: BaseMessage, index: int, turn: int) -> dict[str, Any]:
    """One L3 record as the page shows it: 1-based `index`, the user `turn` it belongs to
    (0 before the first user message), role, text, tool calls or the call a result answers."""
    out: dict[str, Any] = {
        "index": index,
        "turn": turn,
        "role": message.type,
        "id": message.id,
        "content": message_text(message.content),
    }
    calls = _tool_calls(message)
    if calls:
        out["tool_calls"] = calls
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
        out["name"] = message.name
        out["status"] = message.status
    usage = getattr(message, "usage_metadata", None)
    if usage:
        out["usage"] = dict(usage)
    return out


def records_page(
    storage: MainStorage, session_id: str, *, offset: int = 0, limit: int = 200
) -> dict[str, Any]:
    """`GET /api/session/records?id=`: a page of L3, each record with its turn number."""
    _meta(storage, session_id)
    records = storage.list_records(session_id)
    turn = sum(r.type == "human" for r in records[:offset])
    page = []
    for index, record in enumerate(records[offset : offset + limit], start=offset + 1):
        turn += record.type == "human"
        page.append(record_dict(record, index, turn))
    return {
        "session_id": session_id,
        "offset": offset,
        "limit": limit,
        "total": len(records),
        "memory_through": storage.get_memory_through(session_id),
        "records": page,
    }


def _size(text: str) -> dict[str, int]:
    return {"chars": len(text), "tokens": -(-len(text) // CHARS_PER_TOKEN)}


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"kind": kind, "text": text, **_size(text)}


def _system_parts(
    storage: MainStorage, meta: SessionMeta, slot: TopologySlot | None = None
) -> list[dict[str, Any]]:
    """The sections of the system message, in the order `turn_context()` joins them."""
    sid = meta.id
    compression = storage.get_compression(sid)
    summary = compression.summary if compression is not None else None
    prompt = storage.get_system_prompt(sid)
    parts: list[tuple[str, str | None]] = [("system prompt", prompt)]
    if meta.role == "main":
        synthesis = storage.get_memory(sid)
        parts.append(("synthesis", synthesis_block(synthesis) if synthesis else None))
    else:
        insight, branch = storage.get_insight(sid), storage.get_subtree_synthesis(sid)
        parts += [
            ("identity", identity_line(meta.label)),
            ("topology", run(slot.flow(sid), storage) if slot is not None else None),
            ("insight", insight_block(insight) if insight else None),
            ("subtree synthesis", branch_block(branch) if branch else None),
        ]
    parts.append(("compression summary", summary_block(summary) if summary else None))
    return [_part(kind, text) for kind, text in parts if text]


def context_view(
    storage: MainStorage,
    session_id: str,
    *,
    policy: CompressionPolicy | None = None,
    topology_slot: TopologySlot | None = None,
) -> dict[str, Any]:
    """`GET /api/session/context?id=`: the prompt the session's next turn would send
    (before the new user message), as messages whose parts are labelled and sized.

    Read-only: unlike `turn_context()`, it never runs the compress function. With a
    `policy` that knows the context window, `compression_due` tells whether the next turn
    would compress (and how many records the summary would then cover). With the agent's
    `topology_slot`, a child's prompt shows it after its identity line, as its turns do.
    """
    meta = _meta(storage, session_id)
    parts = _system_parts(storage, meta, topology_slot)
    compression = storage.get_compression(session_id)
    records = storage.list_records(session_id)
    through = compression.through if compression is not None else 0
    history = sanitize_history(records[through:])
    messages: list[dict[str, Any]] = []
    if parts:
        text = "\n\n".join(p["text"] for p in parts)
        messages.append({"role": "system", "content": text, "parts": parts, **_size(text)})
    for message in history:
        text = _history_text(message)
        entry = {"role": message.type, "content": message_text(message.content), **_size(text)}
        entry["parts"] = [{"kind": "history", **_size(text)}]
        calls = _tool_calls(message)
        if calls:
            entry["tool_calls"] = calls
        messages.append(entry)
    return {
        "session_id": session_id,
        "role": meta.role,
        "archived": meta.status == "archived",
        "messages": messages,
        "sizes": _totals(parts, messages),
        "compression": compression.model_dump(mode="json") if compression else None,
        "history_from": through + 1,
        "dropped_records": len(records) - through - len(history),
        "compression_due": _due(policy, parts, records, compression),
        "chars_per_token": CHARS_PER_TOKEN,
    }


def _history_text(message: BaseMessage) -> str:
    text = message_text(message.content)
    if isinstance(message, AIMessage):
        text += "".join(f"{c['name']}{c['args']}" for c in message.tool_calls)
    return text


def _totals(parts: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sizes: dict[str, dict[str, Any]] = {}
    for part in [*parts, *(m["parts"][0] for m in messages if m["role"] != "system")]:
        entry = sizes.setdefault(part["kind"], {"kind": part["kind"], "chars": 0, "tokens": 0})
        entry["chars"] += part["chars"]
        entry["tokens"] += part["tokens"]
    return list(sizes.values())


def _due(
    policy: CompressionPolicy | None,
    parts: list[dict[str, Any]],
    records: list[BaseMessage],
    compression: Any,
) -> dict[str, Any] | None:
    window = policy.context_window if policy is not None else None
    if policy is None or window is None:
        return None
    from langchain_core.messages import SystemMessage

    head = [SystemMessage("\n\n".join(p["text"] for p in parts))] if parts else []
    cut = plan_cut(policy, window, head, records, compression)
    return {"context_window": window, "due": cut is not None, "through": cut}
