"""Fault suite: the model, the tools and the memory functions fail on a share of calls.

* Turns: a seeded share of model calls fails (a provider error, a dropped connection, a
  call that outlives `model_timeout`) or asks for tools in ways that fail (an unknown tool,
  arguments that are not JSON, arguments that do not validate, a tool that raises). A turn
  either answers or raises a typed error (`ModelCallError`, `ToolRoundLimitError`); a failed
  turn stores nothing and keeps its session's pending insight; the agent's `model_retry`
  policy is honoured call by call (retryable failures are retried up to `max_attempts`,
  others never); tool failures reach the model as error results.
* Memory functions: consolidate / integrate functions that raise or return garbage give
  `ConsolidationError` / `IntegrationError` and change nothing.
* Background: scheduled jobs that fail are retried `retry_attempts` times, then kept in
  `failures()` and published as `background_error` events; no turn ever sees them.

Each runs on a SQLite file and, when there is one, on a PostgreSQL database (a schema per test).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langgraph.types import RetryPolicy

from stello_graph import (
    ChildL2,
    ConsolidationError,
    IntegrationError,
    IntegrationResult,
    IntegrationSupersededError,
    ModelCallError,
    NothingToIntegrateError,
    Schedule,
    StelloAgent,
    StelloEvent,
    ToolRoundLimitError,
)
from stello_graph.checkpoints import SqliteMainStorage, StelloSqliteSaver
from stello_graph.errors import StorageError, StorageUnavailableError
from stello_graph.testing import ScriptedChatModel
from tests._postgres import POSTGRES
from tests.reliability import _scenario as sc
from tests.reliability._invariants import (
    Snapshot,
    ack_problems,
    integrity_problems,
    structural_problems,
)
from tests.reliability.conftest import Figures, count

pytestmark = pytest.mark.reliability

TURNS = count("fault_turns", ci=150, full=600)
MEMORY_OPS = count("fault_memory_ops", ci=150, full=600)
STORAGE_FAULT_OPS = count("storage_fault_ops", ci=80, full=400)
SHARE = 30
"""Percent of model calls that fail or ask for a failing tool call."""
MAX_ATTEMPTS = 3
RETRY = RetryPolicy(
    max_attempts=MAX_ATTEMPTS, initial_interval=0.001, backoff_factor=1.0, jitter=False,
    retry_on=ConnectionError,
)  # fmt: skip
TIMEOUT = 0.2
DELAY = "stello_test_delay"
RETRYABLE = frozenset({"conn", "timeout"})
MODEL_FAILURES = frozenset({"error", *RETRYABLE})
TOOL_FAULTS = ("unknown_tool", "malformed", "bad_args", "tool_raises")
KINDS = ("error", "conn", "timeout", *TOOL_FAULTS)


class SlowableModel(ScriptedChatModel):
    """Waits before answering a reply that carries `additional_kwargs[DELAY]` (awaiting when
    async, so `model_timeout` can cancel it)."""

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = super()._generate(messages, stop, run_manager, **kwargs)
        time.sleep(result.generations[0].message.additional_kwargs.pop(DELAY, 0))
        return result

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = await super()._agenerate(messages, stop, run_manager, **kwargs)
        await asyncio.sleep(result.generations[0].message.additional_kwargs.pop(DELAY, 0))
        return result


@tool
def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"tool exploded: {reason}")


class FaultyResponder:
    """`sc.respond`, except that a seeded share of calls fails; every call is logged as
    `(round, kind)` under the turn's text."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.log: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self._lock = threading.Lock()

    def kind(self, text: str, n: int) -> str:
        d = sc.digest(self.seed, text, n)
        return "ok" if d % 100 >= SHARE else KINDS[(d // 100) % len(KINDS)]

    def __call__(self, messages: list[BaseMessage]) -> Any:
        text, rounds = sc.turn_part(messages)
        with self._lock:
            n = len(self.log[text])
            kind = self.kind(text, n)
            self.log[text].append((rounds, kind))
        call_id = f"{kind}-{text}-{n}"
        if kind == "ok":
            return sc.respond(messages)
        if kind == "error":
            return RuntimeError("provider returned 500")
        if kind == "conn":
            return ConnectionError("connection reset by peer")
        if kind == "timeout":
            return AIMessage(content="too late", additional_kwargs={DELAY: 1.0})
        if kind == "malformed":
            bad = {"name": "lookup", "args": '{"key": ', "id": call_id, "error": "truncated"}
            return AIMessage(content="", invalid_tool_calls=[{"type": "invalid_tool_call", **bad}])
        name, args = {
            "unknown_tool": ("no_such_tool", {}),
            "bad_args": ("lookup", {"wrong": 1}),
            "tool_raises": ("explode", {"reason": text}),
        }[kind]
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def retry_problems(text: str, log: list[tuple[int, str]], outcome: str) -> list[str]:
    """Each round's calls: retryable failures retried up to MAX_ATTEMPTS, nothing else."""
    rounds: dict[int, list[str]] = defaultdict(list)
    for index, kind in log:
        rounds[index].append(kind)
    problems: list[str] = []
    for index, kinds in rounds.items():
        last = index == max(rounds)
        retried, final = kinds[:-1], kinds[-1]
        if any(k not in RETRYABLE for k in retried):
            problems.append(f"{text} round {index}: retried after a non-retryable {kinds}")
        if len(kinds) > MAX_ATTEMPTS:
            problems.append(f"{text} round {index}: {len(kinds)} attempts > {MAX_ATTEMPTS}")
        if outcome == "ModelCallError" and last:
            if final in RETRYABLE and len(kinds) < MAX_ATTEMPTS:
                problems.append(f"{text}: gave up after {kinds}, attempts were left")
            if final not in MODEL_FAILURES:
                problems.append(f"{text}: ModelCallError though the last call was {final}")
        elif final in MODEL_FAILURES and not (last and outcome == "ModelCallError"):
            problems.append(f"{text} round {index}: ended on {final} yet the turn went on")
    return problems


class FaultRun:
    def __init__(self, db: Path | str, seed: int, figures: Figures) -> None:
        self.rng = random.Random(seed)
        self.responder = FaultyResponder(seed)
        self.agent = StelloAgent(
            model=SlowableModel(respond=self.responder),
            storage=db,
            tools=[*sc.tools(), explode],
            consolidate_fn=sc.consolidate,
            integrate_fn=sc.Integrator(0),
            model_timeout=TIMEOUT,
            model_retry=RETRY,
        )
        self.figures = figures
        self.acks: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.insights = 0

    def turn(self, n: int, sid: str) -> None:
        a, s = self.agent, self.agent.storage
        text = f"t-{n}"
        if self.rng.random() < 0.3 and s.get_session(sid).role == "standard":  # type: ignore[union-attr]
            self.insights += 1
            s.put_insight(sid, f"ins-0-{self.insights}-0")
        insight, records, turns = s.get_insight(sid), s.count_records(sid), s.get_turn_count(sid)
        outcome = "ok"
        try:
            if self.rng.random() < 0.5:
                content = a.turn(sid, text).content
            else:
                content = asyncio.run(a.aturn(sid, text)).content
            self.acks.append({"op": "turn", "sid": sid, "text": text, "reply": content,
                              "saw": sc.saw_tags(content)})  # fmt: skip
            if insight is not None and sc.saw_tags(content) != [insight]:
                self.problems.append(f"{text}: insight {insight} not shown")
        except (ModelCallError, ToolRoundLimitError) as exc:
            outcome = type(exc).__name__
            after = s.get_insight(sid), s.count_records(sid), s.get_turn_count(sid)
            if after != (insight, records, turns):
                self.problems.append(f"{text}: failed with {outcome} but changed {after}")
        self.figures.add(f"turns: {outcome}")
        self.problems += retry_problems(text, self.responder.log[text], outcome)


@pytest.fixture(params=["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """The test's database: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "postgres":
        return POSTGRES.dsn_for(tmp_path)
    return tmp_path / "faults.db"


def test_model_and_tool_faults(database: Path | str, seed: int, figures: Figures) -> None:
    db = database
    run = FaultRun(db, seed, figures)
    try:
        a = run.agent
        sessions = [a.main_session_id, *(a.fork(a.main_session_id, f"s{i}").id for i in range(4))]
        for n in range(TURNS):
            run.turn(n, run.rng.choice(sessions))
    finally:
        run.agent.close()
    kinds = Counter(kind for log in run.responder.log.values() for _, kind in log)
    for kind in KINDS:
        figures.set(f"faults: {kind}", kinds[kind])
    figures.set("model calls", sum(kinds.values()))
    assert all(kinds[k] > 0 for k in KINDS), kinds
    snap = Snapshot.read(db)
    problems = run.problems + integrity_problems(db) + structural_problems(snap, strict=False)
    found, checked = ack_problems(snap, run.acks)
    figures.add("acknowledged operations checked", checked)
    assert not problems + found, "\n".join((problems + found)[:40])


# -- memory functions -----------------------------------------------------------------------
class FaultyMemory:
    """Consolidate and integrate functions that fail (raise or return garbage) on a share."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls = 0
        self.integrator = sc.Integrator(0)
        self.injected: Counter[str] = Counter()

    def _pick(self, options: tuple[str, ...]) -> str:
        self.calls += 1
        d = sc.digest(self.seed, self.calls)
        kind = "ok" if d % 100 >= 40 else options[(d // 100) % len(options)]
        self.injected[kind] += 1
        return kind

    def consolidate(self, current: str | None, records: list[BaseMessage]) -> Any:
        kind = self._pick(("raise", "not text", "empty", "blank"))
        if kind == "raise":
            raise RuntimeError("summariser down")
        garbage: dict[str, Any] = {"not text": 42, "empty": "", "blank": "  \n"}
        return garbage[kind] if kind in garbage else sc.consolidate(current, records)

    def integrate(self, children: list[ChildL2], current: str | None) -> Any:
        kind = self._pick(("raise", "text", "empty synthesis", "bad mapping", "unknown ids"))
        if kind == "raise":
            raise TimeoutError("integrator timed out")
        if kind == "text":
            return "a synthesis, but not an IntegrationResult"
        if kind == "empty synthesis":
            return IntegrationResult(synthesis=" ")
        if kind == "bad mapping":
            return {"synthesis": "s", "insights": "not a mapping"}
        result = self.integrator(children, current)
        if kind == "unknown ids":  # accepted: insights for ids that were not inputs are dropped
            return {"synthesis": result.synthesis, "insights": {"no-such-session": "x"}}
        return result


def _memory_state(agent: StelloAgent) -> list[Any]:
    s = agent.storage
    return [
        (m.id, s.get_memory(m.id), s.get_memory_through(m.id), s.get_insight(m.id))
        for m in s.list_sessions()
    ]


def test_memory_function_faults(database: Path | str, seed: int, figures: Figures) -> None:
    rng = random.Random(seed)
    memory = FaultyMemory(seed)
    agent = StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=database,
        tools=sc.tools(),
        consolidate_fn=memory.consolidate,
        integrate_fn=memory.integrate,
    )
    acks: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        children = [agent.fork(agent.main_session_id, f"s{i}").id for i in range(4)]
        for n in range(MEMORY_OPS):
            sid = rng.choice(children)
            agent.turn(sid, f"m-{n}")
            before = _memory_state(agent)
            use_async = rng.random() < 0.5
            try:
                if rng.random() < 0.5:
                    l2 = (
                        asyncio.run(agent.aconsolidate(sid))
                        if use_async
                        else agent.consolidate(sid)
                    )
                    acks.append({"op": "consolidate", "sid": sid, "covers": sc.l2_count(l2)})
                else:
                    result = asyncio.run(agent.aintegrate()) if use_async else agent.integrate()
                    acks.append({"op": "integrate", "synthesis": result.synthesis,
                                 "insights": result.insights})  # fmt: skip
                figures.add("memory calls: ok")
            except (
                ConsolidationError,
                IntegrationError,
                IntegrationSupersededError,
                NothingToIntegrateError,
            ) as exc:
                figures.add(f"memory calls: {type(exc).__name__}")
                if _memory_state(agent) != before:
                    problems.append(f"{type(exc).__name__} ({exc}) changed the stored memory")
    finally:
        agent.close()
    figures.set("faults injected", dict(memory.injected))
    snap = Snapshot.read(database)
    found, checked = ack_problems(snap, acks)
    figures.add("acknowledged operations checked", checked)
    problems += structural_problems(snap, strict=False) + found
    assert not problems, "\n".join(problems[:40])


# -- background work ------------------------------------------------------------------------
def test_background_failures_are_retried_and_reported(
    database: Path | str, seed: int, figures: Figures
) -> None:
    """Consolidating a doomed session always fails: every job on it must make exactly
    `retry_attempts` calls, then leave one failure and one `background_error` event."""
    attempts = 3
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    doomed: set[str] = set()

    def consolidate(current: str | None, records: list[BaseMessage]) -> str:
        text = next(m.text for m in records if m.type == "human")
        owner = text.split("/")[0]
        with lock:
            calls[owner] += 1
        if owner in doomed:
            raise RuntimeError(f"cannot summarise {owner}")
        return sc.consolidate(current, records)

    events: list[StelloEvent] = []
    agent = StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=database,
        tools=sc.tools(),
        consolidate_fn=consolidate,
        integrate_fn=sc.Integrator(0),
        schedule=Schedule(
            consolidate_every_n_turns=1, integrate_after_consolidate=True,
            retry_attempts=attempts, retry_backoff=0.001, max_concurrency=2,
        ),
    )  # fmt: skip
    agent.subscribe(events.append)
    rng = random.Random(seed)
    try:
        labels = [f"b{i}" for i in range(6)]
        ids = {label: agent.fork(agent.main_session_id, label).id for label in labels}
        doomed.update(labels[:2])
        for n in range(count("background_turns", ci=40, full=200)):
            label = rng.choice(labels)
            agent.turn(ids[label], f"{label}/{n}")  # never fails, whatever the background does
            assert agent.drain(30)  # one job at a time: calls can be counted per job
    finally:
        agent.close()
    failures = agent.failures()
    errors = [e for e in events if e.type == "background_error"]
    assert {f.session_id for f in failures} == {ids[label] for label in doomed}
    assert all(f.attempts == attempts and f.kind == "consolidate" for f in failures)
    assert len(errors) == len(failures)
    for label in doomed:
        jobs = len(agent.failures(ids[label]))
        assert calls[label] == attempts * jobs, (label, calls[label], jobs)
    for label in set(labels) - doomed:
        assert agent.failures(ids[label]) == []
    figures.set("background jobs failed", len(failures))
    figures.set("background calls", sum(calls.values()))
    snap = Snapshot.read(database)
    problems = structural_problems(snap)
    assert not problems, "\n".join(problems[:40])
    for label in doomed:
        assert snap.sessions[ids[label]].memory is None


# -- the database: a full disk, a file gone read-only, a server gone away -------------------
class DatabaseFaults:
    """Makes the agent's database fail for the storage and the checkpointer alike, and mends
    it: on SQLite the disk fills (the file cannot grow by a page) or the file turns
    read-only, for both of the agent's connections; on PostgreSQL the server ends every
    connection (as a restart does)."""

    def __init__(self, database: Path | str) -> None:
        self.database = database
        self.postgres = isinstance(database, str)
        self.conns: list[sqlite3.Connection] = []
        if not self.postgres:  # the storage's connection, given to it (`SqliteMainStorage`)
            self.conns.append(
                sqlite3.connect(database, check_same_thread=False, isolation_level=None)
            )

    def storage(self) -> Any:
        if self.postgres:
            return self.database  # a URL: the agent opens the storage and the checkpointer
        return SqliteMainStorage(self.conns[0])

    def watch(self, agent: StelloAgent) -> None:
        if not self.postgres:
            assert isinstance(agent.checkpointer, StelloSqliteSaver)
            self.conns.append(agent.checkpointer.conn)

    def kinds(self) -> tuple[str, ...]:
        return ("gone",) if self.postgres else ("full", "read-only")

    def inject(self, kind: str) -> None:
        if kind == "gone":
            import psycopg

            with psycopg.connect(str(self.database), autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                )
            return
        for conn in self.conns:
            if kind == "full":
                size = conn.execute("PRAGMA page_count").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count = {size}")
            else:
                conn.execute("PRAGMA query_only = ON")

    def mend(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(sqlite3.ProgrammingError):  # closed with the agent
                conn.execute("PRAGMA max_page_count = 1073741823")
                conn.execute("PRAGMA query_only = OFF")


def _database_cause(error: BaseException) -> BaseException | None:
    """The database's own error behind `error`, following its causes."""
    import psycopg

    seen = error.__cause__
    while seen is not None and not isinstance(seen, sqlite3.Error | psycopg.Error):
        seen = seen.__cause__
    return seen


def _turn_after(agent: StelloAgent, sid: str, attempt: int) -> None:
    text = f"after-{sid}"  # the same text on every attempt: a retry stores it once
    assert agent.turn(sid, text).content.startswith(f"re:{text}")


def test_database_failures_reach_the_caller_typed(
    database: Path | str, seed: int, figures: Figures
) -> None:
    rng = random.Random(seed)
    faults = DatabaseFaults(database)
    agent = StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=faults.storage(),
        tools=sc.tools(),
        consolidate_fn=sc.consolidate,
        integrate_fn=sc.Integrator(0),
    )
    faults.watch(agent)
    problems: list[str] = []
    sessions = [
        agent.main_session_id,
        *(agent.fork(agent.main_session_id, f"f{i}").id for i in range(3)),
    ]

    def attempt(name: str, op: Any) -> None:
        try:
            op()
            figures.add(f"{name}: ok")
        except NothingToIntegrateError:
            figures.add(f"{name}: nothing to integrate")
        except StorageError as exc:
            figures.add(f"{name}: {type(exc).__name__}")
            if _database_cause(exc) is None:
                problems.append(f"{name}: {type(exc).__name__} without the database's error: {exc}")
        except Exception as exc:
            problems.append(f"{name}: untyped {type(exc).__module__}.{type(exc).__name__}: {exc}")

    try:
        for n in range(STORAGE_FAULT_OPS):
            kind = rng.choice(faults.kinds()) if rng.random() < 0.3 else None
            if kind is not None:
                faults.inject(kind)
                figures.add(f"faults: {kind}")
            sid, text = rng.choice(sessions), f"sf-{n}-" + "x" * rng.choice((10, 20_000))
            what = rng.random()
            if what < 0.4:
                attempt("turns", partial(agent.turn, sid, text))
            elif what < 0.7:
                attempt("turns", lambda sid=sid, text=text: asyncio.run(agent.aturn(sid, text)))
            elif what < 0.8:
                attempt("forks", partial(agent.fork, sid, f"fork-{n}"))
            elif what < 0.9 and sid != agent.main_session_id:
                attempt("consolidations", partial(agent.consolidate, sid))
            else:
                attempt("integrations", agent.integrate)
            faults.mend()
        # mended, everything works again: a connection the server ended is reported once, by
        # whichever holds it (the storage's own connection, the checkpointer's pool: a failure
        # there checks the pool's other connections), then replaced. Which call meets it
        # depends on which connection the pool hands out first, so count them. A retry sends
        # the same text: an error means nothing of the turn was stored, so no turn is stored
        # twice (the integrity checks below count them).
        lost_after = 0
        ops: list[tuple[str, Any]] = [("reads", lambda n: agent.storage.get_tree())]
        ops += [(sid, partial(_turn_after, agent, sid)) for sid in sessions]
        for name, op in ops:
            for n in range(3):
                try:
                    op(n)
                    break
                except StorageUnavailableError as exc:
                    if _database_cause(exc) is None:
                        problems.append(f"{name}: {exc} without the database's error")
                    lost_after += 1
            else:
                problems.append(f"{name}: nothing succeeded after the faults were mended")
        figures.set("lost connections reported after the faults", lost_after)
        assert lost_after <= 2, f"{lost_after} lost connections reported after the faults"
        faults.inject(faults.kinds()[-1])
        attempt("close", agent.close)
    finally:
        faults.mend()
        agent.close()
        for conn in faults.conns[:1]:
            conn.close()
    failed = sum(v for k, v in figures.values.items() if k.endswith("Error"))
    if faults.postgres:
        # the server ends connections between operations, where they are idle: each is
        # replaced before its next use, so an operation meets the fault only when the
        # server's goodbye had not arrived yet (then typed, as checked above)
        assert figures.values.get("faults: gone", 0) > 0, figures.values
    else:
        assert failed > 0, figures.values  # the faults did reach operations
    snap = Snapshot.read(database)
    problems += integrity_problems(database) + structural_problems(snap, strict=False)
    assert not problems, "\n".join(problems[:40])
