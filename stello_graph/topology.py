"""`Topology`: a snapshot of the tree for display: text, and SVG (`stello_graph.starmap`).

It holds only what a view needs — nodes, the meta of each session and its number of turns —
so drawing a tree never loads a session's records. In Jupyter a `Topology` shows itself as
its star map.

A `Topology` read from a stello storage holds the tree as the storage's two JSON texts
(`TopologyText`) and builds its models on access: `len`, `repr`, `node`, `children`,
`depth`, `render_text` and `to_dict` read the rows without building a model for every
session, and `nodes`, `sessions`, `turns` and `lineage` are built the first time they are
read, once. Reading a tree of 100,000 sessions is then two statements' worth of text, not
200,000 models.
"""

from __future__ import annotations

import json
from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from functools import cached_property
from operator import itemgetter
from typing import Any, NoReturn

from stello_graph._flow import Flow, Storage, arun, run
from stello_graph._tree_text import (
    TOPOLOGY_SESSION_COLUMNS,
    NodeRow,
    TopologyText,
    marked_rows,
    tree_order,
    tree_text,
)
from stello_graph.checkpoints._damage import marked, row_damage, shown, undecodable
from stello_graph.lineage import ForkPoint
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage

__all__ = ["NodeRow", "Topology", "tree_text"]

_ROLE, _STATUS, _UPDATED, _FORKED_FROM, _FORKED_AT, _TURNS, _SEQ = map(
    TOPOLOGY_SESSION_COLUMNS.index,
    ("role", "status", "updated_at", "forked_from", "forked_at_turn", "turn_count", "created_seq"),
)
_META_END = _UPDATED + 1
"""Positions in a `TopologyText.sessions` row; its `MetaRow` is `row[:_META_END]`."""


def _meta_fields(meta: SessionMeta) -> tuple[str, str, str]:
    return meta.role, meta.status, meta.updated_at.isoformat()


class _Metas(Mapping[str, SessionMeta]):
    """`Topology.sessions` of a read tree: each `SessionMeta` built when first looked up."""

    def __init__(self, order: Sequence[NodeRow], rows: Mapping[str, list[Any]]) -> None:
        self._order = [node.id for node in order if node.id in rows]
        self._rows = rows
        self._built: dict[str, SessionMeta] = {}

    def __getitem__(self, session_id: str) -> SessionMeta:
        meta = self._built.get(session_id)
        if meta is None:
            from stello_graph.checkpoints._rows import stored_meta

            meta = self._built[session_id] = stored_meta(self._rows[session_id][:_META_END])
        return meta

    def _all(self) -> dict[str, SessionMeta]:
        """Every meta, in order: those not looked up yet built in one go."""
        if len(self._built) < len(self._rows):
            from stello_graph.checkpoints._rows import no_collection, stored_meta

            with no_collection():
                built, rows = self._built, self._rows
                for sid in self._order:
                    if sid not in built:
                        built[sid] = stored_meta(rows[sid][:_META_END])
        return {sid: self._built[sid] for sid in self._order}

    def values(self) -> ValuesView[SessionMeta]:
        return self._all().values()

    def items(self) -> ItemsView[str, SessionMeta]:
        return self._all().items()

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        return repr(self._all())


