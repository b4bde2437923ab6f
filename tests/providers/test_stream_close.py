"""Stopping a sync stream stops its model call at once: the HTTP request is closed, nothing
is stored, and the caller gets control back without waiting for the rest of the reply.

LangGraph runs a sync stream's nodes in a thread pool and, when the stream is closed (or
Ctrl-C interrupts it), waits for the running node: the model call used to run to its end.
The server here streams a reply that would take 20 s; the bounds are generous behaviour
bounds (the call must not run to its end), not benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stello_graph import StelloAgent
from stello_graph.testing.openai_server import FakeOpenAI, Reply
from tests.providers.conftest import AgentFactory, ModelFactory

SLOW = Reply(content=" ".join(["word"] * 200), chunk_delay=0.1)  # about 20 s in all
BOUND = 3.0  # seconds: far below the 20 s the whole reply takes


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _assert_nothing_stored(agent: StelloAgent, sid: str, server: FakeOpenAI) -> None:
    assert _wait_for(lambda: server.aborted == 1), "the server never saw the client go away"
    assert agent.session(sid).messages() == []
    assert agent.storage.get_turn_count(sid) == 0


@pytest.fixture
def slow_agent(
    server: FakeOpenAI, make_agent: AgentFactory, chat_model: ModelFactory
) -> Callable[..., StelloAgent]:
    """An agent on `server`, which streams `SLOW` to the first request."""
    server.add(SLOW)
    return lambda **options: make_agent(model=chat_model(timeout=60.0), builtin_tools=(),
                                        **options)  # fmt: skip


@pytest.mark.parametrize("model_timeout", [None, 60.0])
def test_closing_an_agent_stream_stops_the_call(
    slow_agent: Callable[..., StelloAgent],
    server: FakeOpenAI,
    model_timeout: float | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = slow_agent(model_timeout=model_timeout)
    sid = agent.main_session_id
    stream = agent.stream(sid, "Tell me everything.")
    first: Any = next(stream)  # the reply has started
    assert first[0].content is not None
    started = time.monotonic()
    stream.close()  # type: ignore[attr-defined]
    assert time.monotonic() - started < BOUND
    _assert_nothing_stored(agent, sid, server)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # a quiet stop


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C raises `KeyboardInterrupt` during the test, as in a terminal: a run started in
    the background by a non-interactive shell inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_in_an_agent_stream_stops_the_call(
    slow_agent: Callable[..., StelloAgent], server: FakeOpenAI
) -> None:
    agent = slow_agent()
    sid = agent.main_session_id
    stream = agent.stream(sid, "Tell me everything.", stream_mode=["messages", "custom"])
    next(stream)
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    sigint = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    started = time.monotonic()
    sigint.start()  # lands while the caller waits inside the stream for the next token
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                pass
        stream.close()  # type: ignore[attr-defined]
    finally:
        sigint.join()
    assert time.monotonic() - started < BOUND
    _assert_nothing_stored(agent, sid, server)


def test_closing_a_session_stream_stops_the_call(
    slow_agent: Callable[..., StelloAgent], server: FakeOpenAI
) -> None:
    agent = slow_agent()
    session = agent.main
    stream = session.stream("Tell me everything.")
    next(stream)
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < BOUND
    _assert_nothing_stored(agent, session.id, server)


def _close_elsewhere(stream: Any) -> BaseException | None:
    """Close `stream` from another thread (a UI's stop button); what the close raised."""
    raised: list[BaseException] = []

    def close() -> None:
        try:
            stream.close()
        except BaseException as exc:
            raised.append(exc)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive()
    return raised[0] if raised else None


def test_an_agent_stream_closed_from_another_thread_frees_its_session(
    slow_agent: Callable[..., StelloAgent], server: FakeOpenAI
) -> None:
    """The closer raised `ValueError: <Token> was created in a different Context`, and the
    thread that started the stream still held the session: its next turn was refused with
    `SessionBusyError`."""
    server.add(Reply(content="Short."))
    agent = slow_agent()
    sid = agent.main_session_id
    stream = agent.stream(sid, "Tell me everything.")
    next(stream)
    assert _close_elsewhere(stream) is None
    _assert_nothing_stored(agent, sid, server)
    assert agent.turn(sid, "Briefly.").content == "Short."  # the starter's thread is free


def test_a_session_stream_closed_from_another_thread_frees_its_session(
    slow_agent: Callable[..., StelloAgent], server: FakeOpenAI
) -> None:
    server.add(Reply(content="Short."))
    agent = slow_agent()
    session = agent.main
    stream = session.stream("Tell me everything.")
    next(stream)
    assert _close_elsewhere(stream) is None
    _assert_nothing_stored(agent, session.id, server)
    assert session.send("Briefly.").content == "Short."


async def test_closing_an_async_agent_stream_stops_the_call(
    slow_agent: Callable[..., StelloAgent], server: FakeOpenAI
) -> None:
    agent = slow_agent()
    sid = agent.main_session_id
    stream = agent.astream(sid, "Tell me everything.")
    await anext(stream)
    started = time.monotonic()
    await stream.aclose()  # type: ignore[attr-defined]
    assert time.monotonic() - started < BOUND
    for _ in range(500):  # let the loop run the cancellation: at most 10 s
        if server.aborted:
            break
        await asyncio.sleep(0.02)
    _assert_nothing_stored(agent, sid, server)
