"""What must hold in a stello database after a crash, a concurrent run or a failure.

`Snapshot.read` loads one tree through a fresh `SqliteMainStorage` (or `PostgresMainStorage`,
given a `postgresql://` DSN: the public API, as a user reopening the database would);
`structural_problems` checks what holds whatever happened, and `ack_problems` checks that
every acknowledged operation is fully present. Both return a list of problems (empty =
fine), so a failing run reports all of them at once.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph import SessionMeta, TopologyNode
from stello_graph._context import message_text, sanitize_history
from stello_graph.checkpoints import SqliteMainStorage
from tests.reliability import _scenario as sc

__all__ = ["Snapshot", "ack_problems", "integrity_problems", "structural_problems"]


def integrity_problems(path: Path | str) -> list[str]:
    """`PRAGMA integrity_check` and `foreign_key_check` on a fresh connection (none for a
    PostgreSQL DSN: the server checks its foreign keys on every write)."""
    if isinstance(path, str) and path.startswith("postgresql://"):
        return []
    conn = sqlite3.connect(path)
    try:
        problems = [f"integrity_check: {r[0]}" for r in conn.execute("PRAGMA integrity_check")]
        problems = [p for p in problems if p != "integrity_check: ok"]
        problems += [f"foreign_key_check: {r}" for r in conn.execute("PRAGMA foreign_key_check")]
    finally:
        conn.close()
    return problems


@dataclass
class SessionData:
    meta: SessionMeta
    node: TopologyNode | None
    records: list[BaseMessage]
    insight: str | None
    memory: str | None
    through: int
    turn_count: int
    own_start: int = 0
    """Index of the first record the session wrote itself (after what a fork copied)."""
    turns: list[list[BaseMessage]] = field(default_factory=list)
    """The session's own turns, each a group starting with its user message."""


@dataclass
class Snapshot:
    sessions: dict[str, SessionData]
    nodes: list[TopologyNode]
    main_id: str | None

    @classmethod
    def read(cls, path: Path | str, tree_id: str = "default") -> Snapshot:
        opened: Any
        if isinstance(path, str) and path.startswith("postgresql://"):
            from stello_graph.checkpoints import PostgresMainStorage

            opened = PostgresMainStorage(path, tree_id=tree_id)
        else:
            opened = SqliteMainStorage(path, tree_id=tree_id)
        with opened as s:
            nodes = s.get_tree()
            by_id = {n.id: n for n in nodes}
            main = s.get_main_session()
            sessions = {
                m.id: SessionData(
                    meta=m,
                    node=by_id.get(m.id),
                    records=s.list_records(m.id),
                    insight=s.get_insight(m.id),
                    memory=s.get_memory(m.id),
                    through=s.get_memory_through(m.id),
                    turn_count=s.get_turn_count(m.id),
                )
                for m in s.list_sessions()
            }
        snap = cls(sessions, nodes, main.id if main else None)
        snap._split_turns()
        return snap

    def _split_turns(self) -> None:
        """Find where each session's own records start: after those its fork copied."""
        for data in self.sessions.values():
            parent = data.node.parent_id if data.node else None
            inherited: set[str | None] = set()
            if parent is not None and parent in self.sessions:
                inherited = {m.id for m in self.sessions[parent].records}
            start = 0
            while start < len(data.records) and (
                data.records[start].id in inherited
                or not isinstance(data.records[start], HumanMessage)
            ):
                start += 1
            data.own_start = start
            turns: list[list[BaseMessage]] = []
            for record in data.records[start:]:
                if isinstance(record, HumanMessage):
                    turns.append([record])
                elif turns:
                    turns[-1].append(record)
            data.turns = turns


def _is_reply_to(reply: str, text: str) -> bool:
    return reply == f"re:{text}" or reply.startswith(f"re:{text} [saw:")


def _turn_problems(sid: str, turn: list[BaseMessage], strict: bool) -> list[str]:
    """A committed turn: user text, (AI with calls, all its results)*, final AI `re:<text>`.

    `strict`: the turn also took exactly the tool rounds the scripted model planned (no
    injected faults added any).
    """
    text = message_text(turn[0].content)
    where = f"session {sid} turn {text!r}"
    final = turn[-1]
    problems: list[str] = []
    if not isinstance(final, AIMessage) or sc.asks_for_tools(final):
        problems.append(f"{where}: does not end with a final AI reply: {[m.type for m in turn]}")
    elif not _is_reply_to(message_text(final.content), text):
        problems.append(f"{where}: final reply {final.content!r} is not for this text")
    if sanitize_history(turn) != turn:
        problems.append(f"{where}: incomplete tool-call group {[m.type for m in turn]}")
    for m in turn[1:-1]:
        if isinstance(m, HumanMessage):
            problems.append(f"{where}: a second user message inside the turn")
        if isinstance(m, AIMessage) and not sc.asks_for_tools(m):
            problems.append(f"{where}: an intermediate AI reply without tool calls")
    rounds = sum(1 for m in turn if sc.asks_for_tools(m))
    if strict and rounds != sc.planned_rounds(text):
        problems.append(
            f"{where}: {rounds} tool rounds, the model planned {sc.planned_rounds(text)}"
        )
    return problems


