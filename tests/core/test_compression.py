"""Automatic context compression and forks with context="compress"."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from stello_graph import FunctionNotConfiguredError, MainSession, Session
from stello_graph.compression import CompressionPolicy, estimate_tokens, plan_cut, prompt_tokens
from stello_graph.models import Compression
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


class Summariser:
    """A compress function that records its inputs."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, list[str]]] = []

    def __call__(self, previous: str | None, records: list[BaseMessage]) -> str:
        self.calls.append((previous, [m.text for m in records]))
        return f"SUMMARY#{len(self.calls)} of {len(records)} records"


def turn(i: int, size: int = 200) -> list[BaseMessage]:
    return [HumanMessage(content=f"q{i} " + "x" * size), AIMessage(content=f"a{i} " + "y" * size)]


def tool_turn(i: int) -> list[BaseMessage]:
    call = AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": f"c{i}"}])
    return [
        HumanMessage(content=f"q{i} " + "x" * 200),
        call,
        ToolMessage(content="r" * 200, tool_call_id=f"c{i}"),
        AIMessage(content=f"a{i} " + "y" * 200),
    ]


POLICY = CompressionPolicy(context_window=1000, threshold=0.5, keep_recent=0.5)


def test_no_compression_while_the_prompt_fits() -> None:
    records = turn(0) + turn(1)
    assert plan_cut(POLICY, 1000, [], records, None) is None


def test_cut_falls_on_a_user_turn_and_keeps_the_newest() -> None:
    records = [m for i in range(8) for m in (tool_turn(i) if i % 2 else turn(i))]
    cut = plan_cut(POLICY, 1000, [], records, None)
    assert cut is not None
    assert isinstance(records[cut], HumanMessage)  # never inside a tool-call group
    kept = records[cut:]
    assert estimate_tokens(kept) <= POLICY.keep_recent * POLICY.threshold * 1000
    # a huge last turn still stays, verbatim
    big = [*records, HumanMessage(content="z" * 5000), AIMessage(content="ok")]
    last = plan_cut(POLICY, 1000, [], big, None)
    assert last == len(records)


def test_provider_usage_drives_the_estimate() -> None:
    records = turn(0, size=10)
    small = prompt_tokens(POLICY, [], records)
    records[-1].usage_metadata = {"input_tokens": 900, "output_tokens": 5, "total_tokens": 905}  # type: ignore[attr-defined]
    assert prompt_tokens(POLICY, [], records) == 905 > small
    assert plan_cut(POLICY, 1000, [], [*records, *turn(1, size=10)], None) is not None


def test_a_cut_never_moves_back() -> None:
    records = [m for i in range(10) for m in turn(i)]
    current = Compression(summary="s", through=len(records) - 2)
    assert plan_cut(POLICY, 1000, [], records, current) is None


def make_session(storage: MainStorage, fn: Summariser, model: ScriptedChatModel) -> Session:
    policy = CompressionPolicy(context_window=1000, threshold=0.5, keep_recent=0.5, compress_fn=fn)
    return Session.create(storage, model=model, label="", compression=policy)


def test_session_prompt_is_compressed_and_summary_persisted(main_storage: MainStorage) -> None:
    fn = Summariser()
    model = ScriptedChatModel(default="ok")
    s = make_session(main_storage, fn, model)
    main_storage.append_records(s.id, [m for i in range(8) for m in turn(i)])
    s.send("newest question")
    assert len(fn.calls) == 1
    prompt = model.prompts[-1]
    assert isinstance(prompt[0], SystemMessage)
    assert "SUMMARY#1" in prompt[0].text
    assert prompt[-1].text == "newest question"
    stored = main_storage.get_compression(s.id)
    assert stored is not None and stored.summary.startswith("SUMMARY#1")
    assert prompt[1].text == main_storage.list_records(s.id)[stored.through].text
    assert len(main_storage.list_records(s.id)) == 18  # storage keeps every record
    # a reloaded session reuses the persisted summary: no new compress call
    again = Session.load(s.id, main_storage, model=model, compression=s._compression)
    again.send("one more")
    assert len(fn.calls) == 1
    assert "SUMMARY#1" in model.prompts[-1][0].text


