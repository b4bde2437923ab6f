"""The prompt budget (`CompressionPolicy(budget=...)`): every prompt stays within it, the
summary sits after the identity line and the insight, the newest turns and every tool-call
group stay whole, and L3 keeps every record."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from stello_graph import InvalidInputError, Session
from stello_graph.compression import DEFAULT_PROMPT_BUDGET, CompressionPolicy, estimate_tokens
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel

BUDGET = 400
TURN = 300  # characters of a user message and of a reply: ~80 tokens each


def summarise(previous: str | None, records: list[BaseMessage]) -> str:
    return f"MEMO({len(records)} records)"


def question(i: int) -> str:
    return f"question {i} " + "q" * TURN


def tool_turn(i: int) -> list[BaseMessage]:
    call = AIMessage(content="", tool_calls=[{"name": "look", "args": {"i": i}, "id": f"c{i}"}])
    return [
        HumanMessage(content=question(i)),
        call,
        ToolMessage(content="r" * TURN, tool_call_id=f"c{i}"),
        AIMessage(content=f"answer {i} " + "a" * TURN),
    ]


def budgeted(storage: MainStorage, model: ScriptedChatModel, **options: object) -> Session:
    policy = CompressionPolicy(budget=BUDGET, compress_fn=summarise, **options)  # type: ignore[arg-type]
    return Session.create(storage, model=model, label="Pricing", compression=policy)


def reply_model() -> ScriptedChatModel:
    return ScriptedChatModel(respond=lambda messages: "reply " + "a" * TURN)


def test_limit_is_the_smaller_of_budget_and_window() -> None:
    windowed = ScriptedChatModel(default="ok", profile={"max_input_tokens": 1000})
    assert CompressionPolicy(budget=2048).limit(windowed) == 1000
    assert CompressionPolicy(budget=512).limit(windowed) == 512
    assert CompressionPolicy(budget=512, context_window=300).limit(None) == 300
    assert CompressionPolicy().limit(windowed) == 1000
    assert CompressionPolicy().limit(ScriptedChatModel(default="ok")) == DEFAULT_PROMPT_BUDGET


@pytest.mark.parametrize("bad", [0, 15, True, 2.5, "2048"])
def test_a_bad_budget_is_refused(bad: object) -> None:
    with pytest.raises(InvalidInputError, match="budget must be an int >= 16"):
        CompressionPolicy(budget=bad)  # type: ignore[arg-type]


def test_every_prompt_stays_within_the_budget_and_l3_keeps_everything(
    main_storage: MainStorage,
) -> None:
    model = reply_model()
    session = budgeted(main_storage, model)
    for i in range(30):
        session.send(question(i))
    sizes = [estimate_tokens(prompt) for prompt in model.prompts]
    assert max(sizes) <= BUDGET
    lengths = [len(prompt) for prompt in model.prompts]
    assert max(lengths[5:]) <= max(lengths[:5])  # cut again and again: it does not grow
    compression = main_storage.get_compression(session.id)
    assert compression is not None and compression.through >= 50
    records = main_storage.list_records(session.id)
    assert len(records) == 60  # compression changes the prompt only
    assert [m.text for m in records[::2]] == [question(i) for i in range(30)]


def test_the_summary_follows_identity_and_insight_and_precedes_the_history(
    main_storage: MainStorage,
) -> None:
    model = reply_model()
    session = budgeted(main_storage, model)
    main_storage.append_records(
        session.id,
        [m for i in range(12) for m in (HumanMessage(question(i)), AIMessage("a" * TURN))],
    )
    main_storage.put_insight(session.id, "Cap the free tier.")
    session.send("newest")
    prompt = model.prompts[-1]
    assert isinstance(prompt[0], SystemMessage)
    system = prompt[0].text
    assert system.index("Pricing") < system.index("Cap the free tier.") < system.index("MEMO(")
    assert not any(isinstance(m, SystemMessage) for m in prompt[1:])
    assert isinstance(prompt[1], HumanMessage)  # the history starts at a user turn
    assert prompt[-1].text == "newest"


def test_the_newest_turns_stay_whole_and_in_order(main_storage: MainStorage) -> None:
    model = reply_model()
    session = budgeted(main_storage, model)
    history = [m for i in range(12) for m in (HumanMessage(question(i)), AIMessage(f"a{i}"))]
    main_storage.append_records(session.id, history)
    session.send("newest")
    shown = [m.text for m in model.prompts[-1][1:-1]]
    stored = [m.text for m in main_storage.list_records(session.id)]
    assert shown == stored[len(stored) - 2 - len(shown) : -2]  # L3's tail, verbatim
    assert len(shown) >= 2  # at least the newest whole turn of the history
    keep = CompressionPolicy().keep_recent * CompressionPolicy().threshold * BUDGET
    assert estimate_tokens(model.prompts[-1][1:-1]) <= keep


def test_tool_call_groups_are_kept_or_cut_whole(main_storage: MainStorage) -> None:
    model = reply_model()
    session = budgeted(main_storage, model)
    main_storage.append_records(session.id, [m for i in range(8) for m in tool_turn(i)])
    session.send("newest")
    history = model.prompts[-1][1:-1]
    assert isinstance(history[0], HumanMessage)
    for index, message in enumerate(history):
        if isinstance(message, AIMessage) and message.tool_calls:
            result = history[index + 1]
            assert isinstance(result, ToolMessage)
            assert result.tool_call_id == message.tool_calls[0]["id"]
        if isinstance(message, ToolMessage):
            assert isinstance(history[index - 1], AIMessage)


async def test_the_budget_holds_on_the_async_path(main_storage: MainStorage) -> None:
    model = reply_model()
    session = budgeted(main_storage, model)
    for i in range(20):
        await session.asend(question(i))
    assert max(estimate_tokens(prompt) for prompt in model.prompts) <= BUDGET
    assert len(await main_storage.alist_records(session.id)) == 40


def test_no_policy_means_no_compression(main_storage: MainStorage) -> None:
    model = reply_model()
    session = Session.create(main_storage, model=model, label="Pricing")
    for i in range(12):
        session.send(question(i))
    assert len(model.prompts[-1]) == 2 + 2 * 11  # system line, every record, the new message
    assert main_storage.get_compression(session.id) is None
