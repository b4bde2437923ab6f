"""The text of a tree (`Topology.render_text`), over models or stored rows alike: what
`stello-graph tree` prints without building a model (no pydantic imported)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

from stello_graph.checkpoints._damage import UNDECODABLE, shown, undecodable

if TYPE_CHECKING:
    from stello_graph.lineage import ForkPoint

__all__ = [
    "TOPOLOGY_SESSION_COLUMNS",
    "NodeRow",
    "TopologyText",
    "marked_rows",
    "tree_order",
    "tree_text",
]


class _Node(Protocol):
    """What the text of a tree shows of a node: a `TopologyNode`, or a `NodeRow`."""

    @property
    def id(self) -> str: ...

    @property
    def parent_id(self) -> str | None: ...

    @property
    def label(self) -> str: ...


class NodeRow(NamedTuple):
    """A topology node as a stored row (`id, parent_id, label`), without its model."""

    id: str
    parent_id: str | None
    label: str


TOPOLOGY_SESSION_COLUMNS = (
    *("id", "label", "role", "status", "tags", "metadata", "created_at", "updated_at"),
    *("forked_from", "forked_at_turn", "turn_count", "created_seq"),
)
"""The columns of a `TopologyText.sessions` row, in order: the session's `MetaRow` (as
`_serde.meta_to_row` writes it), its lineage, its user turns and its place in the creation
order. The backends' statements and `Topology` read the layout from here."""


class TopologyText(NamedTuple):
    """A whole tree as `Topology.read` takes it, as two JSON texts read in one snapshot.

    Attributes:
        nodes: a JSON array of every node's `[id, parent_id, label]`, in creation order.
        sessions: a JSON array of every session's row of `TOPOLOGY_SESSION_COLUMNS`, in
            any order.

    A backend makes both texts in its own code (SQLite's and PostgreSQL's JSON functions):
    100,000 sessions are two strings, not a million Python objects, until a view reads them.
    """

    nodes: str
    sessions: str


N = TypeVar("N", bound=_Node)


def tree_order(nodes: Sequence[N], detached: set[str]) -> list[N]:
    """`nodes` (in creation order) in depth-first pre-order, siblings in creation order; a
    node whose parent is not among them is a root.

    Every node is in the result: those no root reaches (their parents make a cycle: a
    damaged tree) come last, each cycle walked from its first-created node as if that were
    a root; their ids go to `detached`."""
    ids = {node.id for node in nodes}
    roots: list[N] = []
    children: dict[str, list[N]] = {}
    for node in nodes:
        parent = node.parent_id
        if parent is None or parent not in ids:
            roots.append(node)
        elif (kids := children.get(parent)) is None:
            children[parent] = [node]
        else:
            kids.append(node)
    ordered: list[N] = []
    _walk(roots, children, ordered)
    if len(ordered) < len(nodes):  # each cycle from its first-created node on
        seen = {node.id for node in ordered}
        for start in nodes:
            if start.id not in seen:
                detached.add(start.id)
                _walk([start], children, ordered, seen)
    return ordered


def _walk(
    starts: Sequence[N],
    children: dict[str, list[N]],
    ordered: list[N],
    seen: set[str] | None = None,
) -> None:
    """Append to `ordered` the nodes under each of `starts` (itself first), depth first; with
    `seen` (a damaged tree), only those not in it, which it then holds."""
    stack = [iter(starts)]  # the siblings left to visit, at each depth of the walk
    while stack:
        for node in stack[-1]:
            if seen is not None:
                if node.id in seen:
                    continue
                seen.add(node.id)
            ordered.append(node)
            kids = children.get(node.id)
            if kids is not None:
                stack.append(iter(kids))
                break
        else:
            stack.pop()


def marked_rows(
    rows: Sequence[NodeRow], detached: Collection[str]
) -> tuple[list[NodeRow], dict[str, tuple[str, ...]]]:
    """`rows` (from `tree_order`) as a view shows them, and the damage of each node that
    needs a stand-in: a text that does not decode (`"(undecodable)"` for a label), or a
    node of `detached` (then a root: `parent_id`)."""
    damage: dict[str, tuple[str, ...]] = {}
    marked = []
    for row in rows:
        bad = [name for name, value in zip(NodeRow._fields, row, strict=True) if undecodable(value)]
        parent = None if row.id in detached else row.parent_id
        if row.id in detached and "parent_id" not in bad:
            bad.append("parent_id")
        if bad:
            label = UNDECODABLE if "label" in bad else row.label
            row = NodeRow(shown(row.id), None if parent is None else shown(parent), label)
            damage[row.id] = tuple(bad)
        marked.append(row)
    return marked, damage


def tree_text(
    nodes: Sequence[_Node],
    archived: Collection[str],
    lineage: Mapping[str, ForkPoint],
    damaged: Mapping[str, Sequence[str]],
) -> str:
    """The tree as indented text, one session per line (`Topology.render_text`).

    Args:
        nodes: every node, parents before children, siblings in creation order.
        archived: the ids of the archived sessions.
        lineage: the fork point of each forked session, by id.
        damaged: the columns of each damaged session that do not decode (`parent_id`: its
            node was detached from a cycle, and is shown as a root).
    """
    by_id = {node.id: node for node in nodes}
    children: dict[str | None, list[_Node]] = {}
    for node in nodes:
        children.setdefault(node.parent_id, []).append(node)

    def forked(node: _Node) -> str:
        """`  <- forked from 'X' at turn N`, when it says more than the tree does: the
        child inherited turns of its source, or was moved away from it."""
        point = lineage.get(node.id)
        if point is None or (point.at_turn is None and point.source_id == node.parent_id):
            return ""
        source = by_id.get(point.source_id)
        name = repr(source.label) if source is not None else f"{point.source_id} (removed)"
        at = f" at turn {point.at_turn}" if point.at_turn is not None else ""
        return f"  <- forked from {name}{at}"

    lines: list[str] = []
    # depth first with a stack of its own (a chain of forks can be deeper than Python's
    # recursion limit): each entry is a node, its line's prefix, last among its siblings,
    # a root
    stack = [(root, "", True, True) for root in reversed(children.get(None, []))]
    while stack:
        node, prefix, last, top = stack.pop()
        branch = "" if top else ("└── " if last else "├── ")
        status = " [archived]" if node.id in archived else ""
        label = node.label or "(no label)"
        lines.append(f"{prefix}{branch}{label}{status}  ({node.id}){forked(node)}")
        bad = damaged.get(node.id, ())
        if "parent_id" in bad:
            lines[-1] += "  [detached: its parents make a cycle]"
        if columns := [column for column in bad if column != "parent_id"]:
            lines[-1] += f"  [damaged: {', '.join(columns)}]"
        kids = children.get(node.id, [])
        below = prefix + ("" if top else ("    " if last else "│   "))
        stack.extend(
            (kid, below, i == len(kids) - 1, False) for i, kid in reversed(list(enumerate(kids)))
        )
    return "\n".join(lines)
