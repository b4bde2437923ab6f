"""`Topology`: a snapshot of the tree for display: text, and SVG (`stello_graph.starmap`).

It holds only what a view needs — nodes, the meta of each session and its number of turns —
so drawing a tree never loads a session's records. In Jupyter a `Topology` shows itself as
its star map.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from stello_graph._tree_text import NodeRow, tree_text
from stello_graph.lineage import ForkPoint
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage

__all__ = ["NodeRow", "Topology", "tree_text"]


def _turns(sessions: Mapping[str, SessionMeta], counts: Mapping[str, int]) -> dict[str, int]:
    """The user turns of each of `sessions`, from `list_turn_counts`."""
    return {sid: counts.get(sid, 0) for sid in sessions}


@dataclass(frozen=True)
class Topology:
    """The topology tree of one `MainStorage`, as of when it was read.

    Attributes:
        nodes: every node, parents before children, siblings in creation order.
        sessions: the meta of each node's session, by id.
        turns: the number of user turns of each node's session, by id.
        lineage: the fork point of each forked session, by id (`StelloAgent.lineage`).
    """

    nodes: tuple[TopologyNode, ...]
    sessions: Mapping[str, SessionMeta] = field(default_factory=dict)
    turns: Mapping[str, int] = field(default_factory=dict)
    lineage: Mapping[str, ForkPoint] = field(default_factory=dict)

    @classmethod
    def read(cls, storage: MainStorage) -> Topology:
        """Read the whole tree of `storage`: three statements whatever its size on a stello
        storage (`topology_parts`), else four reads, or one turn count per session on a
        storage without `list_turn_counts`."""
        parts = getattr(storage, "topology_parts", None)
        if callable(parts):
            return cls._of(*parts())
        nodes, metas = storage.get_tree(), storage.list_sessions()
        lineage = storage.list_lineage()
        counts = getattr(storage, "list_turn_counts", None)
        if callable(counts):
            return cls._of(nodes, metas, lineage, counts())
        shown = {node.id for node in nodes}
        turns = {m.id: storage.get_turn_count(m.id) for m in metas if m.id in shown}
        return cls._of(nodes, metas, lineage, turns)

    @classmethod
    async def aread(cls, storage: MainStorage) -> Topology:
        """Async twin of `read`."""
        aparts = getattr(storage, "atopology_parts", None)
        if callable(aparts):
            return cls._of(*(await aparts()))
        nodes, metas = await storage.aget_tree(), await storage.alist_sessions()
        lineage = await storage.alist_lineage()
        acounts = getattr(storage, "alist_turn_counts", None)
        if callable(acounts):
            return cls._of(nodes, metas, lineage, await acounts())
        shown = {node.id for node in nodes}
        turns = {m.id: await storage.aget_turn_count(m.id) for m in metas if m.id in shown}
        return cls._of(nodes, metas, lineage, turns)

    @classmethod
    def _of(
        cls,
        nodes: Sequence[TopologyNode],
        metas: Sequence[SessionMeta],
        lineage: Mapping[str, ForkPoint],
        counts: Mapping[str, int],
    ) -> Topology:
        by_id = {meta.id: meta for meta in metas}
        sessions = {node.id: by_id[node.id] for node in nodes if node.id in by_id}
        return cls(tuple(nodes), sessions, _turns(sessions, counts), lineage)

    @property
    def root(self) -> TopologyNode | None:
        """The root node (the main session), if the tree has one."""
        return next((n for n in self.nodes if n.parent_id is None), None)

    def node(self, node_id: str) -> TopologyNode | None:
        return self._by_id.get(node_id)

    @cached_property
    def _children(self) -> dict[str | None, list[TopologyNode]]:
        kids: dict[str | None, list[TopologyNode]] = {}
        for node in self.nodes:
            kids.setdefault(node.parent_id, []).append(node)
        return kids

    @cached_property
    def _by_id(self) -> dict[str, TopologyNode]:
        return {n.id: n for n in self.nodes}

    def children(self, node_id: str) -> list[TopologyNode]:
        """Direct children of a node, in creation order."""
        return list(self._children.get(node_id, ()))

    def depth(self, node_id: str) -> int:
        """0 for the root, 1 for its children, ..."""
        depth, current = 0, self._by_id.get(node_id)
        while current is not None and current.parent_id is not None:
            depth, current = depth + 1, self._by_id.get(current.parent_id)
        return depth

    def __iter__(self) -> Iterator[TopologyNode]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def render_text(self) -> str:
        """The tree as indented text, one session per line."""
        archived = {sid for sid, meta in self.sessions.items() if meta.status == "archived"}
        return tree_text(self.nodes, archived, self.lineage)

    def __str__(self) -> str:
        return self.render_text()

    def __repr__(self) -> str:
        # Short on purpose: notebooks compute it for every displayed tree, whatever its size.
        root = self.root
        archived = sum(meta.status == "archived" for meta in self.sessions.values())
        label = repr(root.label) if root is not None else "none"
        return f"<Topology: {len(self.nodes)} sessions, {archived} archived, root {label}>"

    def render_svg(self, **options: Any) -> str:
        """The star map of the tree, as standalone SVG (see `starmap.render_topology`)."""
        from stello_graph.starmap import render_topology

        return render_topology(self, **options)

    def _repr_svg_(self) -> str:
        """Jupyter shows a `Topology` as its star map."""
        return self.render_svg()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form: nodes with their session's label, role, status, turns,
        lineage (`forked_from`, `forked_at_turn`) and last change (ISO 8601)."""
        out: list[dict[str, Any]] = []
        for node in self.nodes:
            meta = self.sessions.get(node.id)
            point = self.lineage.get(node.id)
            out.append(
                {
                    "id": node.id,
                    "parent_id": node.parent_id,
                    "label": node.label,
                    "role": meta.role if meta else None,
                    "status": meta.status if meta else None,
                    "turns": self.turns.get(node.id, 0),
                    "forked_from": point.source_id if point else None,
                    "forked_at_turn": point.at_turn if point else None,
                    "updated_at": meta.updated_at.isoformat() if meta else None,
                }
            )
        return {"nodes": out}
