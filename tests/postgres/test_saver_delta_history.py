"""A graph with a `DeltaChannel` reads its history from the PostgreSQL saver as `get_tuple`
reads the thread (the SQLite saver's case is in
`tests/orchestration/test_saver_delta_history.py`)."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver

from stello_graph.checkpoints._postgres_saver import postgres_saver
from tests.orchestration.test_saver_delta_history import run_on


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_delta_history_reads_the_steps(postgres_dsn: str, mode: str) -> None:
    saver = postgres_saver(postgres_dsn)
    last = run_on(saver, "t")
    if mode == "sync":
        found = saver.get_delta_channel_history(config=last, channels=["items"])
    else:
        found = await saver.aget_delta_channel_history(config=last, channels=["items"])
    writes = [item for _, _, batch in found["items"]["writes"] for item in batch]
    assert writes == ["input", "from the node"]
    walked = BaseCheckpointSaver.get_delta_channel_history(saver, config=last, channels=["items"])
    assert found == walked
    saver.close()
