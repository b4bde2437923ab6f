"""The demo (`make demo`) runs offline and shows the whole flow."""

from __future__ import annotations

import io
from pathlib import Path

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import demo


def test_demo_runs_the_whole_flow(tmp_path: Path) -> None:
    out = io.StringIO()
    db = tmp_path / "demo.db"
    demo.run(out, db)
    text = out.getvalue()
    assert "I opened three branches: Pricing, Onboarding, Growth" in text
    assert "insight -> Pricing: Onboarding should show the 3-project cap up front." in text
    assert "Taking the main session's insight into account" in text
    assert "insight still pending: False" in text
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        assert [n.label for n in storage.get_children(main.id)] == list(demo.BRANCHES)
        assert storage.get_memory(main.id) is not None
        assert all(storage.get_memory(n.id) for n in storage.get_children(main.id))