def test_summary_is_extended_incrementally(main_storage: MainStorage) -> None:
    fn = Summariser()
    s = make_session(main_storage, fn, ScriptedChatModel(default="ok"))
    main_storage.append_records(s.id, [m for i in range(8) for m in turn(i)])
    s.send("first")
    first = main_storage.get_compression(s.id)
    main_storage.append_records(s.id, [m for i in range(8, 16) for m in turn(i)])
    s.send("second")
    second = main_storage.get_compression(s.id)
    assert first is not None and second is not None
    assert second.through > first.through
    previous, records = fn.calls[1]
    assert previous == first.summary  # extends the old summary...
    assert records[0] == main_storage.list_records(s.id)[first.through].text  # ...from its end


async def test_async_compression(main_storage: MainStorage) -> None:
    fn = Summariser()

    async def afn(previous: str | None, records: list[BaseMessage]) -> str:
        return fn(previous, records)

    policy = CompressionPolicy(context_window=1000, threshold=0.5, compress_fn=afn)
    model = ScriptedChatModel(default="ok")
    s = await Session.acreate(main_storage, model=model, compression=policy)
    await main_storage.aappend_records(s.id, [m for i in range(8) for m in turn(i)])
    await s.asend("q")
    assert "SUMMARY#1" in model.prompts[-1][0].text
    assert await main_storage.aget_compression(s.id) is not None


def test_window_from_model_profile(main_storage: MainStorage) -> None:
    fn = Summariser()
    model = ScriptedChatModel(default="ok", profile={"max_input_tokens": 1000})
    s = Session.create(main_storage, model=model, compression=CompressionPolicy(compress_fn=fn))
    main_storage.append_records(s.id, [m for i in range(8) for m in turn(i)])
    s.send("q")
    assert len(fn.calls) == 1
    unknown = Session.create(
        main_storage, model=ScriptedChatModel(default="ok"), compression=CompressionPolicy()
    )
    main_storage.append_records(unknown.id, [m for i in range(8) for m in turn(i)])
    unknown.send("q")  # no window known: nothing to plan for


def test_main_session_compresses_too(main_storage: MainStorage) -> None:
    fn = Summariser()
    model = ScriptedChatModel(default="ok")
    policy = CompressionPolicy(context_window=1000, threshold=0.5, compress_fn=fn)
    main = MainSession.create(main_storage, model=model, compression=policy)
    main_storage.put_memory(main.id, "SYNTH")
    main_storage.append_records(main.id, [m for i in range(8) for m in turn(i)])
    main.send("q")
    system = model.prompts[-1][0].text
    assert system.index("SYNTH") < system.index("SUMMARY#1")


def test_fork_with_compressed_context(main_storage: MainStorage) -> None:
    fn = Summariser()
    model = ScriptedChatModel(default="ok")
    parent = Session.create(main_storage, model=model, label="P")
    parent.send("we decided on blue")
    child = parent.fork("C", context="compress", compress_fn=fn)
    assert fn.calls == [(None, ["we decided on blue", "ok"])]
    assert child.messages() == []
    assert main_storage.get_compression(child.id) == Compression(
        summary="SUMMARY#1 of 2 records", through=0
    )
    child.send("what colour?")
    assert "SUMMARY#1 of 2 records" in model.prompts[-1][0].text
    # the default compressor uses the session's model
    summarizer_model = ScriptedChatModel(default="a memo")
    other = Session.create(main_storage, model=summarizer_model)
    other.send("x")
    kid = other.fork("K", context="compress")
    assert main_storage.get_compression(kid.id) == Compression(summary="a memo", through=0)


def test_compress_fork_without_any_function_creates_nothing(main_storage: MainStorage) -> None:
    parent = Session.create(main_storage)  # no model, no policy
    with pytest.raises(FunctionNotConfiguredError, match="compress"):
        parent.fork("C", context="compress")
    assert len(main_storage.list_sessions()) == 1