def structural_problems(snap: Snapshot, *, strict: bool = True) -> list[str]:
    """What must hold in any state a crash or a race can leave.

    `strict`: no tool failed and every turn took the rounds the model planned (off for the
    fault suite, which makes tools and tool calls fail on purpose).
    """
    problems: list[str] = []
    mains = [d for d in snap.sessions.values() if d.meta.role == "main"]
    if len(mains) > 1:
        problems.append(f"{len(mains)} main sessions")
    node_ids = {n.id for n in snap.nodes}
    for sid, data in snap.sessions.items():
        if data.node is None:
            problems.append(f"session {sid} ({data.meta.label!r}) has no TopologyNode")
        if data.meta.role == "standard" and data.node is not None and data.node.parent_id is None:
            problems.append(f"standard session {sid} is a root")
    for node in snap.nodes:
        if node.id not in snap.sessions:
            problems.append(f"TopologyNode {node.id} has no session")
        if node.parent_id is not None and node.parent_id not in node_ids:
            problems.append(f"TopologyNode {node.id} has a missing parent {node.parent_id}")
    labels = Counter(d.meta.label for d in snap.sessions.values())
    for lab, n in labels.items():
        if n > 1:
            twins = [
                f"{sid} under {d.node.parent_id if d.node else None}"
                for sid, d in snap.sessions.items()
                if d.meta.label == lab
            ]
            problems.append(f"label {lab!r} used {n} times (a fork ran twice): {', '.join(twins)}")
    for sid, data in snap.sessions.items():
        problems += _session_problems(sid, data, strict)
    problems += _insight_problems(snap)
    return problems


def _session_problems(sid: str, data: SessionData, strict: bool) -> list[str]:
    problems: list[str] = []
    if sanitize_history(data.records) != data.records:
        problems.append(f"session {sid}: L3 holds an incomplete tool-call group")
    texts = Counter(message_text(t[0].content) for t in data.turns)
    problems += [f"session {sid}: turn {t!r} stored {n} times" for t, n in texts.items() if n > 1]
    for turn in data.turns:
        problems += _turn_problems(sid, turn, strict)
    if data.turn_count != len(data.turns):
        problems.append(
            f"session {sid}: turn_count {data.turn_count} but {len(data.turns)} turns in L3"
        )
    if data.through > len(data.records):
        problems.append(f"session {sid}: L2 covers {data.through} of {len(data.records)} records")
    covered = sc.l2_count(data.memory)
    if data.meta.role == "standard" and data.memory is not None and covered != data.through:
        problems.append(f"session {sid}: L2 says it covers {covered}, cursor is {data.through}")
    for m in data.records if strict else ():
        if isinstance(m, ToolMessage) and m.status == "error":
            problems.append(f"session {sid}: a tool failed: {m.content!r}")
    return problems


def delivered(snap: Snapshot) -> dict[str, Counter[str]]:
    """Per session: how many of its own committed turns showed each insight."""
    out: dict[str, Counter[str]] = {}
    for sid, data in snap.sessions.items():
        seen: Counter[str] = Counter()
        for turn in data.turns:
            tags: set[str] = set()
            for m in turn:
                if isinstance(m, AIMessage):
                    tags.update(sc.saw_tags(message_text(m.content)))
            seen.update(tags)
        out[sid] = seen
    return out


def _insight_problems(snap: Snapshot) -> list[str]:
    """An insight shown by a committed turn is consumed: shown once, and no longer pending."""
    problems: list[str] = []
    for sid, seen in delivered(snap).items():
        for insight, times in seen.items():
            if times > 1:
                problems.append(f"session {sid}: insight {insight} delivered {times} times")
            if snap.sessions[sid].insight == insight:
                problems.append(f"session {sid}: insight {insight} delivered yet still pending")
    return problems


