"""The star map's layout: where each session's star stands, how large and bright it is, and
which sessions a map of a large tree draws (`stello_graph.starmap` renders it as SVG)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stello_graph.errors import InvalidInputError
from stello_graph.models import SessionMeta, TopologyNode

__all__ = ["DEFAULT_MAX_STARS", "MAX_SIZE", "Star", "TreeData", "layout"]


class TreeData(Protocol):
    """What the star map draws: plain data about a tree (a `Topology` is one).

    Attributes:
        nodes: the tree's nodes (the root has no parent).
        sessions: the sessions' metadata, by id (status, last change).
        turns: the sessions' user turns, by id.
    """

    @property
    def nodes(self) -> Sequence[TopologyNode]: ...
    @property
    def sessions(self) -> Mapping[str, SessionMeta]: ...
    @property
    def turns(self) -> Mapping[str, int]: ...


MAX_SIZE = 20_000
"""The largest map drawn, in pixels (width and height)."""
_MIN_BRIGHTNESS = 0.35


@dataclass(frozen=True, slots=True)
class Star:
    """Where and how one session is drawn.

    Attributes:
        node: the session's topology node.
        depth: 0 for the main session, 1 for its children, ...
        x, y: the centre of its star, in SVG user units.
        radius: the radius of its star.
        brightness: from `0.35` (least recently changed) to `1.0` (most recently).
        turns: its number of user turns.
        archived: whether the session is archived.
    """

    node: TopologyNode
    depth: int
    x: float
    y: float
    radius: float
    brightness: float
    turns: int
    archived: bool


def _tree_shape(tree: TreeData) -> tuple[TopologyNode, dict[str, list[TopologyNode]]]:
    """The root and every node's children; extra roots and orphans hang under the root."""
    nodes = list(tree.nodes)
    root = next((n for n in nodes if n.parent_id is None), nodes[0])
    known = {n.id for n in nodes}
    kids: dict[str, list[TopologyNode]] = {n.id: [] for n in nodes}
    for node in nodes:
        if node.id == root.id:
            continue
        parent = node.parent_id if node.parent_id in known else root.id
        kids[parent or root.id].append(node)
    return root, kids


def _breadth_first(
    root: TopologyNode, kids: dict[str, list[TopologyNode]]
) -> Iterator[tuple[TopologyNode, int]]:
    level, depth, seen = [root], 0, {root.id}
    while level:
        yield from ((node, depth) for node in level)
        level = [k for n in level for k in kids[n.id] if k.id not in seen]
        seen.update(k.id for k in level)
        depth += 1


def _angles(
    order: list[tuple[TopologyNode, int]], kids: dict[str, list[TopologyNode]]
) -> dict[str, tuple[float, float]]:
    """`(angle, sector width)` of each node: a subtree's sector is shared by its children in
    proportion to their leaves, so every subtree keeps its own slice of the sky."""
    leaves: dict[str, int] = {}
    for node, _ in reversed(order):
        leaves[node.id] = sum(leaves.get(k.id, 0) for k in kids[node.id]) or 1
    root = order[0][0]
    sectors = {root.id: (-math.pi / 2, 2 * math.pi)}  # start at the top, go clockwise
    for node, _ in order:
        start, width = sectors[node.id]
        total = sum(leaves[k.id] for k in kids[node.id])
        for kid in kids[node.id]:
            share = width * leaves[kid.id] / total
            sectors[kid.id] = (start, share)
            start += share
    return {nid: (start + width / 2, width) for nid, (start, width) in sectors.items()}


DEFAULT_MAX_STARS = 2_500
"""Sessions a star map draws one by one by default: ~600 bytes of SVG each, so a map stays
under ~2 MB whatever the tree's size; the rest are counted on the star they hang under."""


