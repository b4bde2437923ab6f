"""A new SQLite file gets stello's schema in one step of plain SQL (`_fresh_schema`), the
very schema the migrations build step by step, without importing sqlite-utils."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stello_graph.checkpoints import SqliteMainStorage, _fresh_schema, _schema
from stello_graph.models import SessionMeta

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python -m tests.storage.test_fresh_schema"


def fresh_statements() -> tuple[str, ...]:
    """What the migrations leave in `sqlite_master` on an empty database (tables first,
    then indexes, then triggers, each by name): what `_fresh_schema.STATEMENTS` must be."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        begin = lambda: conn.execute("BEGIN IMMEDIATE")  # noqa: E731
        _schema.migrate(conn, ":memory:", begin=begin, fresh=False)
        rows = conn.execute(
            """SELECT sql FROM sqlite_master WHERE sql IS NOT NULL
            ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 ELSE 2 END, name"""
        )
        return tuple(sql for (sql,) in rows)
    finally:
        conn.close()


def _master(path: Path) -> list[tuple[str, str, str, str | None]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name")
        return rows.fetchall()
    finally:
        conn.close()


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [v for (v,) in conn.execute("SELECT version FROM stello_schema ORDER BY version")]
    finally:
        conn.close()


def test_the_fresh_statements_are_what_the_migrations_make() -> None:
    assert _fresh_schema.VERSION == _schema.SCHEMA_VERSION, f"regenerate: {REGENERATE}"
    assert fresh_statements() == _fresh_schema.STATEMENTS, f"regenerate: {REGENERATE}"


def test_a_new_file_has_the_schema_the_migrations_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh, migrated = tmp_path / "fresh.db", tmp_path / "migrated.db"
    SqliteMainStorage(fresh).close()
    stepwise = _schema.migrate

    def step_by_step(conn: sqlite3.Connection, where: str, **kwargs: object) -> int:
        return stepwise(conn, where, begin=kwargs["begin"], fresh=False)  # type: ignore[arg-type]

    monkeypatch.setattr(_schema, "migrate", step_by_step)
    SqliteMainStorage(migrated).close()
    assert _master(fresh) == _master(migrated)
    assert _versions(fresh) == _versions(migrated) == list(range(1, _schema.SCHEMA_VERSION + 1))


def test_a_fresh_file_works_and_later_migrations_apply_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    with SqliteMainStorage(path) as storage:
        storage.put_session(SessionMeta(id="s1", label="One"))

    def add_column(db: object) -> None:
        db.table("stello_sessions").add_column("color", str)  # type: ignore[attr-defined]

    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, add_column))
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", len(_schema.MIGRATIONS))
    with SqliteMainStorage(path) as storage:
        meta = storage.get_session("s1")
        assert meta is not None and meta.label == "One"
    assert _versions(path)[-1] == _schema.SCHEMA_VERSION
    (table,) = [sql for _, name, _, sql in _master(path) if name == "stello_sessions"]
    assert table is not None and '"color"' in table


def test_a_new_file_is_created_without_sqlite_utils(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from stello_graph.checkpoints import SqliteMainStorage\n"
        "SqliteMainStorage(sys.argv[1]).close()\n"
        "print('sqlite_utils' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "new.db")],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "False"


def _literal(sql: str) -> str:
    """`sql` as a Python literal, its lines kept (a triple-quoted string where it can be)."""
    if '"""' in sql or "\\" in sql or sql.endswith('"'):
        return repr(sql)
    return f'"""{sql}"""'


def regenerate() -> None:
    """Write `_fresh_schema.VERSION` and `STATEMENTS` anew from the migrations."""
    path = Path(_fresh_schema.__file__)
    head, rest = path.read_text(encoding="utf-8").split("STATEMENTS: tuple[str, ...] = (\n", 1)
    tail = rest.split(")\n# fmt: on\n", 1)[1]
    head = re.sub(r"\nVERSION = \d+\n", f"\nVERSION = {_schema.SCHEMA_VERSION}\n", head, count=1)
    body = "".join(f"    {_literal(sql)},\n" for sql in fresh_statements())
    path.write_text(f"{head}STATEMENTS: tuple[str, ...] = (\n{body})\n# fmt: on\n{tail}", "utf-8")


if __name__ == "__main__":
    regenerate()