class Topology:
    """The topology tree of one `MainStorage`, as of when it was read (read-only).

    Args:
        nodes: every node, parents before children, siblings in creation order.
        sessions: the meta of each node's session, by id.
        turns: the number of user turns of each node's session, by id.
        lineage: the fork point of each forked session, by id (`StelloAgent.lineage`).

    Each is also an attribute of the same name. `Topology.read(storage)` (what
    `StelloAgent.tree()` returns) builds them on first access.
    """

    _text: TopologyText | None
    """The storage's text of a read tree (`None`: made of models)."""

    def __init__(
        self,
        nodes: Iterable[TopologyNode] = (),
        sessions: Mapping[str, SessionMeta] | None = None,
        turns: Mapping[str, int] | None = None,
        lineage: Mapping[str, ForkPoint] | None = None,
    ) -> None:
        given = self.__dict__
        given["nodes"] = tuple(nodes)
        given["sessions"] = {} if sessions is None else sessions
        given["turns"] = {} if turns is None else turns
        given["lineage"] = {} if lineage is None else lineage
        given["_text"] = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """A `Topology` as a field of a pydantic model: given as one, dumped as its parts."""
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(cls._parts)
        )

    def _parts(self) -> dict[str, Any]:
        """The four parts, as plain values (what equality compares, and pydantic dumps)."""
        return {
            "nodes": self.nodes,
            "sessions": dict(self.sessions),
            "turns": dict(self.turns),
            "lineage": dict(self.lineage),
        }

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a Topology is read-only; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"a Topology is read-only; cannot delete {name!r}")

    @classmethod
    def of_text(cls, text: TopologyText) -> Topology:
        """The `Topology` of a storage's `TopologyText`, its models built on access."""
        tree = cls.__new__(cls)
        tree.__dict__["_text"] = text
        return tree

    @classmethod
    def read(cls, storage: MainStorage) -> Topology:
        """Read the whole tree of `storage`: one statement on SQLite or PostgreSQL
        (`topology_text`), three on a backend without it (`topology_parts`)."""
        return run(_read_flow(), storage)

    @classmethod
    async def aread(cls, storage: MainStorage) -> Topology:
        """Async twin of `read`."""
        return await arun(_read_flow(), storage)

    # -- the rows: what every view reads --------------------------------------------------
    @cached_property
    def _rows(self) -> list[NodeRow]:
        """Every node as a row, in `nodes`' order; a node detached from a cycle is a root
        (see `damaged`), a label that does not decode `"(undecodable)"`."""
        text = self._text
        if text is None:
            return [
                NodeRow(
                    node.id, None if "parent_id" in node.damaged else node.parent_id, node.label
                )
                for node in self.nodes
            ]
        from stello_graph.checkpoints._rows import no_collection

        detached: set[str] = set()
        flagged = undecodable(text.nodes)
        with no_collection():
            parsed = json.loads(text.nodes)
            if flagged:  # read from rows that are not UTF-8: their texts marked
                parsed = [[marked(value) for value in row] for row in parsed]
            rows = tree_order([NodeRow(*row) for row in parsed], detached)
        if detached or flagged:
            rows, self.__dict__["_node_damage"] = marked_rows(rows, detached)
        return rows

    @cached_property
    def _session_rows(self) -> dict[str, list[Any]]:
        """Every session's `TopologyText` row, by id (a read tree only)."""
        assert self._text is not None
        from stello_graph.checkpoints._rows import no_collection

        with no_collection():
            rows = json.loads(self._text.sessions)
        if undecodable(self._text.sessions):  # ids too: keyed as the nodes show them
            rows = [[marked(value) for value in row] for row in rows]
            return {shown(row[0]): row for row in rows}
        return {row[0]: row for row in rows}

    @cached_property
    def _shown(self) -> dict[str, list[Any]]:
        """The session rows of the nodes' sessions, by id (a read tree only)."""
        rows = self._session_rows
        return {node.id: rows[node.id] for node in self._rows if node.id in rows}

    @cached_property
    def _row_by_id(self) -> dict[str, NodeRow]:
        return {row.id: row for row in self._rows}

    @cached_property
    def _children(self) -> dict[str | None, list[NodeRow]]:
        kids: dict[str | None, list[NodeRow]] = {}
        for row in self._rows:
            kids.setdefault(row.parent_id, []).append(row)
        return kids

    @cached_property
    def _statuses(self) -> dict[str, str]:
        if self._text is None:
            return {sid: meta.status for sid, meta in self.sessions.items()}
        return {sid: row[_STATUS] for sid, row in self._shown.items()}

    def _model(self, row: NodeRow) -> TopologyNode:
        """The node of `row`: the one in `nodes` once they are built (always, for a
        `Topology` made of models), else one built for the call."""
        if self._text is None or "nodes" in self.__dict__:
            return self._by_id[row.id]
        return self._node_of(row)

    def _node_of(self, row: NodeRow) -> TopologyNode:
        from stello_graph.checkpoints._rows import stored_node

        node = stored_node(row)
        damage = self.__dict__.get("_node_damage")
        if damage and row.id in damage:
            return node.model_copy(update={"damaged": damage[row.id]})
        return node

    @cached_property
    def _by_id(self) -> dict[str, TopologyNode]:
        return {n.id: n for n in self.nodes}

    # -- the parts, built on first access -------------------------------------------------
    @cached_property
    def nodes(self) -> tuple[TopologyNode, ...]:
        """Every node, parents before children, siblings in creation order."""
        from stello_graph.checkpoints._rows import built

        return tuple(built(self._node_of, self._rows))

    @cached_property
    def sessions(self) -> Mapping[str, SessionMeta]:
        """The meta of each node's session, by id (in `nodes`' order)."""
        return _Metas(self._rows, self._shown)

    @cached_property
    def turns(self) -> Mapping[str, int]:
        """The number of user turns of each node's session, by id."""
        return {sid: row[_TURNS] for sid, row in self._shown.items()}

    @cached_property
    def lineage(self) -> Mapping[str, ForkPoint]:
        """The fork point of each forked session, by id (`StelloAgent.lineage`)."""
        forks = [row for row in self._session_rows.values() if row[_FORKED_FROM] is not None]
        forks.sort(key=itemgetter(_SEQ))  # in creation order, as `list_lineage` gives them
        return {row[0]: ForkPoint(row[0], row[_FORKED_FROM], row[_FORKED_AT]) for row in forks}

    # -- views ----------------------------------------------------------------------------
    @property
    def root(self) -> TopologyNode | None:
        """The root node (the main session), if the tree has one."""
        row = next((row for row in self._rows if row.parent_id is None), None)
        return None if row is None else self._model(row)

    def node(self, node_id: str) -> TopologyNode | None:
        row = self._row_by_id.get(node_id)
        return None if row is None else self._model(row)

    def children(self, node_id: str) -> list[TopologyNode]:
        """Direct children of a node, in creation order."""
        return [self._model(row) for row in self._children.get(node_id, ())]

    def depth(self, node_id: str) -> int:
        """0 for the root, 1 for its children, ..."""
        rows = self._row_by_id
        depth, current = 0, rows.get(node_id)
        while current is not None and current.parent_id is not None:
            depth, current = depth + 1, rows.get(current.parent_id)
        return depth

    def __iter__(self) -> Iterator[TopologyNode]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self._rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self._parts() == other._parts()

    __hash__ = None  # type: ignore[assignment]

    @cached_property
    def damaged(self) -> Mapping[str, tuple[str, ...]]:
        """The sessions of a damaged tree, by id: the columns of each that do not decode (a
        label, tags, metadata, a role or status; see `DamagedDataError`), shown with
        stand-ins in `nodes` and `sessions`, and `parent_id` for a node detached from a
        cycle of parents (shown as a root after the tree). Empty for a sound tree."""
        rows = self._rows
        found: dict[str, tuple[str, ...]] = dict(self.__dict__.get("_node_damage", {}))
        if self._text is None:
            found.update((node.id, node.damaged) for node in self.nodes if node.damaged)
            metas = {sid: meta.damaged for sid, meta in self.sessions.items() if meta.damaged}
        else:
            metas = {sid: bad for sid, row in self._shown.items() if (bad := row_damage(row))}
        for sid, columns in metas.items():
            found[sid] = tuple(dict.fromkeys((*found.get(sid, ()), *columns)))
        return {row.id: found[row.id] for row in rows if row.id in found} if found else {}

    def render_text(self) -> str:
        """The tree as indented text, one session per line (damaged ones marked)."""
        archived = {sid for sid, status in self._statuses.items() if status == "archived"}
        return tree_text(self._rows, archived, self.lineage, self.damaged)

    def __str__(self) -> str:
        return self.render_text()

    def __repr__(self) -> str:
        # Short on purpose: notebooks compute it for every displayed tree, whatever its size.
        root = self.root
        archived = sum(status == "archived" for status in self._statuses.values())
        label = repr(root.label) if root is not None else "none"
        return f"<Topology: {len(self)} sessions, {archived} archived, root {label}>"

    def render_svg(self, **options: Any) -> str:
        """The star map of the tree, as standalone SVG (see `starmap.render_topology`)."""
        from stello_graph.starmap import render_topology

        return render_topology(self, **options)

    def _repr_svg_(self) -> str:
        """Jupyter shows a `Topology` as its star map."""
        return self.render_svg()

    def _meta_fields(self) -> dict[str, tuple[str, str, str]]:
        """`(role, status, updated_at as ISO 8601)` of each node's session."""
        if self._text is None:
            return {sid: _meta_fields(meta) for sid, meta in self.sessions.items()}
        from stello_graph.checkpoints._serde import from_iso

        damaged = self.damaged
        return {
            sid: (
                (row[_ROLE], row[_STATUS], from_iso(row[_UPDATED]).isoformat())
                if sid not in damaged
                else _meta_fields(self.sessions[sid])  # its stand-ins
            )
            for sid, row in self._shown.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form: nodes with their session's label, role, status, turns,
        lineage (`forked_from`, `forked_at_turn`) and last change (ISO 8601)."""
        fields, turns, lineage = self._meta_fields(), self.turns, self.lineage
        damaged = self.damaged
        out: list[dict[str, Any]] = []
        for node in self._rows:
            role, status, updated_at = fields.get(node.id, (None, None, None))
            point = lineage.get(node.id)
            entry: dict[str, Any] = {
                "id": node.id,
                "parent_id": node.parent_id,
                "label": node.label,
                "role": role,
                "status": status,
                "turns": turns.get(node.id, 0),
                "forked_from": point.source_id if point else None,
                "forked_at_turn": point.at_turn if point else None,
                "updated_at": updated_at,
            }
            if node.id in damaged:
                entry["damaged"] = list(damaged[node.id])
            out.append(entry)
        return {"nodes": out}


def _read_flow() -> Flow[Topology]:
    """`Topology.read`: the tree as one text where the backend gives it, else in parts."""
    text: TopologyText | None = yield Storage(MainStorage.topology_text)
    if text is not None:
        return Topology.of_text(text)
    nodes, metas, lineage, counts = yield Storage(MainStorage.topology_parts)
    by_id: dict[str, SessionMeta] = {meta.id: meta for meta in metas}
    sessions = {node.id: by_id[node.id] for node in nodes if node.id in by_id}
    return Topology(nodes, sessions, {sid: counts.get(sid, 0) for sid in sessions}, lineage)
