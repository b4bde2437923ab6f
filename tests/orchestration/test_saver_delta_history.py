"""A graph with a `DeltaChannel` reads its history from the saver as `get_tuple` reads the
thread, sync and async, and none of a deleted thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph

from stello_graph.checkpoints.saver import sqlite_saver


def _extend(state: list[str], batches: Sequence[list[str]]) -> list[str]:
    return [*state, *(item for batch in batches for item in batch)]


class _State(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend)]


def run_on(saver: BaseCheckpointSaver[Any], thread: str) -> RunnableConfig:
    """Run a one-node graph on `thread` and return the config of its last checkpoint."""
    builder = StateGraph(_State)
    builder.add_node("add", lambda state: {"items": ["from the node"]})
    builder.add_edge(START, "add")
    graph = builder.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    chunks = list(graph.stream({"items": ["input"]}, config, stream_mode="checkpoints"))
    last: RunnableConfig = chunks[-1]["config"]
    return last


def _values(history: Any) -> list[str]:
    return [item for _, _, batch in history["items"]["writes"] for item in batch]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_delta_history_reads_the_steps(tmp_path: Path, mode: str) -> None:
    saver = sqlite_saver(tmp_path / "db.sqlite")
    last = run_on(saver, "t")
    if mode == "sync":
        found = saver.get_delta_channel_history(config=last, channels=["items"])
    else:
        found = await saver.aget_delta_channel_history(config=last, channels=["items"])
    assert _values(found) == ["input", "from the node"]
    walked = BaseCheckpointSaver.get_delta_channel_history(saver, config=last, channels=["items"])
    assert found == walked  # what a walk over `get_tuple` reads
    saver.close()


def test_a_delta_history_no_longer_reads_a_deleted_thread(tmp_path: Path) -> None:
    saver = sqlite_saver(tmp_path / "db.sqlite")
    last = run_on(saver, "t")
    assert _values(saver.get_delta_channel_history(config=last, channels=["items"]))
    saver.delete_thread("t")
    assert saver.get_tuple(last) is None
    assert saver.get_delta_channel_history(config=last, channels=["items"]) == {
        "items": {"writes": []}
    }
    saver.close()
