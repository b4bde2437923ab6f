"""The PostgreSQL the suites run on: a private cluster per test session, or your own.

With `STELLO_TEST_POSTGRES_DSN` set, the suites use that database (each test in a schema of
its own, dropped at the end). Otherwise, when the server binaries are installed, one private
cluster (`stello_graph.testing.postgres.PostgresCluster`) is started on first use and removed
at the end of the session. Each test directory (`tmp_path`) gets a fresh schema, named in the
connection's `search_path`, so a test sees an empty database, as a fresh SQLite file would be.

Without binaries the PostgreSQL tests are left out and the run says so; with
`STELLO_REQUIRE_POSTGRES=1` (CI) they fail instead.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from pathlib import Path
from urllib.parse import quote

import pytest

from stello_graph.testing.postgres import DSN_ENV, PostgresCluster, find_bindir

__all__ = ["POSTGRES"]

REQUIRE_ENV = "STELLO_REQUIRE_POSTGRES"


class _Postgres:
    """The session's PostgreSQL: started on first use, stopped by `stop()`."""

    def __init__(self) -> None:
        self.required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
        self.external = os.environ.get(DSN_ENV) or None
        self._cluster: PostgresCluster | None = None
        self._failed: str | None = None
        self._schemas: dict[Path, str] = {}
        self._numbers = itertools.count(1)
        self.reason = self._why_unavailable()

    def _why_unavailable(self) -> str | None:
        missing = [
            name for name in ("psycopg", "psycopg_pool") if importlib.util.find_spec(name) is None
        ]
        if missing:
            return f"{', '.join(missing)} not installed (pip install 'stello-graph[postgres]')"
        if self.external is None and find_bindir() is None:
            return "no PostgreSQL server binaries (pg_config --bindir, /usr/lib/postgresql)"
        return None

    @property
    def available(self) -> bool:
        return self.reason is None

    @property
    def wanted(self) -> bool:
        """Whether the PostgreSQL tests are collected (they fail when required but missing)."""
        return self.available or self.required

    def describe(self) -> str:
        if self.reason is not None:
            return f"not available: {self.reason}"
        if self.external is not None:
            return f"{DSN_ENV} (a schema per test)"
        return "a private cluster per session (a schema per test)"

    def base_dsn(self) -> str:
        """The database of the session (the cluster is started on first use)."""
        if self.reason is not None:
            self._unavailable(self.reason)
        if self.external is not None:
            return self.external
        if self._failed is not None:
            self._unavailable(self._failed)
        if self._cluster is None:
            try:
                self._cluster = PostgresCluster.start()
                self._cluster.create_database("stello_test")
            except Exception as exc:
                self._failed = f"the private cluster did not start: {exc}"
                self._unavailable(self._failed)
        assert self._cluster is not None
        return self._cluster.dsn("stello_test")

    def _unavailable(self, reason: str) -> None:
        if self.required:
            pytest.fail(f"PostgreSQL is required ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
        pytest.skip(f"PostgreSQL: {reason}")

    def dsn_for(self, tmp_path: Path) -> str:
        """A DSN on a schema of its own for the test directory (made on first use)."""
        import psycopg
        from psycopg.conninfo import make_conninfo

        base = self.base_dsn()
        schema = self._schemas.get(tmp_path)
        if schema is None:
            schema = f"stello_t{os.getpid()}_{next(self._numbers)}"
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            self._schemas[tmp_path] = schema
        if base.startswith(("postgresql://", "postgres://")):  # a URL stays one (for agents)
            joiner = "&" if "?" in base else "?"
            return f"{base}{joiner}options={quote(f'-c search_path={schema}')}"
        return make_conninfo(base, options=f"-c search_path={schema}")

    def stop(self) -> None:
        """Drop the schemas made on an external database; stop the private cluster."""
        if self.external is not None and self._schemas:
            import psycopg

            with psycopg.connect(self.external, autocommit=True) as conn:
                for schema in self._schemas.values():
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        self._schemas.clear()
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None

    @property
    def cluster(self) -> PostgresCluster | None:
        """The private cluster, when the session runs one (not with an external DSN)."""
        self.base_dsn()
        return self._cluster


POSTGRES = _Postgres()
