"""The schema of a new stello SQLite database as plain SQL, written without sqlite-utils.

The migrations (`_schema.MIGRATIONS`) are the schema's history and bring any older file up to
date through sqlite-utils. A file that has no stello schema yet needs none of that history:
`_schema.migrate` runs `STATEMENTS` instead, the text the migrations leave in `sqlite_master`,
copied exactly, so a file made either way has the same schema byte for byte, and a new file's
process never imports sqlite-utils.

`tests/storage/test_fresh_schema.py` checks that `STATEMENTS` is what the migrations make;
after a migration is added, regenerate this file with
`python -m tests.storage.test_fresh_schema`.
"""

from __future__ import annotations

__all__ = ["STATEMENTS", "VERSION"]

VERSION = 11
"""The schema version `STATEMENTS` creates."""

# fmt: off
STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE "stello_changes" (
   "tree_id" TEXT PRIMARY KEY NOT NULL,
   "version" INTEGER NOT NULL
)""",
    """CREATE TABLE "stello_events" (
   "tree_id" TEXT NOT NULL,
   "cursor" INTEGER NOT NULL,
   "kind" TEXT NOT NULL,
   "session_id" TEXT,
   "payload" TEXT NOT NULL,
   "at" TEXT NOT NULL,
   PRIMARY KEY ("tree_id", "cursor")
)""",
    """CREATE TABLE "stello_globals" (
   "tree_id" TEXT NOT NULL,
   "key" TEXT NOT NULL,
   "value" TEXT NOT NULL,
   PRIMARY KEY ("tree_id", "key")
)""",
    """CREATE TABLE "stello_nodes" (
   "tree_id" TEXT NOT NULL,
   "id" TEXT NOT NULL,
   "parent_id" TEXT,
   "label" TEXT NOT NULL,
   "position" INTEGER NOT NULL,
   FOREIGN KEY ("tree_id", "id") REFERENCES "stello_sessions"("tree_id", "id") ON DELETE CASCADE,
   FOREIGN KEY ("tree_id", "parent_id") REFERENCES "stello_nodes"("tree_id", "id"),
   PRIMARY KEY ("tree_id", "id")
)""",
    """CREATE TABLE stello_record_rows (
            l3_key INTEGER NOT NULL REFERENCES stello_sessions (l3_key) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at TEXT NOT NULL,
            turn_id TEXT,
            turn_seq INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (l3_key, seq))""",
    """CREATE TABLE "stello_schema" (
   "version" INTEGER PRIMARY KEY,
   "applied_at" TEXT
)""",
    """CREATE TABLE "stello_sessions" (
   "tree_id" TEXT NOT NULL,
   "id" TEXT NOT NULL,
   "label" TEXT NOT NULL,
   "role" TEXT NOT NULL,
   "status" TEXT NOT NULL,
   "tags" TEXT NOT NULL DEFAULT '[]',
   "metadata" TEXT NOT NULL DEFAULT '{}',
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "created_seq" INTEGER NOT NULL,
   "system_prompt" TEXT,
   "insight" TEXT,
   "memory" TEXT,
   "memory_through" INTEGER NOT NULL DEFAULT 0,
   "turn_count" INTEGER NOT NULL DEFAULT 0,
   "next_seq" INTEGER NOT NULL DEFAULT 0, "subtree_synthesis" TEXT, "compression" TEXT, "compression_through" INTEGER NOT NULL DEFAULT 0, "settings" TEXT NOT NULL DEFAULT '{}', "lease_owner" TEXT, "lease_token" INTEGER NOT NULL DEFAULT 0, "lease_expires" REAL NOT NULL DEFAULT 0.0, "lease_waiter" TEXT, "lease_wait_until" REAL NOT NULL DEFAULT 0.0, "forked_from" TEXT, "forked_at_turn" INTEGER, base_id TEXT, base_count INTEGER NOT NULL DEFAULT 0, l3_key INTEGER, node_parent TEXT,
   PRIMARY KEY ("tree_id", "id")
)""",
    """CREATE INDEX "stello_nodes_children"
    ON "stello_nodes" ("tree_id", "parent_id", "position")""",
    """CREATE UNIQUE INDEX "stello_nodes_order"
    ON "stello_nodes" ("tree_id", "position")""",
    """CREATE INDEX stello_records_turns ON stello_record_rows (turn_id) WHERE turn_id IS NOT NULL""",
    """CREATE INDEX stello_sessions_bases ON stello_sessions (tree_id, base_id) WHERE base_id IS NOT NULL""",
    """CREATE INDEX "stello_sessions_by_kind"
    ON "stello_sessions" ("tree_id", "role", "status", "created_seq")""",
    """CREATE UNIQUE INDEX stello_sessions_l3 ON stello_sessions (l3_key)""",
    """CREATE UNIQUE INDEX "stello_sessions_order"
    ON "stello_sessions" ("tree_id", "created_seq")""",
    """CREATE TRIGGER stello_nodes_delete AFTER DELETE ON stello_nodes
        BEGIN UPDATE stello_sessions SET node_parent = NULL
            WHERE tree_id = OLD.tree_id AND id = OLD.id; END""",
    """CREATE TRIGGER stello_nodes_insert AFTER INSERT ON stello_nodes
        BEGIN UPDATE stello_sessions SET node_parent = NEW.parent_id
            WHERE tree_id = NEW.tree_id AND id = NEW.id; END""",
    """CREATE TRIGGER stello_nodes_parent AFTER UPDATE OF parent_id ON stello_nodes
        WHEN NEW.parent_id IS NOT OLD.parent_id BEGIN UPDATE stello_sessions SET node_parent = NEW.parent_id
            WHERE tree_id = NEW.tree_id AND id = NEW.id; END""",
    """CREATE TRIGGER stello_record_rows_delete AFTER DELETE ON stello_record_rows
            BEGIN INSERT INTO stello_changes (tree_id, version)
        SELECT tree_id, 1 FROM stello_sessions WHERE l3_key = OLD.l3_key
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; END""",
    """CREATE TRIGGER stello_record_rows_insert AFTER INSERT ON stello_record_rows
            BEGIN INSERT INTO stello_changes (tree_id, version)
        SELECT tree_id, 1 FROM stello_sessions WHERE l3_key = NEW.l3_key
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; END""",
    """CREATE TRIGGER stello_record_rows_update AFTER UPDATE ON stello_record_rows
            BEGIN INSERT INTO stello_changes (tree_id, version)
        SELECT tree_id, 1 FROM stello_sessions WHERE l3_key = OLD.l3_key
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; INSERT INTO stello_changes (tree_id, version)
        SELECT tree_id, 1 FROM stello_sessions WHERE l3_key = NEW.l3_key
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; END""",
    """CREATE VIEW stello_records AS
        SELECT s.tree_id AS tree_id, s.id AS session_id, r.seq AS seq,
            r.type AS type, r.data AS data, r.created_at AS created_at, r.turn_id AS turn_id, r.turn_seq AS turn_seq
        FROM stello_record_rows r JOIN stello_sessions s ON s.l3_key = r.l3_key""",
    """CREATE TRIGGER stello_records_delete INSTEAD OF DELETE ON stello_records BEGIN
        DELETE FROM stello_record_rows WHERE l3_key = (SELECT l3_key FROM stello_sessions WHERE tree_id = OLD.tree_id AND id = OLD.session_id) AND seq = OLD.seq; END""",
    """CREATE TRIGGER stello_records_insert INSTEAD OF INSERT ON stello_records BEGIN
        INSERT INTO stello_record_rows (l3_key, seq, type, data, created_at, turn_id, turn_seq)
        VALUES ((SELECT l3_key FROM stello_sessions WHERE tree_id = NEW.tree_id AND id = NEW.session_id), NEW.seq, NEW.type, NEW.data, NEW.created_at, NEW.turn_id, COALESCE(NEW.turn_seq, 0)); END""",
    """CREATE TRIGGER stello_records_update INSTEAD OF UPDATE ON stello_records BEGIN
        UPDATE stello_record_rows SET seq = NEW.seq, type = NEW.type, data = NEW.data, created_at = NEW.created_at, turn_id = NEW.turn_id, turn_seq = NEW.turn_seq WHERE l3_key = (SELECT l3_key FROM stello_sessions WHERE tree_id = OLD.tree_id AND id = OLD.session_id) AND seq = OLD.seq; END""",
    """CREATE TRIGGER stello_sessions_base AFTER UPDATE OF base_id, base_count
        ON stello_sessions BEGIN INSERT INTO stello_changes (tree_id, version) VALUES (NEW.tree_id, 1)
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; END""",
    """CREATE TRIGGER stello_sessions_delete AFTER DELETE ON stello_sessions
        BEGIN INSERT INTO stello_changes (tree_id, version) VALUES (OLD.tree_id, 1)
        ON CONFLICT (tree_id) DO UPDATE SET version = version + 1; DELETE FROM stello_record_rows WHERE l3_key = OLD.l3_key; END""",
)
# fmt: on
