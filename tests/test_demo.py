"""The demo (`make demo`) runs offline and shows the whole flow."""

from __future__ import annotations

import io
from pathlib import Path

from stello_graph import demo


def test_demo_runs_the_whole_flow(tmp_path: Path) -> None:
    out = io.StringIO()
    demo.run(out, tmp_path / "demo.db")
    text = out.getvalue()
    assert "Insight -> Pricing: Onboarding wants the cap visible at setup." in text
    assert "The next Pricing turn saw the insight: True" in text
    assert "Insight pending afterwards: None" in text
