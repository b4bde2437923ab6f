"""The documentation's PostgreSQL examples (marked `<!-- test: postgres -->`), run against
the test PostgreSQL."""

from __future__ import annotations

import pytest

from tests._docs import Example, examples_needing, same_output

URL = '"postgresql://app@db.internal:5432/app"'
"""The address the examples name; the test's own database stands in for it."""
EXAMPLES = examples_needing("postgres")


def test_the_scaling_out_example_is_marked() -> None:
    assert [example.page.name for example in EXAMPLES] == ["postgres.md"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_the_postgres_examples_run(
    example: Example, postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert URL in example.code and example.output is not None
    code = example.code.replace(URL, repr(postgres_dsn))
    for _ in range(2):  # and again on the database the first run left
        exec(compile(code, example.name, "exec"), {"__name__": "__docs__"})
        assert same_output(capsys.readouterr().out, example.output)
