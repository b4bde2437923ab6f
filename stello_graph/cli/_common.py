"""What the commands share: the error that ends a command, the console, and the one way the
commands open the database `--db` names (a SQLite file or a `postgresql://` DSN)."""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from stello_graph.checkpoints import is_postgres_dsn

if TYPE_CHECKING:
    from stello_graph.checkpoints import BackendStorage, SqliteMainStorage

__all__ = [
    "NOT_A_TREE",
    "USAGE_ERROR",
    "CliError",
    "Console",
    "DbKind",
    "check_tree",
    "clip",
    "open_storage",
    "open_tree",
    "probe_database",
]

USAGE_ERROR = 2
"""Exit code of a bad command line or bad input file (as argparse uses)."""


class CliError(Exception):
    """Ends a command with a message on stderr and an exit code (2: bad usage or input)."""

    def __init__(self, message: str, code: int = USAGE_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Console:
    """The streams of one command run, and how to dress its text.

    Attributes:
        stdin / stdout / stderr: the streams.
        interactive: a person types at a terminal: show prompts, read with line editing.
        color: use ANSI colours.
    """

    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    interactive: bool = False
    color: bool = False

    @classmethod
    def open(
        cls,
        stdin: TextIO | None,
        stdout: TextIO | None,
        stderr: TextIO | None,
        env: Mapping[str, str],
    ) -> Console:
        """The given streams, or the process's; interactive only on the process's terminal."""
        given = (stdin, stdout, stderr)
        console = cls(stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
        on_tty = all(s is None for s in given[:2]) and _isatty(sys.stdin) and _isatty(sys.stdout)
        console.interactive = on_tty
        if on_tty:  # line editing and history for `input()`, where the platform has it
            with contextlib.suppress(ImportError):
                importlib.import_module("readline")
        console.color = on_tty and not env.get("NO_COLOR") and env.get("TERM") != "dumb"
        return console

    def write(self, text: str) -> None:
        """Write `text` as is, at once (a streamed token, a prompt)."""
        self.stdout.write(text)
        self.stdout.flush()

    def say(self, text: str = "") -> None:
        self.write(text + "\n")

    def error(self, text: str) -> None:
        """An error that ends the command: on stderr."""
        self.stderr.write(f"stello-graph: error: {text}\n")
        self.stderr.flush()

    def warning(self, text: str) -> None:
        """Something the user should know about the output: on stderr."""
        self.stderr.write(f"stello-graph: warning: {text}\n")
        self.stderr.flush()

    def read(self, prompt: str) -> str | None:
        """One line typed by the user, without its newline; `None` at the end of input."""
        if self.interactive:
            try:
                return input(prompt)
            except EOFError:
                self.say()
                return None
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\r\n")

    def style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def dim(self, text: str) -> str:
        return self.style(text, "2")

    def bold(self, text: str) -> str:
        return self.style(text, "1")

    def warn(self, text: str) -> str:
        return self.style(text, "33")


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


# -- databases ------------------------------------------------------------------------------
DbKind = Literal["missing", "directory", "empty", "not-sqlite", "locked", "sqlite", "stello"]


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters (the last one `…` when cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def probe_database(path: Path, *, timeout: float = 5.0) -> tuple[DbKind, list[str]]:
    """What `path` is, read without changing it (nor leaving side files next to it); for a
    stello database, its tree ids.

    `timeout`: the seconds to wait for another process's lock on the file before it is
    reported as `"locked"`."""
    if not path.exists():
        return "missing", []
    if path.is_dir():
        return "directory", []
    if path.stat().st_size == 0:
        return "empty", []
    from stello_graph.checkpoints._schema import SCHEMA, SESSIONS
    from stello_graph.checkpoints._sqlite_conn import connect_read_only

    try:
        conn = connect_read_only(path, timeout=timeout)
    except sqlite3.Error:
        return "not-sqlite", []
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        if SCHEMA not in tables or SESSIONS not in tables:
            return "sqlite", []
        rows = conn.execute(f"SELECT DISTINCT tree_id FROM {SESSIONS} ORDER BY tree_id")
        return "stello", [tree for (tree,) in rows]
    except sqlite3.OperationalError as exc:  # a writer's lock outlasted the wait
        return ("locked" if _is_locked(exc) else "not-sqlite"), []
    except sqlite3.DatabaseError:
        return "not-sqlite", []
    finally:
        conn.close()


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    return (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


NOT_A_TREE = {
    "missing": "no such file; name the database with --db FILE",
    "directory": "is a directory, not a database file",
    "empty": "is an empty file, not a stello-graph database",
    "not-sqlite": "is not a SQLite database",
    "locked": "is locked by another process writing to it; try again when it is done",
    "sqlite": "is a SQLite database without stello-graph data",
}


def _no_tree(where: str, tree_id: str, trees: list[str]) -> CliError:
    found = ", ".join(map(repr, trees)) or "none"
    return CliError(f"{where} has no tree {tree_id!r} (trees: {found}); name one with --tree ID.")


def check_tree(path: Path, tree_id: str) -> None:
    """Check that `path` is a stello-graph database holding `tree_id`, without changing it.

    Raises:
        CliError: the file is missing or is not a stello-graph database holding `tree_id`.
    """
    kind, trees = probe_database(path)
    if kind != "stello":
        raise CliError(f"{str(path)!r} {NOT_A_TREE[kind]}.")
    if tree_id not in trees:
        raise _no_tree(repr(str(path)), tree_id, trees)


def open_tree(path: Path, tree_id: str) -> SqliteMainStorage:
    """Open an existing tree for reading; never creates a file.

    Raises:
        CliError: the file is missing or is not a stello-graph database holding `tree_id`.
    """
    check_tree(path, tree_id)
    from stello_graph.checkpoints import SqliteMainStorage
    from stello_graph.errors import StelloError

    try:
        return SqliteMainStorage(path, tree_id=tree_id)
    except StelloError as exc:
        raise CliError(f"{str(path)!r}: {exc}") from exc


def open_storage(
    db: str, tree_id: str, *, create: bool = False, allow_foreign_tables: bool = False
) -> tuple[BackendStorage, str]:
    """Open the tree `tree_id` of the database `--db` names: the one way every command opens
    it, a SQLite file or a `postgresql://` DSN alike.

    Without `create`, the tree must exist: the database is checked first without changing
    it (no file is made, no table added). With `create` (`chat`, `demo`), the database and the
    tree are made when missing; `allow_foreign_tables` lets stello-graph add its tables to
    a SQLite file holding another application's (`--allow-foreign-tables`).

    Returns:
        The storage, and how to show the database: a file's absolute path, a DSN without its
        password.

    Raises:
        CliError: the database cannot be opened, or holds no tree `tree_id` (without
            `create`); the message says what to pass instead.
    """
    if is_postgres_dsn(db):
        return _open_postgres(db, tree_id, create=create)
    path = Path(db)
    if not create:
        return open_tree(path, tree_id), str(path.resolve())
    _check_writable(path)
    from stello_graph.checkpoints import SqliteMainStorage
    from stello_graph.errors import ForeignDatabaseError

    try:
        storage = SqliteMainStorage(
            path, tree_id=tree_id, allow_foreign_tables=allow_foreign_tables
        )
    except ForeignDatabaseError as exc:  # the library's fix is a Python argument: say the flag
        found = str(exc).partition(" Name another file")[0]
        raise CliError(
            f"{found} Name another file with --db, or pass --allow-foreign-tables to add "
            "stello-graph's tables to this one."
        ) from None
    return storage, str(path.resolve())


def _check_writable(path: Path) -> None:
    if not path.parent.is_dir():
        raise CliError(f"cannot create {str(path)!r}: no directory {str(path.parent)!r}.")
    kind, _ = probe_database(path)
    if kind == "locked":
        raise CliError(f"{str(path)!r} {NOT_A_TREE[kind]}.")
    if kind in ("directory", "not-sqlite"):
        label = "is a directory" if kind == "directory" else "is not a SQLite database"
        raise CliError(f"{str(path)!r} {label}; name another file with --db FILE.")


def _open_postgres(dsn: str, tree_id: str, *, create: bool) -> tuple[BackendStorage, str]:
    """A `PostgresMainStorage` on `dsn`; without `create`, only over an existing tree."""
    try:
        from stello_graph.checkpoints import postgres
        from stello_graph.checkpoints._postgres_conn import describe
    except ImportError as exc:
        raise CliError(
            'PostgreSQL storage needs its extra: pip install "stello-graph[postgres]" '
            f"({exc.name} is missing)."
        ) from None
    from stello_graph.errors import StorageError

    where = describe(dsn)  # without the password
    try:
        if not create:
            trees = _postgres_trees(dsn)
            if trees is None:
                raise CliError(f"{where} is a PostgreSQL database without stello-graph data.")
            if tree_id not in trees:
                raise _no_tree(where, tree_id, trees)
        storage = postgres.PostgresMainStorage(dsn, tree_id=tree_id)
    except StorageError as exc:  # its message names the database without its password
        raise CliError(str(exc)) from None
    return storage, where.strip("'")


def _postgres_trees(dsn: str) -> list[str] | None:
    """The trees of the PostgreSQL database `dsn` names (`None`: it holds no stello-graph
    tables), read without changing it (opening a storage would add the tables)."""
    from stello_graph.checkpoints import _postgres_schema as schema
    from stello_graph.checkpoints._postgres_conn import Link, Query

    link = Link(dsn, connect_timeout=10.0, lock_timeout=10.0)
    try:
        conn = link.acquire()
        try:
            tables = [name for (name,) in link.run(conn, Query(schema.STELLO_TABLES)).rows]
            if schema.SESSIONS not in tables:
                return None
            query = Query(f"SELECT DISTINCT tree_id FROM {schema.SESSIONS} ORDER BY tree_id")
            return [tree for (tree,) in link.run(conn, query).rows]
        finally:
            link.release(conn)
    finally:
        link.close()
