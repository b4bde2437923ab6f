"""The PostgreSQL schema of `PostgresMainStorage` and its migrations.

The tables are those of the SQLite schema (`_schema`), in the connection's current schema
(the first of its `search_path`), each scoped by `tree_id`:

* `stello_sessions` - one row per session: meta, every per-session field of `FIELDS`
  (prompt, insight, memory and cursors, turn count, synthesis, compression, settings, the
  lease, the fork lineage `forked_from` / `forked_at_turn`), `created_seq` (creation order in
  the tree), `next_seq` (the seq of the session's next record: seqs are never reused) and
  `records_stamp`, a new value of the sequence `stello_record_stamps` at every change to the
  session's records: a storage keeps decoded records while the stamp it read is still there
  (sequences are not rolled back, so a stamp is never seen twice, across processes too).
  Version 2 adds the shared L3 prefix of forks: `base_id` (the session whose first
  `base_count` records start this session's L3, `NULL` for none) and `base_count`, with a
  partial index on `(tree_id, base_id)`; see `_shared_l3`.
* `stello_records` - L3, one row per record, keyed and ordered by `(tree_id, session_id,
  seq)`, with the turn that wrote it (`turn_id` on the first record of each run of a turn,
  `turn_seq`) and a partial index on `turn_id`.
* `stello_nodes` - the topology; `position` is the creation order in the tree.
* `stello_globals` - the tree's key-value store (JSON text).
* `stello_events` - the stored event log: per tree, a cursor that only grows.
* `stello_schema` - the applied migrations, one row per version.

Migrations run in one transaction holding a transaction-level advisory lock (`MIGRATION_LOCK`),
and the version is read again under it: two processes opening one database at once apply
each migration once. To change the schema, append a migration; never edit a released one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from stello_graph.checkpoints._postgres_conn import Link, Query
from stello_graph.checkpoints._schema import check_version, listing
from stello_graph.errors import ForeignDatabaseError
from stello_graph.models import utcnow

__all__ = [
    "CHECKPOINT_TABLES",
    "EVENTS",
    "GLOBALS",
    "MIGRATIONS",
    "MIGRATION_LOCK",
    "NODES",
    "RECORDS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SESSIONS",
    "STAMPS",
]

SESSIONS = "stello_sessions"
RECORDS = "stello_records"
NODES = "stello_nodes"
GLOBALS = "stello_globals"
EVENTS = "stello_events"
SCHEMA = "stello_schema"
STAMPS = "stello_record_stamps"

CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
"""The tables of LangGraph's `PostgresSaver` that hold a thread's rows (each has `thread_id`):
removing a session deletes its turn threads' rows from those the database has."""

MIGRATION_LOCK = 0x5374_656C_6C6F_0001
"""The advisory lock key held while migrating ("Stello" and 1; a signed 64-bit integer)."""

_V1 = (
    f"""CREATE TABLE {SESSIONS} (
        tree_id text NOT NULL,
        id text NOT NULL,
        label text NOT NULL,
        role text NOT NULL,
        status text NOT NULL,
        tags text NOT NULL DEFAULT '[]',
        metadata text NOT NULL DEFAULT '{{}}',
        created_at text NOT NULL,
        updated_at text NOT NULL,
        created_seq bigint NOT NULL,
        next_seq bigint NOT NULL DEFAULT 0,
        system_prompt text,
        insight text,
        memory text,
        memory_through integer NOT NULL DEFAULT 0,
        turn_count integer NOT NULL DEFAULT 0,
        subtree_synthesis text,
        compression text,
        compression_through integer NOT NULL DEFAULT 0,
        settings text NOT NULL DEFAULT '{{}}',
        lease_owner text,
        lease_token bigint NOT NULL DEFAULT 0,
        lease_expires double precision NOT NULL DEFAULT 0,
        lease_waiter text,
        lease_wait_until double precision NOT NULL DEFAULT 0,
        forked_from text,
        forked_at_turn integer,
        records_stamp bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (tree_id, id)
    )""",
    f"CREATE SEQUENCE {STAMPS}",
    f"CREATE UNIQUE INDEX stello_sessions_order ON {SESSIONS} (tree_id, created_seq)",
    # get_all_session_l2s / list_sessions(role=, status=): one range scan, already ordered
    f"CREATE INDEX stello_sessions_by_kind ON {SESSIONS} (tree_id, role, status, created_seq)",
    f"""CREATE TABLE {RECORDS} (
        tree_id text NOT NULL,
        session_id text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        data text NOT NULL,
        created_at text NOT NULL,
        turn_id text,
        turn_seq integer NOT NULL DEFAULT 0,
        PRIMARY KEY (tree_id, session_id, seq),
        FOREIGN KEY (tree_id, session_id) REFERENCES {SESSIONS} (tree_id, id)
            ON DELETE CASCADE
    )""",
    f"""CREATE INDEX stello_records_turns ON {RECORDS} (tree_id, session_id, turn_id)
        WHERE turn_id IS NOT NULL""",
    f"""CREATE TABLE {NODES} (
        tree_id text NOT NULL,
        id text NOT NULL,
        parent_id text,
        label text NOT NULL,
        position bigint NOT NULL,
        PRIMARY KEY (tree_id, id),
        FOREIGN KEY (tree_id, id) REFERENCES {SESSIONS} (tree_id, id) ON DELETE CASCADE,
        FOREIGN KEY (tree_id, parent_id) REFERENCES {NODES} (tree_id, id)
    )""",
    f"CREATE INDEX stello_nodes_children ON {NODES} (tree_id, parent_id, position)",
    f"CREATE UNIQUE INDEX stello_nodes_order ON {NODES} (tree_id, position)",
    f"""CREATE TABLE {GLOBALS} (
        tree_id text NOT NULL,
        key text NOT NULL,
        value text NOT NULL,
        PRIMARY KEY (tree_id, key)
    )""",
    f"""CREATE TABLE {EVENTS} (
        tree_id text NOT NULL,
        cursor bigint NOT NULL,
        kind text NOT NULL,
        session_id text,
        payload text NOT NULL,
        at text NOT NULL,
        PRIMARY KEY (tree_id, cursor)
    )""",
)

