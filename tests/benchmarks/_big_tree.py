"""Trees of 10,000 and 100,000 sessions in a SQLite file, built in seconds (figures 4g-4l).

The shape is figure 4's (the main session, 10 hubs, one with 1,000 children; every leaf with
one turn of 2 records of 400 characters and a 400-character L2). The storage writes the main
session, the hubs and one template leaf through its API; every other leaf is then an
`INSERT ... SELECT` copy of the template's rows (session, node, records) over a counter, in
one transaction. Writing 100,000 sessions one by one through the API takes minutes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage

from stello_graph import MainSession
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import SessionMeta, TopologyNode
from tests.benchmarks._workload import text

__all__ = ["HUBS", "build_big_tree"]

HUBS = 10


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def build_big_tree(path: Path, sessions: int, children: int) -> int:
    """Write a tree of `sessions` sessions to `path`; return the sessions written."""
    hubs = [f"hub-{h}" for h in range(HUBS)]
    with SqliteMainStorage(path) as storage:
        main = MainSession.create(storage)
        with storage.transaction():
            for sid, parent in [*((h, main.id) for h in hubs), ("leaf-0", hubs[0])]:
                storage.put_session(SessionMeta(id=sid, label=f"Topic {sid}"))
                storage.put_node(TopologyNode(id=sid, parent_id=parent, label=f"Topic {sid}"))
                turn = [HumanMessage(text(f"u-{sid}")), AIMessage(text(f"a-{sid}"))]
                storage.append_records(sid, turn, user_turn=True)
                storage.put_memory(sid, text(f"l2-{sid}"), through=2)
    copies = sessions - HUBS - 2  # the main session, the hubs and leaf-0 exist
    others = " ".join(f"WHEN {h - 1} THEN '{hub}'" for h, hub in enumerate(hubs) if h)
    counter = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)"
    conn = sqlite3.connect(path)
    try:
        with conn:
            columns = _columns(conn, "stello_sessions")
            replaced = {
                "id": "'leaf-' || g.n",
                "label": "'Topic leaf-' || g.n",
                "created_seq": "(SELECT MAX(created_seq) FROM stello_sessions) + g.n",
                "l3_key": "(SELECT MAX(l3_key) FROM stello_sessions) + g.n",
            }
            picked = ", ".join(replaced.get(c, f"t.{c}") for c in columns)
            conn.execute(
                f"""{counter} INSERT INTO stello_sessions ({", ".join(columns)})
                SELECT {picked} FROM stello_sessions t, g
                WHERE t.tree_id = 'default' AND t.id = 'leaf-0'""",
                (copies,),
            )
            conn.execute(
                f"""{counter} INSERT INTO stello_nodes (tree_id, id, parent_id, label, position)
                SELECT t.tree_id, 'leaf-' || g.n,
                    CASE WHEN g.n < ? THEN t.parent_id
                        ELSE (CASE g.n % {HUBS - 1} {others} END) END,
                    'Topic leaf-' || g.n, (SELECT MAX(position) FROM stello_nodes) + g.n
                FROM stello_nodes t, g WHERE t.tree_id = 'default' AND t.id = 'leaf-0'""",
                (copies, children),
            )
            conn.execute(
                f"""{counter} INSERT INTO stello_records
                    (tree_id, session_id, seq, type, data, created_at, turn_id, turn_seq)
                SELECT t.tree_id, 'leaf-' || g.n, t.seq, t.type, t.data, t.created_at,
                    CASE WHEN t.turn_id IS NULL THEN NULL ELSE t.turn_id || '-' || g.n END,
                    t.turn_seq
                FROM stello_records t, g
                WHERE t.tree_id = 'default' AND t.session_id = 'leaf-0'""",
                (copies,),
            )
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (count,) = conn.execute("SELECT COUNT(*) FROM stello_sessions").fetchone()
    finally:
        conn.close()
    return int(count)
