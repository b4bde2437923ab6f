"""The SQLite schema of `SqliteMainStorage` and its migrations.

Every table is prefixed `stello_` (the file is often shared with a LangGraph checkpointer and
the application's own tables) and scoped by `tree_id`. The applied migrations are listed in
`stello_schema` (one row per version); `MIGRATIONS[n - 1]` brings a database from version
`n - 1` to `n`. To change the schema, append a migration: never edit one that was released.

Tables (version 1):

* `stello_sessions` - one row per session: meta, system prompt, insight, memory (L2 or
  synthesis) and its cursor, the user-turn count, `created_seq` (creation order within the
  tree) and `next_seq` (the seq of the next record, so seqs are never reused after a trim).
* `stello_records` - L3, one row per message, keyed by `(tree_id, session_id, seq)`.
* `stello_nodes` - the topology; `position` is the creation order within the tree.
* `stello_globals` - the tree's key-value store (JSON values).

Version 2 adds to `stello_sessions`: `subtree_synthesis` (what tree integration made of a
node's children), `compression` / `compression_through` (the summary that replaces the oldest
records in prompts, and how many records it covers) and `settings` (JSON: skills allow-list,
fork bookkeeping).

Version 3:

* `stello_changes` - per tree, a counter of changes to its L3 records, kept by triggers on
  `stello_records`. A connection caches decoded records; when another connection commits to
  the file (a LangGraph checkpointer on the same file does at every step), the counter tells
  whether the cache is still exact, instead of dropping it.

Version 4 adds to `stello_sessions` the session lease of turns (`stello_graph.lease`):
`lease_owner` (`NULL` when free), `lease_token` (the fencing token, which only grows) and
`lease_expires` (seconds since the epoch), and the turn waiting longest for it
(`lease_waiter` until `lease_wait_until`), which gets it next. Kept in the session's row,
it goes with it.

Version 5 adds to `stello_records` the turn that wrote each record: `turn_id` (one id per
committed turn, stored only on the first record of each run of one turn: later ones inherit
it, which keeps L3 small) and `turn_seq` (the record's position in its turn, from 0), with a
partial index on `turn_id` (one entry per turn) for the commit's idempotency check. Records
written before version 5 get turn ids derived by user turn: a turn starts at a user message
and takes its id (or, without one, an id derived from the record's place).

Version 6 adds to `stello_sessions` the lineage of forked sessions: `forked_from` (the
source session's id, `NULL` for a session that was not forked; not a foreign key, since the
lineage outlives a removed source) and `forked_at_turn` (the source's 1-based user turn the
child's context ends at, or `NULL`).

Version 7:

* `stello_events` - the tree's event log (forks, consolidations, integrations, insights,
  background failures), append-only, keyed (and so indexed) by `(tree_id, cursor)`: the
  cursor only grows within a tree, and a reader in any process follows the log with one
  range scan from the last cursor it saw. Not tied to sessions: a removed session's events
  stay in the log.

Version 8 adds to `stello_sessions` the shared L3 prefix of forks (`_shared_l3`): `base_id`
(the session whose first `base_count` records start this session's L3, `NULL` for none; not a
foreign key: the rows are kept alive by materialising the child before the source trims or
is deleted) and `base_count`, with a partial index on `(tree_id, base_id)` (the children that
depend on a session) and a trigger that counts a change of either as a change of L3. Forks
made before version 8 keep their copied rows and no base.

Version 9 keys the partial index on `stello_records.turn_id` by the turn id alone (it
repeated the tree and session ids in every entry): the same lookups, in about 40% of the
space.

Version 10 keys the records by a compact session key instead of the two ids:

* `stello_sessions.l3_key` - an integer, unique in the file, that names the session's L3 rows
  (assigned when the session is created, never reused while the row lives);
* `stello_record_rows` - the records, keyed by `(l3_key, seq)`, with the turn-id index; a
  session's deletion cascades to them;
* `stello_records` - now a view over the two with the columns the table had (`tree_id`,
  `session_id`, `seq`, `type`, `data`, `created_at`, `turn_id`, `turn_seq`), so a statement
  written for the table reads the same records. Its `INSTEAD OF` triggers write plain
  `INSERT`, `UPDATE` and `DELETE` through to `stello_record_rows` (their `rowcount` is 0, an
  upsert is refused, and an update cannot move a record to another session).

Each record no longer repeats two 36-character ids in its row and again in the primary-key
index (~150 bytes of a short turn's ~400). `stello_changes` is kept by triggers on
`stello_record_rows` and, for the records a deleted session takes with it, on
`stello_sessions`. The migration copies every record once: the old table's pages stay in
the file as free pages (new records reuse them; `VACUUM` returns them), and records whose
session was gone (left by a deletion without foreign keys, never read) are not copied.

Version 11 adds to `stello_sessions` a copy of its topology node's parent: `node_parent`
(`NULL` for a session without a node, or one whose node has none). `stello_nodes` stays the
tree; triggers on it write the copy in the same statement as the node (a node inserted, its
parent changed, the node removed), whoever writes it, so it cannot drift. A whole-tree read
of the sessions with their parents (`agent.digests()`) then reads one table, without a
lookup in the nodes' index per session (a sixth of the read at 100,000 sessions).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from stello_graph.errors import ForeignDatabaseError, SchemaVersionError

if TYPE_CHECKING:  # sqlite-utils is loaded only when a migration runs
    from sqlite_utils import Database
    from sqlite_utils.db import ForeignKey

__all__ = [
    "CHANGES",
    "EVENTS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "check_not_foreign",
    "check_version",
    "listing",
    "migrate",
    "read_version",
]

SESSIONS = "stello_sessions"
RECORDS = "stello_records"
ROWS = "stello_record_rows"
NODES = "stello_nodes"
GLOBALS = "stello_globals"
CHANGES = "stello_changes"
EVENTS = "stello_events"
SCHEMA = "stello_schema"

Migration = Callable[["Database"], None]
"""Changes the schema through a `sqlite_utils.Database`, inside the migration transaction."""


def _compound_fk(table: str, columns: tuple[str, str], other: str, on_delete: str) -> ForeignKey:
    from sqlite_utils.db import ForeignKey

    return ForeignKey(
        table,
        None,
        other,
        None,
        columns=columns,
        other_columns=("tree_id", "id"),
        is_compound=True,
        on_delete=on_delete,
    )


def _v1_initial(db: Database) -> None:
    db.table(SESSIONS).create(
        {
            "tree_id": str,
            "id": str,
            "label": str,
            "role": str,
            "status": str,
            "tags": str,
            "metadata": str,
            "created_at": str,
            "updated_at": str,
            "created_seq": int,
            "system_prompt": str,
            "insight": str,
            "memory": str,
            "memory_through": int,
            "turn_count": int,
            "next_seq": int,
        },
        pk=("tree_id", "id"),
        not_null={
            *("tree_id", "id", "label", "role", "status", "tags", "metadata"),
            *("created_at", "updated_at", "created_seq"),
            *("memory_through", "turn_count", "next_seq"),
        },
        defaults={
            "tags": "[]",
            "metadata": "{}",
            "memory_through": 0,
            "turn_count": 0,
            "next_seq": 0,
        },
    )
    sessions = db.table(SESSIONS)
    sessions.create_index(["tree_id", "created_seq"], "stello_sessions_order", unique=True)
    # get_all_session_l2s / list_sessions(role=, status=): one range scan, already ordered.
    sessions.create_index(["tree_id", "role", "status", "created_seq"], "stello_sessions_by_kind")
    db.table(RECORDS).create(
        {
            "tree_id": str,
            "session_id": str,
            "seq": int,
            "type": str,
            "data": str,
            "created_at": str,
        },
        pk=("tree_id", "session_id", "seq"),
        not_null={"tree_id", "session_id", "seq", "type", "data", "created_at"},
        foreign_keys=[_compound_fk(RECORDS, ("tree_id", "session_id"), SESSIONS, "CASCADE")],
    )
    db.table(NODES).create(
        {"tree_id": str, "id": str, "parent_id": str, "label": str, "position": int},
        pk=("tree_id", "id"),
        not_null={"tree_id", "id", "label", "position"},
        foreign_keys=[
            _compound_fk(NODES, ("tree_id", "id"), SESSIONS, "CASCADE"),
            _compound_fk(NODES, ("tree_id", "parent_id"), NODES, "NO ACTION"),
        ],
    )
    db.table(NODES).create_index(["tree_id", "parent_id", "position"], "stello_nodes_children")
    db.table(NODES).create_index(["tree_id", "position"], "stello_nodes_order", unique=True)
    db.table(GLOBALS).create(
        {"tree_id": str, "key": str, "value": str},
        pk=("tree_id", "key"),
        not_null={"tree_id", "key", "value"},
    )


def _v2_tree_memory(db: Database) -> None:
    """Per-session state of the orchestration: a subtree's synthesis (tree integration), the
    persisted context-compression summary with the records it covers, and settings (skills
    allow-list, fork bookkeeping)."""
    sessions = db.table(SESSIONS)
    sessions.add_column("subtree_synthesis", str)
    sessions.add_column("compression", str)
    sessions.add_column("compression_through", int, not_null_default=0)
    sessions.add_column("settings", str, not_null_default="{}")


def _bump(row: str) -> str:
    return f"""INSERT INTO {CHANGES} (tree_id, version) VALUES ({row}.tree_id, 1)
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1;"""


def _change_triggers(db: Database, table: str, bump: Callable[[str], str]) -> None:
    """The triggers that count every insert, delete and update of `table`'s rows in
    `stello_changes` (`bump(row)`: the statement for the `NEW` or `OLD` row)."""
    for event, rows in (("insert", ("NEW",)), ("delete", ("OLD",)), ("update", ("OLD", "NEW"))):
        db.execute(
            f"""CREATE TRIGGER {table}_{event} AFTER {event.upper()} ON {table}
            BEGIN {" ".join(bump(row) for row in rows)} END"""
        )


def _v3_record_changes(db: Database) -> None:
    db.table(CHANGES).create(
        {"tree_id": str, "version": int}, pk="tree_id", not_null={"tree_id", "version"}
    )
    # Foreign-key cascades (a session deleted with its records) fire the DELETE trigger too.
    _change_triggers(db, RECORDS, _bump)


def _v4_session_lease(db: Database) -> None:
    sessions = db.table(SESSIONS)
    sessions.add_column("lease_owner", str)
    sessions.add_column("lease_token", int, not_null_default=0)
    sessions.add_column("lease_expires", float, not_null_default=0.0)
    sessions.add_column("lease_waiter", str)
    sessions.add_column("lease_wait_until", float, not_null_default=0.0)


def _derived_turns(db: Database) -> Iterator[tuple[str | None, int, str, str, int]]:
    """`(turn_id or None, turn_seq, tree, session, seq)` of every record written before
    turn ids: a user message starts a turn (its id is the turn's); records before a
    session's first user message form one turn."""
    from stello_graph.checkpoints._serde import stored_id  # pydantic: only for a migration

    rows = db.execute(
        f"SELECT tree_id, session_id, seq, type, data FROM {RECORDS} "
        "ORDER BY tree_id, session_id, seq"
    )
    where: tuple[str, str] | None = None
    turn_seq = 0
    for tree, session, seq, role, data in rows:
        starts = (tree, session) != where or role == "human"
        if not starts:
            turn_seq += 1
            yield None, turn_seq, tree, session, seq
            continue
        where, turn_seq = (tree, session), 0
        found = stored_id(data) if role == "human" else None
        place = f"stello-record/{tree}/{session}/{seq}"
        yield found or str(uuid.uuid5(uuid.NAMESPACE_URL, place)), 0, tree, session, seq


def _v5_turn_ids(db: Database) -> None:
    records = db.table(RECORDS)
    records.add_column("turn_id", str)
    records.add_column("turn_seq", int, not_null_default=0)
    derived = list(_derived_turns(db))
    db.conn.executemany(
        f"UPDATE {RECORDS} SET turn_id = ?, turn_seq = ? "
        "WHERE tree_id = ? AND session_id = ? AND seq = ?",
        derived,
    )
    db.execute(
        f"CREATE INDEX stello_records_turns ON {RECORDS} (tree_id, session_id, turn_id) "
        "WHERE turn_id IS NOT NULL"
    )


def _v6_lineage(db: Database) -> None:
    sessions = db.table(SESSIONS)
    sessions.add_column("forked_from", str)
    sessions.add_column("forked_at_turn", int)


def _v7_events(db: Database) -> None:
    db.table(EVENTS).create(
        {
            "tree_id": str,
            "cursor": int,
            "kind": str,
            "session_id": str,
            "payload": str,
            "at": str,
        },
        pk=("tree_id", "cursor"),
        not_null={"tree_id", "cursor", "kind", "payload", "at"},
    )


def _v8_shared_prefixes(db: Database) -> None:
    # Existing forks keep their copied rows (no base): they read back as before.
    db.execute(f"ALTER TABLE {SESSIONS} ADD COLUMN base_id TEXT")
    db.execute(f"ALTER TABLE {SESSIONS} ADD COLUMN base_count INTEGER NOT NULL DEFAULT 0")
    db.execute(
        f"CREATE INDEX stello_sessions_bases ON {SESSIONS} (tree_id, base_id) "
        "WHERE base_id IS NOT NULL"
    )
    # A session's L3 changes when its prefix is set or materialised: cached records of it in
    # another connection must be checked again, as for a change of its rows.
    db.execute(
        f"""CREATE TRIGGER stello_sessions_base AFTER UPDATE OF base_id, base_count
        ON {SESSIONS} BEGIN {_bump("NEW")} END"""
    )


def _v9_turn_index(db: Database) -> None:
    # Keyed by the turn id alone: an entry no longer repeats the tree and session ids (two
    # 36-character ids of the ~110 bytes of each). The idempotency check still names the
    # session, so it finds the same rows; a turn's id is found in its own session and in
    # the forks that copied its records, so the check reads one entry per such copy.
    db.execute("DROP INDEX stello_records_turns")
    db.execute(
        f"CREATE INDEX stello_records_turns ON {RECORDS} (turn_id) WHERE turn_id IS NOT NULL"
    )


_RECORD_COLUMNS = ("type", "data", "created_at", "turn_id", "turn_seq")


def _bump_session(row: str) -> str:
    """`_bump` for a row of `stello_record_rows`: the tree is its session's."""
    return f"""INSERT INTO {CHANGES} (tree_id, version)
        SELECT tree_id, 1 FROM {SESSIONS} WHERE l3_key = {row}.l3_key
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1;"""


def _v10_record_keys(db: Database) -> None:
    # the key: a session row's rowid is unique now (it may change on VACUUM: l3_key does not)
    db.execute(f"ALTER TABLE {SESSIONS} ADD COLUMN l3_key INTEGER")
    db.execute(f"UPDATE {SESSIONS} SET l3_key = rowid")
    db.execute(f"CREATE UNIQUE INDEX stello_sessions_l3 ON {SESSIONS} (l3_key)")
    db.execute(
        f"""CREATE TABLE {ROWS} (
            l3_key INTEGER NOT NULL REFERENCES {SESSIONS} (l3_key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at TEXT NOT NULL,
            turn_id TEXT,
            turn_seq INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (l3_key, seq))"""
    )
    columns = ", ".join(_RECORD_COLUMNS)
    for event in ("insert", "update", "delete"):  # their bumps would count every row moved
        db.execute(f"DROP TRIGGER stello_records_{event}")
    db.execute(
        f"""INSERT INTO {ROWS} (l3_key, seq, {columns})
        SELECT s.l3_key, r.seq, {", ".join(f"r.{name}" for name in _RECORD_COLUMNS)}
        FROM {RECORDS} r JOIN {SESSIONS} s ON s.tree_id = r.tree_id AND s.id = r.session_id
        ORDER BY s.l3_key, r.seq"""
    )
    db.execute(f"DROP TABLE {RECORDS}")  # with its indexes
    db.execute(f"CREATE INDEX stello_records_turns ON {ROWS} (turn_id) WHERE turn_id IS NOT NULL")
    _change_triggers(db, ROWS, _bump_session)
    # a session's cascade removes its rows after the session row is gone, where the rows'
    # trigger finds no tree: the session's own deletion counts as the change of its L3. Its
    # rows go with it even on a connection without `foreign_keys` (the sqlite3 shell's
    # default), so a later session given its key never finds them.
    db.execute(
        f"""CREATE TRIGGER stello_sessions_delete AFTER DELETE ON {SESSIONS}
        BEGIN {_bump("OLD")} DELETE FROM {ROWS} WHERE l3_key = OLD.l3_key; END"""
    )
    db.execute(
        f"""CREATE VIEW {RECORDS} AS
        SELECT s.tree_id AS tree_id, s.id AS session_id, r.seq AS seq,
            {", ".join(f"r.{name} AS {name}" for name in _RECORD_COLUMNS)}
        FROM {ROWS} r JOIN {SESSIONS} s ON s.l3_key = r.l3_key"""
    )
    key = f"(SELECT l3_key FROM {SESSIONS} WHERE tree_id = {{row}}.tree_id"
    key += " AND id = {row}.session_id)"
    new_values = ", ".join(f"NEW.{name}" for name in _RECORD_COLUMNS[:-1])
    new_values += ", COALESCE(NEW.turn_seq, 0)"  # a view has no defaults: the table's
    sets = ", ".join(f"{name} = NEW.{name}" for name in ("seq", *_RECORD_COLUMNS))
    old_row = f"l3_key = {key.format(row='OLD')} AND seq = OLD.seq"
    db.execute(
        f"""CREATE TRIGGER stello_records_insert INSTEAD OF INSERT ON {RECORDS} BEGIN
        INSERT INTO {ROWS} (l3_key, seq, {columns})
        VALUES ({key.format(row="NEW")}, NEW.seq, {new_values}); END"""
    )
    db.execute(
        f"""CREATE TRIGGER stello_records_update INSTEAD OF UPDATE ON {RECORDS} BEGIN
        UPDATE {ROWS} SET {sets} WHERE {old_row}; END"""
    )
    db.execute(
        f"""CREATE TRIGGER stello_records_delete INSTEAD OF DELETE ON {RECORDS} BEGIN
        DELETE FROM {ROWS} WHERE {old_row}; END"""
    )


def _v11_node_parents(db: Database) -> None:
    db.execute(f"ALTER TABLE {SESSIONS} ADD COLUMN node_parent TEXT")
    db.execute(
        f"""UPDATE {SESSIONS} SET node_parent = (SELECT n.parent_id FROM {NODES} n
            WHERE n.tree_id = {SESSIONS}.tree_id AND n.id = {SESSIONS}.id)"""
    )

    def copy(parent: str, row: str) -> str:
        return f"""UPDATE {SESSIONS} SET node_parent = {parent}
            WHERE tree_id = {row}.tree_id AND id = {row}.id;"""

    db.execute(
        f"""CREATE TRIGGER stello_nodes_insert AFTER INSERT ON {NODES}
        BEGIN {copy("NEW.parent_id", "NEW")} END"""
    )
    db.execute(
        f"""CREATE TRIGGER stello_nodes_parent AFTER UPDATE OF parent_id ON {NODES}
        WHEN NEW.parent_id IS NOT OLD.parent_id BEGIN {copy("NEW.parent_id", "NEW")} END"""
    )
    # A session's deletion cascades to its node after the session's row is gone: no row.
    db.execute(
        f"""CREATE TRIGGER stello_nodes_delete AFTER DELETE ON {NODES}
        BEGIN {copy("NULL", "OLD")} END"""
    )


MIGRATIONS: tuple[Migration, ...] = (
    _v1_initial,
    _v2_tree_memory,
    _v3_record_changes,
    _v4_session_lease,
    _v5_turn_ids,
    _v6_lineage,
    _v7_events,
    _v8_shared_prefixes,
    _v9_turn_index,
    _v10_record_keys,
    _v11_node_parents,
)
SCHEMA_VERSION = len(MIGRATIONS)
_RELEASED = MIGRATIONS


def _create_fresh(conn: sqlite3.Connection) -> bool:
    """Create the schema in one step, where `_fresh_schema` holds this schema version (tests
    swap the migrations); `False`: it does not."""
    from stello_graph.checkpoints import _fresh_schema

    if MIGRATIONS is not _RELEASED or _fresh_schema.VERSION != SCHEMA_VERSION:
        return False
    for sql in _fresh_schema.STATEMENTS:
        conn.execute(sql)
    _record_versions(conn, range(1, SCHEMA_VERSION + 1))
    return True


def _apply_migrations(conn: sqlite3.Connection, version: int) -> None:
    from sqlite_utils import Database

    db = Database(conn, recursive_triggers=False, execute_plugins=False)
    db.table(SCHEMA).create({"version": int, "applied_at": str}, pk="version", ignore=True)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[target - 1](db)
        _record_versions(conn, [target])


def _record_versions(conn: sqlite3.Connection, versions: Iterable[int]) -> None:
    at = datetime.now(UTC).isoformat()
    conn.executemany(
        f"INSERT INTO {SCHEMA} (version, applied_at) VALUES (?, ?)", [(v, at) for v in versions]
    )


def read_version(conn: sqlite3.Connection) -> int:
    """The schema version of the database (0 for a database stello never wrote)."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SCHEMA,)
    ).fetchone()
    if found is None:
        return 0
    version: int = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA}").fetchone()[0]
    return version


def check_version(version: int, where: str, known: int | None = None) -> None:
    """Refuse a database written by a newer stello-graph (`known`: the newest version this
    one knows, SQLite's `SCHEMA_VERSION` by default; PostgreSQL's has its own).

    Raises:
        SchemaVersionError: `version` is newer than `known`.
    """
    known = SCHEMA_VERSION if known is None else known
    if version > known:
        raise SchemaVersionError(
            f"The database {where} has stello schema version {version}, but this version of "
            f"stello-graph only knows versions up to {known}: upgrade stello-graph."
        )


LANGGRAPH_TABLES = frozenset({"checkpoints", "writes"})
"""Tables of LangGraph's SQLite checkpointer, which stello puts on its own file: not foreign."""


def listing(names: Sequence[str]) -> str:
    """The first five `names`, quoted, then `...` for the rest, for a message."""
    return ", ".join(map(repr, names[:5])) + (", ..." if len(names) > 5 else "")


def check_not_foreign(conn: sqlite3.Connection, version: int, where: str) -> None:
    """Refuse to add stello's tables to another application's database.

    Raises:
        ForeignDatabaseError: the database has no stello schema (`version` 0) and holds
            other tables.
    """
    if version != 0:
        return
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    found = [  # neither SQLite's, stello's nor a LangGraph checkpointer's
        name
        for (name,) in rows
        if not name.startswith(("sqlite_", "stello_")) and name not in LANGGRAPH_TABLES
    ]
    if found:
        raise ForeignDatabaseError(
            f"The database {where} holds another application's tables ({listing(found)}) and no "
            "stello-graph data, so stello-graph did not add its tables to it. Name another "
            "file, or pass SqliteMainStorage(..., allow_foreign_tables=True) to share this one."
        )


def migrate(
    conn: sqlite3.Connection, where: str, *, begin: Callable[[], object], fresh: bool = True
) -> int:
    """Apply the missing migrations in one transaction; return the version reached.

    `begin` opens the write transaction (`BEGIN IMMEDIATE`, retried when busy); the version is
    read again inside it, since another process may have migrated the file meanwhile. A file
    without stello's schema gets it in one step (`_fresh_schema`, no sqlite-utils) unless
    `fresh` is false.
    """
    if read_version(conn) == SCHEMA_VERSION:
        return SCHEMA_VERSION
    begin()
    try:
        version = read_version(conn)
        check_version(version, where)
        if not (fresh and version == 0 and _create_fresh(conn)):
            _apply_migrations(conn, version)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
