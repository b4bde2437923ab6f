"""The private test cluster: started in a temporary folder, stopped and removed by its owner."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from stello_graph.testing.postgres import (
    DSN_ENV,
    PostgresCluster,
    find_bindir,
    main,
)
from tests._postgres import POSTGRES

pytestmark = pytest.mark.skipif(
    POSTGRES.external is not None, reason="the suites run on your own PostgreSQL"
)


@pytest.fixture(autouse=True)
def _binaries(postgres_dsn: str) -> None:
    """Skipped (or failed when required) without server binaries, as every PostgreSQL test."""


def test_a_cluster_runs_on_loopback_and_leaves_nothing_behind() -> None:
    cluster = PostgresCluster.start()
    try:
        assert (cluster.root / "socket").is_dir()
        if os.geteuid() == 0:  # initdb refuses root: the server runs as an unprivileged user
            assert (cluster.root / "data").stat().st_uid != 0
        dsn = cluster.create_database("made_here")
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT current_setting('listen_addresses')").fetchone()
            assert row == ("127.0.0.1",)
        pid = cluster.process.pid
    finally:
        cluster.stop()
    assert cluster.process.poll() is not None
    assert not cluster.root.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    cluster.stop()  # idempotent


def test_database_names_are_checked() -> None:
    cluster = POSTGRES.cluster
    assert cluster is not None
    with pytest.raises(ValueError, match="must match"):
        cluster.create_database("x; DROP DATABASE postgres")


RUNNER = (sys.executable, "-m", "stello_graph.testing.postgres", "run", "--")


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    assert capsys.readouterr().out.strip() == str(find_bindir())
    assert main(["nonsense"]) == 2
    code = f"import os; print(os.environ[{DSN_ENV!r}])"
    done = subprocess.run(
        [*RUNNER, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.startswith("postgresql://stello@127.0.0.1:")
    assert done.stdout.strip().endswith("/stello_test")
