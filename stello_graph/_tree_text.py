"""The text of a tree (`Topology.render_text`), over models or stored rows alike: what
`stello-graph tree` prints without building a model (no pydantic imported)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from stello_graph.lineage import ForkPoint

__all__ = ["NodeRow", "tree_text"]


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


def tree_text(
    nodes: Sequence[_Node], archived: Collection[str], lineage: Mapping[str, ForkPoint]
) -> str:
    """The tree as indented text, one session per line (`Topology.render_text`).

    Args:
        nodes: every node, parents before children, siblings in creation order.
        archived: the ids of the archived sessions.
        lineage: the fork point of each forked session, by id.
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

    def walk(node: _Node, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└── " if last else "├── ")
        status = " [archived]" if node.id in archived else ""
        label = node.label or "(no label)"
        lines.append(f"{prefix}{branch}{label}{status}  ({node.id}){forked(node)}")
        kids = children.get(node.id, [])
        extension = "" if top else ("    " if last else "│   ")
        for i, child in enumerate(kids):
            walk(child, prefix + extension, i == len(kids) - 1, False)

    for root in children.get(None, []):
        walk(root, "", True, True)
    return "\n".join(lines)
