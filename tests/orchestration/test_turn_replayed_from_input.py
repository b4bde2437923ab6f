"""A turn resumed from a checkpoint written before its commit is not stored twice.

With asynchronous checkpointing, a process can die after a turn's commit but before the
checkpoints of its steps reached the disk: the newest checkpoint is then the run's input,
and resuming it runs the whole turn again. Its user message must come out the same, so the
commit finds the records it already stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.memory import InMemorySaver

from stello_graph import MainSession, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.testing import ScriptedChatModel


class LosingSaver(InMemorySaver):
    """While `losing`, keeps a thread's checkpoints only up to the run's input (the first
    two: before and after the input is applied), then behaves normally: what survives a
    crash when the later checkpoints were still on their way to the disk."""

    def __init__(self) -> None:
        super().__init__()
        self.losing = True
        self.puts: dict[str, int] = {}

    def _lost(self, config: RunnableConfig) -> bool:
        return self.losing and self.puts.get(str(config["configurable"]["thread_id"]), 0) >= 2

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        if self._lost(config):
            return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}
        thread = str(config["configurable"]["thread_id"])
        self.puts[thread] = self.puts.get(thread, 0) + 1
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not self._lost(config):
            super().put_writes(config, writes, task_id, task_path)


def test_a_turn_replayed_from_its_input_checkpoint_is_stored_once() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    saver = LosingSaver()
    graph = build_stello_graph(ScriptedChatModel(default="ok"), storage).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    graph.invoke({"session_id": main.id, "input": "hello"}, config)
    assert storage.count_records(main.id) == 2
    assert graph.get_state(config).next == ("model",)  # the turn looks in flight
    saver.losing = False
    out = graph.invoke(None, config)  # what a recovering process does
    assert out["content"] == "ok"
    assert storage.count_records(main.id) == 2
    assert storage.get_turn_count(main.id) == 1


def test_two_turns_on_one_thread_have_distinct_messages() -> None:
    storage = InMemoryMainStorage()
    main = MainSession.create(storage)
    graph = build_stello_graph(ScriptedChatModel(default="ok"), storage).compile(
        checkpointer=InMemorySaver()
    )
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    for text in ("one", "one"):
        graph.invoke({"session_id": main.id, "input": text}, config)
    ids = [m.id for m in storage.list_records(main.id, role="human")]
    assert len(ids) == 2 and len(set(ids)) == 2