_V2 = (
    # The shared L3 prefix of forks (`_shared_l3`): existing forks keep their copied rows.
    f"ALTER TABLE {SESSIONS} ADD COLUMN base_id text",
    f"ALTER TABLE {SESSIONS} ADD COLUMN base_count integer NOT NULL DEFAULT 0",
    f"""CREATE INDEX stello_sessions_bases ON {SESSIONS} (tree_id, base_id)
        WHERE base_id IS NOT NULL""",
)

MIGRATIONS: tuple[Sequence[str], ...] = (_V1, _V2)
"""`MIGRATIONS[n - 1]`: the statements that bring a database from version `n - 1` to `n`."""
SCHEMA_VERSION = len(MIGRATIONS)

CREATE_SCHEMA_TABLE = f"""CREATE TABLE IF NOT EXISTS {SCHEMA} (
    version integer PRIMARY KEY, applied_at text NOT NULL)"""

STELLO_TABLES = "SELECT table_name FROM information_schema.tables " + (
    "WHERE table_schema = current_schema() AND table_name LIKE 'stello\\_%' ORDER BY table_name"
)
"""The tables named like stello's in the connection's current schema."""

SCHEMA_COLUMNS = (
    "SELECT column_name FROM information_schema.columns "
    f"WHERE table_schema = current_schema() AND table_name = '{SCHEMA}' ORDER BY column_name"
)

_RECORD_VERSION = f"INSERT INTO {SCHEMA} (version, applied_at) VALUES (%s, %s)"


def _foreign(where: str, tables: Sequence[str]) -> ForeignDatabaseError:
    return ForeignDatabaseError(
        f"The database {where} holds tables named like stello-graph's ({listing(tables)}) that "
        "stello-graph did not make (another application's), so stello-graph left the "
        "database untouched. Name another database, or another schema through the "
        "connection's search_path (options='-c search_path=...')."
    )


def migrate(link: Link) -> None:
    """Check the database is stello's (or free of it), then bring its schema up to date in
    one transaction under the migration lock (read again under it: another process may have
    migrated meanwhile)."""
    conn = link.acquire()
    try:
        if _read_version(link, conn) == SCHEMA_VERSION:
            return
        link.run(conn, Query(f"BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        try:
            version = _read_version(link, conn)
            if version < SCHEMA_VERSION:
                link.run(conn, Query(CREATE_SCHEMA_TABLE))
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for sql in MIGRATIONS[target - 1]:
                    link.run(conn, Query(sql))
                link.run(conn, Query(_RECORD_VERSION, (target, utcnow().isoformat())))
            link.run(conn, Query("COMMIT"))
        except BaseException:
            if not (conn.broken or conn.closed):
                conn.execute("ROLLBACK")
            raise
    finally:
        link.release(conn)


def _read_version(link: Link, conn: psycopg.Connection[Any]) -> int:
    """The schema version, once the database is known to be stello's (or empty of it).

    Raises:
        ForeignDatabaseError: tables with stello's names that stello did not make (no
            `stello_schema`, or one of another shape).
        SchemaVersionError: the schema is newer than this stello-graph knows.
    """
    tables = [row[0] for row in link.run(conn, Query(STELLO_TABLES)).rows]
    columns = [row[0] for row in link.run(conn, Query(SCHEMA_COLUMNS)).rows]
    if SCHEMA not in tables:
        if tables:
            raise _foreign(link.where, tables)
        return 0
    if sorted(columns) != ["applied_at", "version"]:
        raise _foreign(link.where, tables)
    version: int = link.run(conn, Query(f"SELECT MAX(version) FROM {SCHEMA}")).rows[0][0] or 0
    check_version(version, link.where, SCHEMA_VERSION)
    return version
