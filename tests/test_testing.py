"""Tests of `stello_graph.testing.ScriptedChatModel`, the scripted chat model for tests."""

from __future__ import annotations

import asyncio
import doctest
import gc
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

import stello_graph.testing
from stello_graph.errors import InvalidInputError, StelloError
from stello_graph.testing import (
    Responder,
    ScriptedChatModel,
    ScriptedReply,
    ScriptExhaustedError,
)

Mode = Literal["sync", "async"]


@tool
def get_weather(city: str) -> str:
    """Return the weather in a city."""
    return f"Sunny in {city}."


class Person(BaseModel):
    """A person mentioned in the conversation."""

    name: str
    age: int


class TokenRecorder(BaseCallbackHandler):
    """Records the tokens a chat model reports through `on_llm_new_token`."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str | list[str | dict[str, Any]], **kwargs: Any) -> None:
        assert isinstance(token, str)
        self.tokens.append(token)


def total(chunks: Sequence[AIMessageChunk]) -> AIMessageChunk:
    """Sum stream chunks the way LangChain aggregates them."""
    result = chunks[0]
    for chunk in chunks[1:]:
        result = result + chunk
    return result


async def invoke(model: ScriptedChatModel, prompt: str, mode: Mode) -> AIMessage:
    if mode == "async":
        return await model.ainvoke(prompt)
    return model.invoke(prompt)


async def stream(model: ScriptedChatModel, prompt: str, mode: Mode) -> list[AIMessageChunk]:
    if mode == "async":
        return [chunk async for chunk in model.astream(prompt)]
    return list(model.stream(prompt))


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> Mode:
    value: Mode = request.param
    return value


# -- text ---------------------------------------------------------------------------------------


async def test_invoke_answers_the_scripted_text(mode: Mode) -> None:
    model = ScriptedChatModel(["Hello!", "Bye."])

    first = await invoke(model, "Hi", mode)
    second = await invoke(model, "Ciao", mode)

    assert (first.content, second.content) == ("Hello!", "Bye.")
    assert first.response_metadata == {"model_name": "scripted", "finish_reason": "stop"}
    assert first.id is not None
    assert first.id.startswith("scripted-")
    assert first.id != second.id
    assert model.calls[0].reply == first


async def test_stream_yields_word_chunks_that_join_into_the_reply(mode: Mode) -> None:
    model = ScriptedChatModel(["  The answer is\n42.  "])

    chunks = await stream(model, "Question?", mode)

    assert [chunk.content for chunk in chunks] == ["  The", " answer", " is", "\n42.", "  ", ""]
    reply = model.calls[0].reply
    assert reply is not None
    assert {chunk.id for chunk in chunks} == {reply.id}
    assert chunks[-1].chunk_position == "last"
    assert total(chunks).content == "  The answer is\n42.  "
    assert model.calls[0].streamed


async def test_chunk_size_streams_fixed_size_pieces(mode: Mode) -> None:
    model = ScriptedChatModel(["abcdefg"], chunk_size=3)

    chunks = await stream(model, "letters", mode)

    assert [chunk.content for chunk in chunks] == ["abc", "def", "g", ""]


def test_stream_reports_each_token_to_callbacks_exactly_once() -> None:
    model = ScriptedChatModel(["one two three"])
    recorder = TokenRecorder()

    chunks = list(model.stream("count", config={"callbacks": [recorder]}))

    assert recorder.tokens == [chunk.text for chunk in chunks] == ["one", " two", " three", ""]


# -- tool calls ---------------------------------------------------------------------------------


async def test_invoke_returns_scripted_tool_calls(mode: Mode) -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call("get_weather", {"city": "Paris"}, content="Looking."),
            ScriptedChatModel.tool_call("get_weather", {"city": "Rome"}, id="mine"),
        ]
    )

    first = await invoke(model, "Weather in Paris?", mode)
    second = await invoke(model, "And Rome?", mode)

    assert first.content == "Looking."
    assert first.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ]
    assert first.response_metadata["finish_reason"] == "tool_calls"
    assert second.tool_calls[0]["id"] == "mine"


def test_dict_shorthand_gets_deterministic_tool_call_ids() -> None:
    model = ScriptedChatModel(
        [
            {"tool_calls": [{"name": "a", "args": {"x": 1}}, {"name": "b"}]},
            {"content": "again", "tool_calls": [{"name": "a", "args": {"x": 2}}]},
            {"content": "done"},
        ]
    )

    replies = [model.invoke("go") for _ in range(3)]

    assert [[call["id"] for call in reply.tool_calls] for reply in replies] == [
        ["call_1", "call_2"],
        ["call_3"],
        [],
    ]
    assert replies[0].tool_calls[1]["args"] == {}
    assert replies[1].content == "again"


async def test_streamed_parallel_tool_calls_sum_to_the_scripted_calls(mode: Mode) -> None:
    reply = ScriptedChatModel.tool_calls(
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome, Italy"})],
        content="Checking both.",
    )
    invoked = ScriptedChatModel([reply]).invoke("Weather?")
    model = ScriptedChatModel([reply])

    chunks = await stream(model, "Weather?", mode)

    summed = total(chunks)
    assert len(chunks) > 4
    assert summed.tool_calls == invoked.tool_calls
    assert [call["args"] for call in summed.tool_calls] == [
        {"city": "Paris"},
        {"city": "Rome, Italy"},
    ]
    assert summed.content == "Checking both."
    assert summed.response_metadata == invoked.response_metadata
    assert summed.invalid_tool_calls == []


# -- binding tools ------------------------------------------------------------------------------


def test_bind_tools_records_the_tools_and_tool_choice_of_each_call() -> None:
    model = ScriptedChatModel(["plain", "with tools", "forced"])

    model.invoke("no tools")
    model.bind_tools([get_weather, Person]).invoke("with tools")
    model.bind_tools([get_weather], tool_choice="get_weather").invoke("forced")

    assert [call.tools for call in model.calls] == [[], ["get_weather", "Person"], ["get_weather"]]
    assert [call.tool_choice for call in model.calls] == [None, None, "get_weather"]
    schema = model.calls[1].kwargs["tools"][1]
    assert schema["function"]["name"] == "Person"
    assert set(schema["function"]["parameters"]["properties"]) == {"name", "age"}


def test_bound_copies_share_the_script_and_the_records() -> None:
    model = ScriptedChatModel(["first", "second"])
    bound = model.bind_tools([get_weather])

    assert bound.invoke("a").content == "first"
    assert model.invoke("b").content == "second"
    assert model.call_count == 2
    assert model.remaining == 0


def test_bind_tools_rejects_a_tool_choice_naming_no_bound_tool() -> None:
    model = ScriptedChatModel(["unused"])

    with pytest.raises(
        InvalidInputError,
        match=r"tool_choice='get_wether'` is not one of the bound tools \['get_weather'\]",
    ):
        model.bind_tools([get_weather], tool_choice="get_wether")


def test_with_structured_output_parses_the_scripted_tool_call() -> None:
    model = ScriptedChatModel([ScriptedChatModel.tool_call("Person", {"name": "Ada", "age": 36})])

    person = model.with_structured_output(Person).invoke("Who wrote the first program?")

    assert person == Person(name="Ada", age=36)
    assert model.calls[0].tool_choice == "any"


# -- computed replies, failures, exhaustion ---------------------------------------------------


def test_callable_entries_and_respond_receive_the_prompt() -> None:
    seen: list[list[BaseMessage]] = []

    def echo(messages: list[BaseMessage]) -> str:
        seen.append(messages)
        return f"echo: {messages[-1].text}"

    model = ScriptedChatModel(
        [lambda messages: f"{len(messages)} message(s)"],
        respond=echo,
    )

    assert model.invoke([SystemMessage("Be brief."), HumanMessage("hi")]).content == "2 message(s)"
    assert model.invoke("first").content == "echo: first"
    assert model.invoke("second").content == "echo: second"
    assert [[m.text for m in messages] for messages in seen] == [["first"], ["second"]]


def test_default_answers_every_call_once_the_script_is_exhausted() -> None:
    model = ScriptedChatModel(["scripted"], default={"content": "fallback"})

    replies = [model.invoke("q").content for _ in range(3)]

    assert replies == ["scripted", "fallback", "fallback"]


async def test_a_scripted_exception_is_raised_and_the_next_call_proceeds(mode: Mode) -> None:
    failure = TimeoutError("provider timed out")
    model = ScriptedChatModel([failure, "recovered"])

    with pytest.raises(TimeoutError, match="provider timed out"):
        await invoke(model, "try", mode)
    reply = await invoke(model, "retry", mode)

    assert reply.content == "recovered"
    assert [(call.error, call.reply is None) for call in model.calls] == [
        (failure, True),
        (None, False),
    ]


async def test_a_scripted_exception_is_raised_when_streaming(mode: Mode) -> None:
    model = ScriptedChatModel([ConnectionError("reset"), "ok"])

    with pytest.raises(ConnectionError, match="reset"):
        await stream(model, "try", mode)

    assert total(await stream(model, "retry", mode)).content == "ok"


def test_exhaustion_says_how_many_replies_were_scripted_and_what_was_asked() -> None:
    model = ScriptedChatModel(["a", "b"])
    model.invoke("one")
    model.invoke("two")

    with pytest.raises(ScriptExhaustedError) as raised:
        model.invoke([HumanMessage("where is my answer?"), AIMessage("thinking")])

    message = str(raised.value)
    assert "call #3" in message
    assert "only 2 response(s) were scripted" in message
    assert "'where is my answer?'" in message
    assert "respond=" in message
    assert isinstance(raised.value, StelloError)
    assert model.call_count == 3


@pytest.mark.parametrize(
    ("responses", "error"),
    [
        ([ValueError], "exception class ValueError; script an instance"),
        ([42], "responses\\[0\\] is 42"),
        ([{"text": "hi"}], "unknown key\\(s\\) \\['text'\\]"),
        ([{"tool_calls": [{"args": {}}]}], "a tool call is a dict with a str 'name'"),
    ],
)
def test_bad_replies_are_rejected_when_the_model_is_built(responses: list[Any], error: str) -> None:
    with pytest.raises(InvalidInputError, match=error):
        ScriptedChatModel(responses)


def test_a_bad_computed_reply_fails_that_call_only() -> None:
    def bad(messages: list[BaseMessage]) -> Any:
        return 42

    model = ScriptedChatModel([bad, "fine"])

    with pytest.raises(InvalidInputError, match="the reply computed by"):
        model.invoke("q")

    assert model.invoke("q").content == "fine"


def test_respond_and_default_are_exclusive() -> None:
    with pytest.raises(InvalidInputError, match="not both"):
        ScriptedChatModel(respond=lambda messages: "a", default="b")


# -- records ------------------------------------------------------------------------------------


def test_prompts_are_copies_and_reset_clears_only_the_records() -> None:
    model = ScriptedChatModel(["one", "two"])
    conversation: list[BaseMessage] = [HumanMessage("hello")]

    model.invoke(conversation)
    conversation.append(AIMessage("later"))

    assert model.prompts == [[HumanMessage("hello")]]
    model.reset()
    assert (model.call_count, model.prompts, model.remaining) == (0, [], 1)
    model.extend(["three"])
    assert model.remaining == 2
    assert repr(model) == "ScriptedChatModel(name='scripted', scripted=3, remaining=2, calls=0)"


# -- usage --------------------------------------------------------------------------------------


async def test_streamed_usage_totals_equal_the_invoked_usage(mode: Mode) -> None:
    reply = ScriptedChatModel.tool_call("get_weather", {"city": "Paris"}, content="Let me see.")
    prompt = "What is the weather like in Paris today?"

    invoked = await invoke(ScriptedChatModel([reply]), prompt, mode)
    chunks = await stream(ScriptedChatModel([reply]), prompt, mode)

    assert invoked.usage_metadata == {"input_tokens": 10, "output_tokens": 10, "total_tokens": 20}
    assert total(chunks).usage_metadata == invoked.usage_metadata
    assert [chunk.usage_metadata is not None for chunk in chunks].count(True) == 1


def test_usage_follows_the_prompt_when_the_same_messages_come_again() -> None:
    """The per-message count is kept for the very object, and only while its text is
    unchanged; it is dropped when the message is gone."""
    from stello_graph.testing._replies import _char_counts

    history = [HumanMessage("x" * 40), AIMessage("y" * 40)]
    model = ScriptedChatModel(default="ok")

    def input_tokens(prompt: list[BaseMessage]) -> int:
        usage = model.invoke(prompt).usage_metadata
        assert usage is not None
        return usage["input_tokens"]

    assert input_tokens(history) == 20
    assert input_tokens(history) == 20  # counted from the kept entries
    history[0].content = "x" * 80  # changed in place: counted again
    assert input_tokens(history) == 30
    assert input_tokens([HumanMessage("x" * 40), AIMessage("y" * 40)]) == 20  # equal, not same
    kept = len(_char_counts._by_id)
    del history
    model.reset()  # the recorded prompts held the messages too
    gc.collect()
    assert len(_char_counts._by_id) < kept


def test_usage_can_be_turned_off() -> None:
    model = ScriptedChatModel(["hi", "hi"], usage=False)

    assert model.invoke("q").usage_metadata is None
    assert total(list(model.stream("q"))).usage_metadata is None


# -- concurrency ----------------------------------------------------------------------------------


async def test_async_calls_with_latency_overlap() -> None:
    model = ScriptedChatModel(default="done", latency=0.3)

    started = time.perf_counter()
    replies = await asyncio.gather(
        model.ainvoke("a"), model.ainvoke("b"), model.ainvoke("c"), model.ainvoke("d")
    )
    elapsed = time.perf_counter() - started

    assert [reply.content for reply in replies] == ["done"] * 4
    assert 0.3 <= elapsed < 0.9  # one after another: 1.2 s


def test_sync_calls_with_latency_overlap_in_threads() -> None:
    model = ScriptedChatModel(default="done", latency=0.3)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        contents = list(pool.map(lambda prompt: model.invoke(prompt).content, "abcd"))
    elapsed = time.perf_counter() - started

    assert contents == ["done"] * 4
    assert 0.3 <= elapsed < 0.9  # one after another: 1.2 s


def test_each_reply_is_consumed_exactly_once_across_threads() -> None:
    def slowly(text: str) -> Responder:
        def reply(messages: list[BaseMessage]) -> str:
            time.sleep(0.002)  # widens any window between taking a reply and recording it
            return text

        return reply

    replies = [f"reply {n}" for n in range(20)]
    script: list[ScriptedReply] = [slowly(text) for text in replies[:10]]
    model = ScriptedChatModel([*script, *replies[10:]])
    barrier = threading.Barrier(20)

    def ask(n: int) -> tuple[str, Any]:
        barrier.wait()
        return f"question {n}", model.invoke(f"question {n}").content

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = dict(pool.map(ask, range(20)))

    assert sorted(answers.values()) == sorted(replies)
    assert model.call_count == 20
    recorded = {call.messages[0].text: call.reply.content for call in model.calls if call.reply}
    assert recorded == answers
    assert sorted(call.index for call in model.calls) == list(range(1, 21))


# -- LangGraph ------------------------------------------------------------------------------------


def test_a_langgraph_agent_streams_the_tokens_of_the_scripted_reply() -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call("get_weather", {"city": "Paris"}),
            "It is sunny in Paris.",
        ]
    )
    agent_model = model.bind_tools([get_weather])

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [agent_model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([get_weather]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "weather"}}
    question: MessagesState = {"messages": [HumanMessage("Weather in Paris?")]}

    events = list(graph.stream(question, config, stream_mode="messages"))

    final_id = model.calls[1].reply.id if model.calls[1].reply else None
    tokens = [
        message.content
        for message, _ in events
        if isinstance(message, AIMessageChunk) and message.id == final_id
    ]
    assert tokens == ["It", " is", " sunny", " in", " Paris.", ""]
    history = graph.get_state(config).values["messages"]
    assert [type(message) for message in history] == [
        HumanMessage,
        AIMessage,
        ToolMessage,
        AIMessage,
    ]
    assert history[1].tool_calls[0]["id"] == "call_1"
    assert history[2].tool_call_id == "call_1"
    assert history[3].content == "It is sunny in Paris."
    assert model.calls[1].tools == ["get_weather"]
    assert [message.text for message in model.calls[1].messages][-1] == "Sunny in Paris."


# -- documentation ------------------------------------------------------------------------------


def test_the_docstring_examples_run() -> None:
    results = doctest.testmod(stello_graph.testing._scripted)

    assert results.attempted > 0
    assert results.failed == 0


def test_integration_reply_addresses_branches_by_id_from_their_labels() -> None:
    from stello_graph import StelloAgent

    model = ScriptedChatModel(
        ["a", "b", "L2 of a", "L2 of b", ScriptedChatModel.integration("S", {"A": "for A"})]
    )
    with StelloAgent(model=model, storage=":memory:") as agent:
        a = agent.fork(agent.main_session_id, "A")
        b = agent.fork(agent.main_session_id, "B")
        agent.turn(a.id, "x")
        agent.turn(b.id, "y")
        agent.consolidate(a.id)
        agent.consolidate(b.id)
        result = agent.integrate()
        assert result.synthesis == "S"
        assert result.insights == {a.id: "for A"}  # keyed by session id
        assert agent.child(a.id).insight() == "for A"


def test_integration_reply_refuses_a_branch_it_was_not_shown() -> None:
    from stello_graph import ChildL2
    from stello_graph.memory import llm_integrator

    children = [ChildL2(session_id=f"s{i}", label="Same", l2="x") for i in (1, 2)]
    for key, why in (("Other", "no such branch"), ("Same", "several branches")):
        model = ScriptedChatModel([ScriptedChatModel.integration("S", {key: "i"})])
        with pytest.raises(InvalidInputError, match=why):
            llm_integrator(model)(children, None)


# -- keywords ---------------------------------------------------------------------------------
def test_an_unknown_keyword_is_refused_with_a_hint() -> None:
    """`BaseChatModel` drops unknown keywords: a misspelt `defualt=` would leave the model
    without its default reply, and the test failing far from the typo."""
    with pytest.raises(InvalidInputError, match=r"'defualt' \(did you mean 'default'\?\)"):
        ScriptedChatModel(defualt="ok")
    with pytest.raises(InvalidInputError, match="'not_a_field'"):
        ScriptedChatModel(not_a_field=1)
    model = ScriptedChatModel(default="ok", tags=["t"], metadata={"k": 1}, disable_streaming=True)
    assert model.tags == ["t"] and model.invoke("hi").content == "ok"


def test_a_subclass_takes_its_own_fields_and_aliases() -> None:
    from pydantic import AliasChoices, ConfigDict, Field

    class Tuned(ScriptedChatModel):
        temperature: float = Field(
            default=0.0, validation_alias=AliasChoices("temperature", "temp")
        )

    assert Tuned(temperature=0.5).temperature == 0.5
    assert Tuned(temp=0.7).temperature == 0.7
    with pytest.raises(InvalidInputError, match="Tuned got unknown arguments: 'tempo'"):
        Tuned(tempo=1.0)

    class Open(ScriptedChatModel):
        model_config = ConfigDict(extra="allow")

    assert Open(anything=1).anything == 1  # type: ignore[attr-defined]
