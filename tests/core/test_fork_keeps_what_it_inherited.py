"""A fork's L3 is what it inherited plus its own, whatever its source does afterwards.

Forks share their source's stored rows (a copy-on-write prefix, `checkpoints/_shared_l3`):
on every backend, the source keeps turning, is compressed, consolidated, trimmed below the
cut and archived, and the child (and its own fork) still read exactly what they inherited,
in their history, their prompt and their turn context.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import Session
from stello_graph.compression import CompressionPolicy
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel

pytestmark = pytest.mark.parametrize("mode", ["sync", "async"])


def _summarise(previous: str | None, records: list[BaseMessage]) -> str:
    return f"summary of {len(records)} records"


def _texts(records: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in records]


async def _send(mode: str, session: Session, text: str) -> None:
    if mode == "sync":
        session.send(text)
    else:
        await session.asend(text)


async def test_the_child_keeps_its_inheritance_through_the_sources_life(
    main_storage: MainStorage, mode: str
) -> None:
    model = ScriptedChatModel(respond=lambda prompt: f"re: {prompt[-1].text[:6]}")
    policy = CompressionPolicy(
        context_window=1000, threshold=0.5, keep_recent=0.5, compress_fn=_summarise
    )
    source = Session.create(
        main_storage, label="Source", model=model, compression=policy, consolidate_fn=_summarise
    )
    for n in range(4):
        main_storage.append_records(
            source.id, [HumanMessage(f"q{n} " + "x" * 1200), AIMessage(f"a{n}")], user_turn=True
        )
    child = source.fork("Child", context="inherit")
    inherited = _texts(main_storage.list_records(child.id))
    assert inherited == _texts(main_storage.list_records(source.id))
    grandchild = child.fork("Grandchild", context="inherit", at_turn=2)

    # the source turns on (and compresses), consolidates, trims below the cut, is archived
    for n in range(3):
        await _send(mode, source, f"more {n} " + "y" * 1200)
    assert main_storage.get_compression(source.id) is not None
    source.consolidate()
    main_storage.trim_records(source.id, keep_last=2)
    source.archive()

    await _send(mode, child, "child's own")
    own = ["child's own", "re: child'"]
    assert _texts(main_storage.list_records(child.id)) == [*inherited, *own]
    assert _texts(child.messages()) == [*inherited, *own]
    assert main_storage.get_memory(child.id) is None  # the L2 is the source's
    # the child's prompt: its own summary (if it compressed) and the rest of its records
    compression = main_storage.get_compression(child.id)
    through = compression.through if compression else 0
    prompt = [m for m in model.prompts[-1] if m.type != "system"]
    assert _texts(prompt) == [*inherited, "child's own"][through:]
    assert _texts(main_storage.list_records(grandchild.id)) == inherited[:4]
    assert main_storage.count_records(child.id) == len(inherited) + 2
    assert main_storage.get_turn_count(child.id) == 1
