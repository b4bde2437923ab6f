"""How the suites decide to run, skip or fail the PostgreSQL tests (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests._postgres as setup
from stello_graph.testing import postgres as cluster_module


def _without_binaries(monkeypatch: pytest.MonkeyPatch, *, required: bool) -> setup._Postgres:
    monkeypatch.setattr(setup, "find_bindir", lambda: None)
    monkeypatch.delenv(cluster_module.DSN_ENV, raising=False)
    monkeypatch.setenv(setup.REQUIRE_ENV, "1" if required else "")
    return setup._Postgres()


def test_without_binaries_the_tests_are_left_out_and_it_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = _without_binaries(monkeypatch, required=False)
    assert not found.available and not found.wanted
    assert found.describe().startswith("not available: no PostgreSQL server binaries")
    with pytest.raises(pytest.skip.Exception, match="PostgreSQL: no PostgreSQL server"):
        found.dsn_for(tmp_path)


def test_required_without_binaries_is_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = _without_binaries(monkeypatch, required=True)
    assert found.wanted  # collected, so that they fail
    with pytest.raises(pytest.fail.Exception, match="STELLO_REQUIRE_POSTGRES=1"):
        found.dsn_for(tmp_path)


def test_your_own_database_needs_no_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "find_bindir", lambda: None)
    monkeypatch.setenv(cluster_module.DSN_ENV, "postgresql://me@db.example/stello_test")
    found = setup._Postgres()
    assert found.available and found.describe() == f"{cluster_module.DSN_ENV} (a schema per test)"


def test_a_cluster_without_binaries_says_how_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_module, "find_bindir", lambda: None)
    with pytest.raises(cluster_module.PostgresUnavailableError, match=r"\.ci/postgres\.sh"):
        cluster_module.PostgresCluster.start()
    assert cluster_module.main(["check"]) == 1
