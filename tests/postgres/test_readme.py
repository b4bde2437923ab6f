"""The README's "Scaling out" example, run against the test PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def scaling_out_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Scaling out", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```py\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1
    return str(blocks[0])


def test_the_scaling_out_example_runs(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = scaling_out_example()
    url_line = 'URL = "postgresql://app@db.internal:5432/app"'
    assert url_line in code
    code = code.replace(url_line, f"URL = {postgres_dsn!r}")
    for _ in range(2):  # and again on the database the first run left
        exec(compile(code, "README.md (Scaling out)", "exec"), {"__name__": "readme"})
        assert capsys.readouterr().out == "Noted.\n"