def _written_after(other: str, acked: str, integrations: set[tuple[int, int]]) -> bool:
    """Whether the synthesis or insight `other` may have been written after `acked`, one of
    an acknowledged integration, and so replaced it by design.

    A writer's acknowledged integrations ran one after another on its main thread: among
    them, and across runs (a driver is killed before the next starts), `(run, k)` is the
    order of their writes. Not so for a scheduled integration of the same run (a `(run, k)`
    no acknowledgement names): it runs on the scheduler's worker meanwhile. Of overlapping
    integrations only the first to finish is stored, but `k` is drawn when the integrate
    function is called: one that began after an acknowledged one was stored may still hold
    a smaller `k` than a later acknowledged one, and be stored between them.
    """
    key, mine = sc.order_key(other), sc.order_key(acked)
    return key > mine or (key[0] == mine[0] and key not in integrations)


def _insight_kept(
    snap: Snapshot,
    sid: str,
    insight: str,
    seen: dict[str, Counter[str]],
    integrations: set[tuple[int, int]] | None,
) -> bool:
    """Pending, delivered once, or replaced by an insight written after it (by design).

    `integrations`: the `(run, k)` of the acknowledged integrations, which tell what may
    have been written after `insight` (`_written_after`); `None` (integrations from several
    processes, unordered): any other insight of the session that is pending or delivered
    counts as the one that replaced it.
    """
    data = snap.sessions.get(sid)
    if data is None:
        return False
    if data.insight == insight or seen[sid][insight] == 1:
        return True
    others = [i for i in [data.insight, *seen[sid]] if i and i != insight]
    if integrations is None:
        return bool(others)
    return any(_written_after(i, insight, integrations) for i in others)


def ack_problems(
    snap: Snapshot, acks: list[dict[str, Any]], *, ordered: bool = True
) -> tuple[list[str], int]:
    """Every acknowledged operation fully present; returns (problems, operations checked).

    `ordered`: the acks come from one writer, whose acknowledged integrations ran one after
    another (with, at most, its scheduled ones meanwhile): what replaced an acknowledged
    synthesis or insight was written after it (`_written_after`).
    """
    problems: list[str] = []
    seen = delivered(snap)
    acked = {sc.order_key(a["synthesis"]) for a in acks if a["op"] == "integrate"}
    integrations = acked if ordered else None
    checked = 0
    synthesis = snap.sessions[snap.main_id].memory if snap.main_id else None
    for ack in acks:
        op = ack["op"]
        if op in ("ready", "begin"):
            continue
        checked += 1
        data = snap.sessions.get(ack.get("sid", ""))
        if op == "turn":
            found = [t for t in data.turns if t[0].content == ack["text"]] if data else []
            if len(found) != 1:
                problems.append(f"acked turn {ack['text']!r} on {ack['sid']} found {len(found)}x")
            elif message_text(found[0][-1].content) != ack["reply"]:
                problems.append(f"acked turn {ack['text']!r}: reply differs")
            for insight in ack["saw"]:
                if data is not None and seen[ack["sid"]][insight] != 1:
                    problems.append(f"acked turn {ack['text']!r} saw {insight}, not delivered once")
        elif op == "fork":
            if data is None or data.node is None or data.node.parent_id != ack["parent"]:
                problems.append(f"acked fork {ack['label']!r} ({ack['sid']}) missing or misplaced")
            elif data.meta.label != ack["label"]:
                problems.append(f"acked fork {ack['sid']} has label {data.meta.label!r}")
        elif op == "resumed":
            if data is None or not any(
                message_text(t[-1].content) == ack["reply"] for t in data.turns
            ):
                problems.append(f"acked resumed turn on {ack['sid']} not stored")
        elif op == "archive":
            if data is None or data.meta.status != "archived":
                problems.append(f"acked archive of {ack['sid']} not stored")
        elif op == "consolidate":
            if data is None or data.through < ack["covers"]:
                got = data.through if data else None
                problems.append(f"acked L2 of {ack['sid']} covered {ack['covers']}, now {got}")
        elif op == "integrate":
            if synthesis is None or (
                integrations is not None
                and synthesis != ack["synthesis"]
                and not _written_after(synthesis, ack["synthesis"], integrations)
            ):
                problems.append(f"acked synthesis {ack['synthesis']} replaced by older {synthesis}")
            for sid, insight in ack["insights"].items():
                if not _insight_kept(snap, sid, insight, seen, integrations):
                    problems.append(f"acked insight {insight} for {sid} lost")
        else:
            problems.append(f"unknown ack {ack!r}")
    return problems, checked
