"""What the commands share: the error that ends a command, the console, database checks."""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

if TYPE_CHECKING:
    from stello_graph.checkpoints import SqliteMainStorage

__all__ = [
    "NOT_A_TREE",
    "USAGE_ERROR",
    "CliError",
    "Console",
    "DbKind",
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


def check_tree(path: Path, tree_id: str) -> None:
    """Check that `path` is a stello-graph database holding `tree_id`, without changing it.

    Raises:
        CliError: the file is missing or is not a stello-graph database holding `tree_id`.
    """
    kind, trees = probe_database(path)
    if kind != "stello":
        raise CliError(f"{str(path)!r} {NOT_A_TREE[kind]}.")
    if tree_id not in trees:
        found = ", ".join(map(repr, trees)) or "none"
        raise CliError(f"{str(path)!r} has no tree {tree_id!r} (trees: {found}); use --tree-id.")


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