@dataclass(frozen=True, slots=True)
class _Shown:
    """The part of a tree a star map draws (a `TreeData`), and what it leaves out."""

    nodes: Sequence[TopologyNode]
    sessions: Mapping[str, SessionMeta]
    turns: Mapping[str, int]
    hidden: Mapping[str, int]
    """Sessions left out, by the drawn star they are counted on (their nearest drawn
    ancestor)."""
    total: int
    """Sessions of the whole tree."""


def _shown(tree: TreeData, max_stars: int) -> _Shown:
    """The first `max_stars` sessions of `tree` from the centre out (breadth first: whole
    rings, then the first sessions of the ring that does not fit), each left-out session
    counted on its nearest drawn ancestor."""
    nodes = list(tree.nodes)
    if len(nodes) <= max_stars:
        return _Shown(nodes, tree.sessions, tree.turns, {}, len(nodes))
    root, kids = _tree_shape(tree)
    order = list(_breadth_first(root, kids))
    kept = {node.id for node, _ in order[: max(1, max_stars)]}
    parent_of = {k.id: n.id for n in nodes for k in kids.get(n.id, ())}
    hidden: dict[str, int] = {}
    shown_at: dict[str, str] = {}
    for node, _ in order:  # parents come first: each hidden node's drawn ancestor is known
        at = shown_at[node.id] = node.id if node.id in kept else shown_at[parent_of[node.id]]
        if at != node.id:
            hidden[at] = hidden.get(at, 0) + 1
    drawn = [node for node, _ in order if node.id in kept]
    sessions = {sid: meta for sid, meta in tree.sessions.items() if sid in kept}
    turns = {sid: n for sid, n in tree.turns.items() if sid in kept}
    return _Shown(drawn, sessions, turns, hidden, len(order))


def _brightness(tree: TreeData) -> dict[str, float]:
    """Recency rank of each session, from `_MIN_BRIGHTNESS` (oldest change) to 1 (newest)."""
    times = sorted({meta.updated_at for meta in tree.sessions.values()})
    if len(times) < 2:
        return dict.fromkeys(tree.sessions, 1.0)
    rank = {at: i / (len(times) - 1) for i, at in enumerate(times)}
    span = 1 - _MIN_BRIGHTNESS
    return {sid: _MIN_BRIGHTNESS + span * rank[m.updated_at] for sid, m in tree.sessions.items()}


def layout(tree: TreeData, *, size: float = 640.0) -> list[Star]:
    """Place every session of `tree` on a `size` x `size` map, parents before children.

    Raises:
        InvalidInputError: `size` is not a number above 100 and at most `MAX_SIZE`.
    """
    if isinstance(size, bool) or not isinstance(size, int | float) or not 100 < size <= MAX_SIZE:
        raise InvalidInputError(
            f"size must be a number of pixels above 100 and at most {MAX_SIZE}, got {size!r}."
        )
    if not tree.nodes:
        return []
    root, kids = _tree_shape(tree)
    order = list(_breadth_first(root, kids))
    angles, bright = _angles(order, kids), _brightness(tree)
    scale, centre = size / 640, size / 2
    gap = (centre - 48 * scale) / max(depth for _, depth in order) if len(order) > 1 else 0.0
    most = max([tree.turns.get(node.id, 0) for node, _ in order] + [1])
    stars = []
    for node, depth in order:
        angle, sector = angles[node.id]
        ring, turns = gap * depth, tree.turns.get(node.id, 0)
        share = math.sqrt(turns / most)
        if depth == 0:
            radius = scale * (11 + 9 * share)
        else:  # never wider than the room its sector leaves on its ring
            room = min(0.45 * ring * min(sector, math.pi), 0.4 * gap)
            radius = max(1.5 * scale, min(scale * (3.5 + 9.5 * share), room))
        meta = tree.sessions.get(node.id)
        stars.append(
            Star(
                node=node,
                depth=depth,
                x=centre + ring * math.cos(angle),
                y=centre + ring * math.sin(angle),
                radius=radius,
                brightness=bright.get(node.id, _MIN_BRIGHTNESS),
                turns=turns,
                archived=meta is not None and meta.status == "archived",
            )
        )
    return stars
