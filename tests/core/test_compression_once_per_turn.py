"""After a cut, the usage figure of a reply that predates it (it measured a prompt that still
held the records now summarised) is not used to judge the shorter history: the turn after a
failed one does not cut again. (Tool rounds of one graph turn: tests/orchestration.)
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph import ModelCallError, Session
from stello_graph.compression import CompressionPolicy, estimate_tokens, plan_cut
from stello_graph.models import Compression
from stello_graph.testing import ScriptedChatModel
from tests.conftest import Api

WINDOW, THRESHOLD, KEEP = 1000, 0.5, 0.5


class Summariser:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, previous: str | None, records: list[BaseMessage]) -> str:
        self.calls += 1
        return f"SUMMARY#{self.calls}"


def history(turns: int = 8) -> list[BaseMessage]:
    """`turns` turns of about 110 tokens each; the provider said the last prompt was big."""
    records: list[BaseMessage] = []
    for i in range(turns):
        records += [
            HumanMessage(content=f"q{i} " + "x" * 200),
            AIMessage(content=f"a{i} " + "y" * 200),
        ]
    last = records[-1]
    assert isinstance(last, AIMessage)
    last.usage_metadata = {"input_tokens": 880, "output_tokens": 60, "total_tokens": 940}
    return records


def make(api: Api, model: ScriptedChatModel) -> tuple[Session, Summariser]:
    fn = Summariser()
    policy = CompressionPolicy(
        context_window=WINDOW, threshold=THRESHOLD, keep_recent=KEEP, compress_fn=fn
    )
    session = Session.create(api.storage, model=model, label="", compression=policy)
    api.storage.append_records(session.id, history())
    return session, fn


def kept_from(api: Api, session: Session) -> int:
    stored = api.storage.get_compression(session.id)
    assert stored is not None
    return stored.through


def budget_cut(records: list[BaseMessage]) -> int:
    """The earliest user-turn boundary whose tail fits the budget kept verbatim."""
    budget = KEEP * THRESHOLD * WINDOW
    return next(
        i for i, m in enumerate(records)
        if isinstance(m, HumanMessage) and estimate_tokens(records[i:]) <= budget
    )  # fmt: skip


async def send(api: Api, session: Session, text: str) -> None:
    if api.mode == "sync":
        session.send(text)
    else:
        await session.asend(text)


async def test_the_turn_after_a_failed_one_does_not_cut_again(api: Api) -> None:
    model = ScriptedChatModel([RuntimeError("provider down"), "fine"])
    session, fn = make(api, model)
    expected = budget_cut(history())
    with pytest.raises(ModelCallError):
        await send(api, session, "first try")
    assert fn.calls == 1 and kept_from(api, session) == expected
    await send(api, session, "second try")  # the failed turn's cut still holds
    assert fn.calls == 1
    assert kept_from(api, session) == expected


def test_plan_cut_ignores_usage_measured_before_the_cut() -> None:
    policy = CompressionPolicy(context_window=WINDOW, threshold=THRESHOLD, keep_recent=KEEP)
    records = history()
    current = Compression(summary="s", through=budget_cut(records))
    # judged by the old reply's figure, the cut history still looks too long...
    assert plan_cut(policy, WINDOW, [], records, current) is not None
    # ...but that reply predates the cut: the kept history, estimated, fits
    assert plan_cut(policy, WINDOW, [], records, current, measured_from=len(records)) is None
    # a reply made after the cut is believed again
    later = [*records, HumanMessage(content="q"), AIMessage(content="a")]
    later[-1].usage_metadata = {"input_tokens": 900, "output_tokens": 5, "total_tokens": 905}  # type: ignore[attr-defined]
    assert plan_cut(policy, WINDOW, [], later, current, measured_from=len(records)) is not None
