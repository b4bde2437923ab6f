"""Bad-input suite: a table of wrong calls across the public API (and the CLI, once it exists).

Each case runs on its own copy of a prepared database. It must raise the typed error of the
table with a message that names the problem, and a dump of the database (`iterdump()`, the
LangGraph checkpoint tables included) must be the same before and after. Files that are not
usable databases must be left byte for byte as they were.

A second table holds odd inputs that are *valid* (SQL metacharacters, odd unicode): each is
stored and read back exactly.
"""

from __future__ import annotations

import inspect
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from stello_graph import (
    DuplicateSessionError,
    ForeignDatabaseError,
    ForkProfile,
    FunctionNotConfiguredError,
    InvalidInputError,
    MainSession,
    MainSessionExistsError,
    MainSessionForkError,
    ModelCallError,
    NodeHasChildrenError,
    NodeNotFoundError,
    NotADatabaseError,
    NothingToIntegrateError,
    Schedule,
    SchemaVersionError,
    Session,
    SessionArchivedError,
    SessionNotFoundError,
    StelloAgent,
    StelloError,
    TopologyCycleError,
    TopologyNode,
)
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.errors import DamagedDataError
from stello_graph.export import export_tree
from stello_graph.inspector._views import tree_nodes, tree_view
from stello_graph.testing import ScriptedChatModel
from tests._helpers import corrupt_pages, settle
from tests._postgres import POSTGRES
from tests.reliability import _scenario as sc
from tests.reliability.conftest import Figures
from tests.storage.test_damaged_rows import DAMAGES, make_tree

pytestmark = pytest.mark.reliability

TEN_MB = "x" * (10 * 1024 * 1024)


@dataclass
class World:
    """An agent on a prepared database: main -> (child -> grandchild, zed [archived])."""

    path: Path
    agent: StelloAgent
    main: str
    child: str
    grandchild: str
    zed: str

    @property
    def storage(self) -> SqliteMainStorage:
        storage = self.agent.storage
        assert isinstance(storage, SqliteMainStorage)
        return storage


REVIEWER = ForkProfile(name="reviewer", system_prompt="You review {topic}.")


def open_agent(path: Path | str) -> StelloAgent:
    return StelloAgent(
        model=ScriptedChatModel(respond=sc.respond),
        storage=path,
        tools=sc.tools(),
        consolidate_fn=sc.consolidate,
        integrate_fn=sc.Integrator(0),
        profiles=[REVIEWER],
    )


def prepare(path: Path, *, memory: bool) -> dict[str, str]:
    """Build a world; `memory=False` leaves every child without an L2 (nothing to integrate)."""
    with open_agent(path) as a:
        child = a.fork(a.main_session_id, "Child").id
        grandchild = a.fork(child, "Grandchild").id
        zed = a.fork(a.main_session_id, "Zed").id
        for sid in (a.main_session_id, child, grandchild, zed):
            a.turn(sid, f"u-0-{sid}")
        a.archive(zed)
        if memory:
            a.consolidate(child)
            a.consolidate(grandchild)
            a.integrate()
        return {"main": a.main_session_id, "child": child, "grandchild": grandchild, "zed": zed}


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("worlds")
    return {
        name: (root / f"{name}.db", prepare(root / f"{name}.db", memory=name == "tree"))
        for name in ("tree", "no-memory")
    }


@pytest.fixture
def world_factory(
    prepared: dict[str, tuple[Path, dict[str, str]]], tmp_path: Path
) -> Iterator[Callable[[str], World]]:
    opened: list[StelloAgent] = []

    def make(name: str) -> World:
        source, ids = prepared[name]
        path = tmp_path / f"{name}.db"
        shutil.copy(source, path)
        agent = open_agent(path)
        opened.append(agent)
        return World(path, agent, **ids)

    yield make
    for agent in opened:
        agent.close()


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[World], Any]
    error: type[BaseException]
    match: str
    world: str = "tree"
    failed_turn: str | None = None
    """For a turn that fails at its model call (a bad reply): its session. As after any
    failed model call, its lease's fencing token has moved and its thread keeps the run's
    input and the error; the tree (`export_tree`, records included) is unchanged, and no
    checkpoint holds the reply."""


def assert_no_reply_checkpointed(agent: StelloAgent, session_id: str) -> None:
    """No checkpoint of the session's thread holds a reply that calls tools (the refused
    reply is the only one these worlds' threads would hold)."""
    saver = agent.checkpointer
    assert saver is not None
    for kept in saver.list(agent.config(session_id)):
        held = [kept.checkpoint["channel_values"].get("pending") or []]
        held += [value for _, channel, value in kept.pending_writes or () if channel == "pending"]
        messages = [m for value in held for m in (value if isinstance(value, list) else [value])]
        assert not any(getattr(m, "tool_calls", None) for m in messages), messages


def _tool_result(w: World) -> Any:
    return Session.load(w.child, w.storage).send_tool_results(
        [ToolMessage("42", tool_call_id="never-asked")]
    )


def nested(levels: int) -> Any:
    """`levels` dicts inside each other (built without recursion)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


DEEP = nested(100_000)
DEEP_LIST: Any = "leaf"
for _ in range(100_000):
    DEEP_LIST = [DEEP_LIST]


def deep_tool_args(backend: str | Path, session_id: str, mode: str) -> Any:
    """A turn whose model calls `lookup` with arguments 400 levels deep (an agent of its own
    on the same database, closed after the call)."""
    model = ScriptedChatModel([ScriptedChatModel.tool_call("lookup", {"key": nested(400)})])
    agent = StelloAgent(model=model, storage=backend, tools=sc.tools())
    if mode == "sync":
        try:
            return agent.turn(session_id, "look it up")
        finally:
            agent.close()

    async def run() -> Any:
        try:
            return await agent.aturn(session_id, "look it up")
        finally:
            await agent.aclose()

    return run()


CASES: list[Case] = [
    # -- turns ----------------------------------------------------------------------------
    Case("turn on an unknown session", lambda w: w.agent.turn("nope", "hi"),
         SessionNotFoundError, "'nope' does not exist"),
    Case("turn on an archived session", lambda w: w.agent.turn(w.zed, "hi"),
         SessionArchivedError, "is archived"),
    Case("async turn on an unknown session", lambda w: w.agent.aturn("nope", "hi"),
         SessionNotFoundError, "'nope' does not exist"),
    Case("stream on an archived session", lambda w: w.agent.stream(w.zed, "hi"),
         SessionArchivedError, "is archived"),
    Case("empty text", lambda w: w.agent.turn(w.child, ""),
         InvalidInputError, "text is empty or only whitespace"),
    Case("whitespace text", lambda w: w.agent.turn(w.child, " \n\t "),
         InvalidInputError, "text is empty or only whitespace"),
    Case("10 MB text", lambda w: w.agent.turn(w.child, TEN_MB),
         InvalidInputError, "the limit is 1,000,000"),
    Case("text of the wrong type", lambda w: w.agent.turn(w.child, 123),  # type: ignore[arg-type]
         InvalidInputError, "text must be a str, got int"),
    Case("session id of the wrong type", lambda w: w.agent.turn(None, "hi"),  # type: ignore[arg-type]
         InvalidInputError, "session id must be a str, got NoneType"),
    Case("text with a lone surrogate", lambda w: w.agent.turn(w.child, "bad \ud800 text"),
         InvalidInputError, "lone surrogate"),
    Case("resume with nothing in flight", lambda w: w.agent.resume(w.child),
         InvalidInputError, "no turn in flight"),
    Case("resume an unknown session", lambda w: w.agent.aresume("nope"),
         SessionNotFoundError, "'nope' does not exist"),
    # -- forks ----------------------------------------------------------------------------
    Case("fork from an unknown session", lambda w: w.agent.fork("nope", "x"),
         SessionNotFoundError, "'nope' does not exist"),
    Case("fork from an archived session", lambda w: w.agent.fork(w.zed, "x"),
         SessionArchivedError, "refuses a fork"),
    Case("label too long", lambda w: w.agent.fork(w.child, "L" * 201),
         InvalidInputError, "label has 201 characters; the limit is 200"),
    Case("label with a newline", lambda w: w.agent.fork(w.child, "two\nlines"),
         InvalidInputError, "control character '\\n'"),
    Case("label with NUL", lambda w: w.agent.afork(w.child, "nul\x00"),
         InvalidInputError, "control character '\\x00'"),
    Case("label of the wrong type", lambda w: w.agent.fork(w.child, 42),  # type: ignore[arg-type]
         InvalidInputError, "label must be a str, got int"),
    Case("unknown fork option", lambda w: w.agent.fork(w.child, "x", colour="red"),  # type: ignore[call-arg]
         InvalidInputError, "Unknown fork option(s) ['colour']"),
    Case("unknown fork context", lambda w: w.agent.fork(w.child, "x", context="all"),  # type: ignore[arg-type]
         InvalidInputError, "context must be 'none', 'inherit', 'compress' or a function"),
    Case("tags as a string", lambda w: w.agent.fork(w.child, "x", tags="a,b"),
         InvalidInputError, "tags must be a list or tuple of strings, got str"),
    Case("blank tag", lambda w: w.agent.fork(w.child, "x", tags=["ok", " "]),
         InvalidInputError, "tag is empty or only whitespace"),
    Case("metadata not JSON", lambda w: w.agent.fork(w.child, "x", metadata={"f": object()}),
         InvalidInputError, "metadata must be JSON-serialisable"),
    Case("metadata key not a string", lambda w: w.agent.fork(w.child, "x", metadata={1: 2}),  # type: ignore[dict-item]
         InvalidInputError, "metadata keys must be strings, got 1"),
    Case("fork onto an existing id", lambda w: w.agent.fork(w.main, "x", id=w.child),
         DuplicateSessionError, "already exists"),
    Case("10 MB system prompt", lambda w: w.agent.fork(w.child, "x", system_prompt=TEN_MB),
         InvalidInputError, "system_prompt has 10,485,760 characters"),
    Case("main session forked directly", lambda w: MainSession.load(w.storage).fork("x"),
         MainSessionForkError, "does not fork"),
    # -- archive, consolidate, integrate ----------------------------------------------------
    Case("archive the main session", lambda w: w.agent.archive(w.main),
         InvalidInputError, "main session cannot be archived"),
    Case("archive an unknown session", lambda w: w.agent.aarchive("nope"),
         SessionNotFoundError, "'nope' does not exist"),
    Case("consolidate the main session", lambda w: w.agent.consolidate(w.main),
         InvalidInputError, "it does not consolidate"),
    Case("consolidate an unknown session", lambda w: w.agent.aconsolidate("nope"),
         SessionNotFoundError, "'nope' does not exist"),
    Case("consolidate an archived session", lambda w: w.agent.consolidate(w.zed),
         SessionArchivedError, "refuses consolidation"),
    Case("consolidate with no function", lambda w: Session.load(w.child, w.storage).consolidate(),
         FunctionNotConfiguredError, "has no consolidate function"),
    Case("integrate with no function", lambda w: MainSession.load(w.storage).integrate(),
         FunctionNotConfiguredError, "no integrate function"),
    Case("integrate with no child L2", lambda w: w.agent.integrate(),
         NothingToIntegrateError, "No active child session has an L2", world="no-memory"),
    # -- sessions -------------------------------------------------------------------------
    Case("second main session", lambda w: MainSession.create(w.storage),
         MainSessionExistsError, "already has a main session"),
    Case("session created on a taken id", lambda w: Session.create(w.storage, id=w.child),
         DuplicateSessionError, "already exists"),
    Case("main session loaded as a child", lambda w: Session.load(w.main, w.storage),
         InvalidInputError, "has role 'main'; load it with MainSession.load()"),
    Case("tool results answering nothing", _tool_result,
         InvalidInputError, "do not answer the open tool calls"),
    Case("meta update of an archived session",
         lambda w: Session.load(w.zed, w.storage).update_meta(label="new"),
         SessionArchivedError, "refuses a meta update"),
    Case("blank insight", lambda w: Session.load(w.child, w.storage).set_insight("  "),
         InvalidInputError, "insight is empty or only whitespace"),
    # -- topology and storage -------------------------------------------------------------
    Case("move a node under its own descendant",
         lambda w: w.storage.put_node(TopologyNode(id=w.child, parent_id=w.grandchild)),
         TopologyCycleError, "one of its descendants"),
    Case("move a node under itself",
         lambda w: w.storage.put_node(TopologyNode(id=w.child, parent_id=w.child)),
         TopologyCycleError, "itself or one of its descendants"),
    Case("move the root under a child",
         lambda w: w.storage.put_node(TopologyNode(id=w.main, parent_id=w.child)),
         TopologyCycleError, "one of its descendants"),
    Case("move under a missing parent",
         lambda w: w.storage.put_node(TopologyNode(id=w.child, parent_id="ghost")),
         NodeNotFoundError, "'ghost' does not exist"),
    Case("node for a missing session", lambda w: w.storage.put_node(TopologyNode(id="ghost")),
         SessionNotFoundError, "'ghost' does not exist"),
    Case("remove the main node without cascade", lambda w: w.storage.remove_node(w.main),
         NodeHasChildrenError, "child node(s); pass cascade=True"),
    Case("remove an unknown node", lambda w: w.storage.aremove_node("ghost", cascade=True),
         NodeNotFoundError, "'ghost' does not exist"),
    Case("records for an unknown session",
         lambda w: w.storage.append_records("nope", [HumanMessage("x")]),
         SessionNotFoundError, "'nope' does not exist"),
    Case("records that are not messages",
         lambda w: w.storage.append_records(w.child, ["hi"]),  # type: ignore[list-item]
         InvalidInputError, "messages[0] must be a BaseMessage, got str"),
    Case("unknown record role", lambda w: w.storage.list_records(w.child, role="robot"),
         InvalidInputError, "Unknown record role 'robot'"),
    Case("negative page size", lambda w: w.storage.list_records(w.child, limit=-1),
         InvalidInputError, "limit must be zero or more, got -1"),
    Case("global value not JSON", lambda w: w.storage.put_global("k", {1, 2}),
         InvalidInputError, "must be JSON-serialisable"),
    Case("empty global key", lambda w: w.storage.aput_global("", 1),
         InvalidInputError, "key must not be empty"),
    Case("memory cursor of the wrong type",
         lambda w: w.storage.put_memory(w.child, "m", through="3"),  # type: ignore[arg-type]
         InvalidInputError, "through must be an int, got str"),
    # -- configuration --------------------------------------------------------------------
    Case("negative max_tool_rounds",
         lambda w: StelloAgent(model=ScriptedChatModel(), storage=w.path, max_tool_rounds=-1),
         InvalidInputError, "max_tool_rounds must be an int >= 0, got -1"),
    Case("zero model_timeout",
         lambda w: StelloAgent(model=ScriptedChatModel(), storage=w.path, model_timeout=0),
         InvalidInputError, "model_timeout must be a number of seconds > 0"),
    Case("schedule every 0 turns", lambda w: Schedule(consolidate_every_n_turns=0),
         InvalidInputError, "consolidate_every_n_turns must be a positive int"),
    Case("empty tree id", lambda w: SqliteMainStorage(w.path, tree_id=""),
         InvalidInputError, "tree_id must not be empty"),
    Case("tree id with NUL",
         lambda w: StelloAgent(model=ScriptedChatModel(), storage=w.path, tree_id="a\x00"),
         InvalidInputError, "contains the control character '\\x00'"),
    Case("tree id with a newline", lambda w: SqliteMainStorage(w.path, tree_id="a\nb"),
         InvalidInputError, "contains the control character '\\n'"),
    Case("tree id of 257 characters",
         lambda w: StelloAgent(model=ScriptedChatModel(), storage=w.path, tree_id="t" * 257),
         InvalidInputError, "has 257 characters; the limit is 256"),
    # -- the tree API -----------------------------------------------------------------------
    Case("agent move that makes a cycle", lambda w: w.agent.move(w.child, w.grandchild),
         TopologyCycleError, "one of its descendants"),
    Case("agent moves the main session", lambda w: w.agent.move(w.main, w.child),
         InvalidInputError, "main session"),
    Case("agent removes the main session", lambda w: w.agent.remove(w.main, cascade=True),
         InvalidInputError, "main session"),
    Case("agent removes a node with children", lambda w: w.agent.remove(w.child),
         NodeHasChildrenError, "cascade=True"),
    Case("tree integration with an unknown mode", lambda w: w.agent.integrate(mode="up"),  # type: ignore[call-overload]
         InvalidInputError, "mode must be 'flat' or 'tree'"),
    Case("fork with an unknown profile", lambda w: w.agent.fork(w.main, "x", profile="nope"),
         StelloError, "Unknown fork profile 'nope'"),
    Case("tree read of an unknown node", lambda w: w.agent.children("nope"),
         NodeNotFoundError, "'nope' does not exist"),
    Case("async ancestors of an unknown node", lambda w: w.agent.aancestors("nope"),
         NodeNotFoundError, "'nope' does not exist"),
    Case("siblings of an unknown node", lambda w: w.agent.asiblings("nope"),
         NodeNotFoundError, "'nope' does not exist"),
    Case("skills of an unknown session", lambda w: w.agent.skills_of("nope"),
         SessionNotFoundError, "'nope' does not exist"),
    # -- fork options applied after the fork, and options that need another ----------------
    Case("fork with a model that is not a chat model",
         lambda w: w.agent.fork(w.child, "x", model=42),  # type: ignore[arg-type]
         InvalidInputError, "model must be a LangChain chat model"),
    Case("fork with tools as a string", lambda w: w.agent.afork(w.child, "x", tools="abc"),
         InvalidInputError, "tools must be a list or tuple of tools, got str"),
    Case("fork with a tool that is not a tool", lambda w: w.agent.fork(w.child, "x", tools=[42]),
         InvalidInputError, "tools[0] must be a LangChain tool or a callable, got 42"),
    Case("fork with a non-bool inherit_system_prompt",
         lambda w: w.agent.fork(w.main, "x", inherit_system_prompt="yes"),  # type: ignore[arg-type]
         InvalidInputError, "inherit_system_prompt must be a bool or None, got 'yes'"),
    Case("fork with profile_vars and no profile",
         lambda w: w.agent.afork(w.child, "x", profile_vars={"topic": "t"}),
         InvalidInputError, "profile_vars were given without a profile"),
    # -- checks that used to come after a first write ---------------------------------------
    Case("batch consolidation including the main session",
         lambda w: w.agent.consolidate_many([w.child, w.grandchild, w.main]),
         InvalidInputError, "it does not consolidate", world="no-memory"),
    Case("async batch consolidation including an unknown id",
         lambda w: w.agent.aconsolidate_many([w.child, "nope"]),
         SessionNotFoundError, "'nope' does not exist", world="no-memory"),
    Case("tool_choice naming no tool of the session",
         lambda w: w.agent.turn(w.child, "hi", tool_choice="nope"),
         InvalidInputError, "'nope' names no tool of session"),
    Case("tool_choice whose function name is not a string",
         lambda w: w.agent.aturn(w.child, "hi",
                                 tool_choice={"type": "function", "function": {"name": 5}}),
         InvalidInputError, "tool_choice must name its tool with a non-empty string"),
    Case("tool_choice dict without string keys",
         lambda w: w.agent.turn(w.child, "hi", tool_choice={1: "lookup"}),  # type: ignore[dict-item]
         InvalidInputError, "tool_choice as a dict needs string keys"),
    # -- nesting depth ----------------------------------------------------------------------
    Case("metadata 100,000 levels deep", lambda w: w.agent.fork(w.child, "x", metadata=DEEP),
         InvalidInputError, "metadata nests dicts and lists more than 64 levels deep"),
    Case("metadata 65 levels deep", lambda w: w.agent.afork(w.child, "x", metadata=nested(65)),
         InvalidInputError, "metadata nests dicts and lists more than 64 levels deep"),
    Case("tags 100,000 levels deep", lambda w: w.agent.fork(w.child, "x", tags=DEEP_LIST),
         InvalidInputError, "tags nests dicts and lists more than 64 levels deep"),
    Case("profile_vars 100,000 levels deep",
         lambda w: w.agent.fork(w.child, "x", profile="reviewer", profile_vars=DEEP),
         InvalidInputError, "profile_vars nests dicts and lists more than 64 levels deep"),
    Case("a profile variable 100,000 levels deep",
         lambda w: w.agent.afork(w.child, "x", profile="reviewer", profile_vars={"topic": DEEP}),
         InvalidInputError, "profile_vars nests dicts and lists more than 64 levels deep"),
    Case("meta update with deep metadata",
         lambda w: Session.load(w.child, w.storage).update_meta(metadata=DEEP),
         InvalidInputError, "metadata nests dicts and lists more than 64 levels deep"),
    Case("global value 100,000 levels deep", lambda w: w.storage.put_global("k", DEEP),
         InvalidInputError, "nests dicts and lists more than 64 levels deep"),
    Case("model tool arguments 400 levels deep", lambda w: deep_tool_args(w.path, w.child, "sync"),
         ModelCallError, "with arguments nested more than 64 levels deep", failed_turn="child"),
    Case("async model tool arguments 400 levels deep",
         lambda w: deep_tool_args(w.path, w.child, "async"),
         ModelCallError, "with arguments nested more than 64 levels deep", failed_turn="child"),
    Case("memory cursor beyond L3",
         lambda w: w.storage.put_memory(w.child, "m", through=10**6),
         InvalidInputError, "through=1000000 is beyond the"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_input_is_refused_and_changes_nothing(
    case: Case, world_factory: Callable[[str], World]
) -> None:
    w = world_factory(case.world)
    before, tree_before = dump(w.path), export_tree(w.storage, records=True)
    with pytest.raises(case.error) as caught:
        await settle(case.call(w))
    assert case.match in str(caught.value), f"{type(caught.value).__name__}: {caught.value}"
    if case.failed_turn is None:
        assert dump(w.path) == before
    else:
        assert export_tree(w.storage, records=True) == tree_before
        assert_no_reply_checkpointed(w.agent, getattr(w, case.failed_turn))


# -- the depth and shape checks on both backends ----------------------------------------------
@pytest.fixture(params=["sqlite", *(["postgres"] if POSTGRES.wanted else [])])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "postgres":
        return POSTGRES.dsn_for(tmp_path)
    return tmp_path / "backends.db"


BackendCall = Callable[[StelloAgent, str, Path | str], Any]

BACKEND_CASES: dict[str, tuple[BackendCall, type[BaseException], str]] = {
    "deep metadata": (lambda a, sid, db: a.fork(sid, "x", metadata=DEEP),
                      InvalidInputError, "metadata nests"),
    "deep tags": (lambda a, sid, db: a.afork(sid, "x", tags=DEEP_LIST),
                  InvalidInputError, "tags nests"),
    "deep profile_vars": (
        lambda a, sid, db: a.fork(sid, "x", profile="reviewer", profile_vars={"topic": DEEP}),
        InvalidInputError, "profile_vars nests"),
    "deep global": (lambda a, sid, db: a.storage.put_global("k", DEEP),
                    InvalidInputError, "nests dicts and lists"),
    "tree id with NUL": (
        lambda a, sid, db: StelloAgent(model=ScriptedChatModel(), storage=db, tree_id="t\x00"),
        InvalidInputError, "control character '\\x00'"),
    "tree id of 257 characters": (
        lambda a, sid, db: StelloAgent(model=ScriptedChatModel(), storage=db, tree_id="t" * 257),
        InvalidInputError, "the limit is 256"),
    "malformed tool_choice": (
        lambda a, sid, db: a.aturn(sid, "hi", tool_choice={"type": "function",
                                                          "function": {"name": 5}}),
        InvalidInputError, "tool_choice must name its tool"),
    "deep model tool arguments": (lambda a, sid, db: deep_tool_args(db, sid, "sync"),
                                  ModelCallError, "nested more than 64 levels deep"),
    "async deep model tool arguments": (lambda a, sid, db: deep_tool_args(db, sid, "async"),
                                        ModelCallError, "nested more than 64 levels deep"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BACKEND_CASES))
async def test_deep_and_malformed_input_on_each_backend(
    database: Path | str, case: str, figures: Figures
) -> None:
    """The depth, tree id and tool_choice cases on SQLite and PostgreSQL: refused, the
    database unchanged (a failed model call moves its lease's fencing token and keeps the
    run's input checkpoint, as any failed model call does: there the tree is compared, and
    no checkpoint may hold the reply)."""
    call, error, match = BACKEND_CASES[case]
    agent = open_agent(database)
    try:
        child = agent.fork(agent.main_session_id, "Child").id
        agent.turn(child, f"u-0-{child}")
        before, tree_before = raw_dump(database), export_tree(agent.storage, records=True)
        with pytest.raises(error, match=re.escape(match)):
            await settle(call(agent, child, database))
        if error is ModelCallError:
            assert export_tree(agent.storage, records=True) == tree_before
            assert_no_reply_checkpointed(agent, child)
        else:
            assert raw_dump(database) == before
    finally:
        agent.close()
    figures.set("backend", "sqlite" if isinstance(database, Path) else "postgres")


UNKNOWN_ID_CALLS: dict[str, Callable[[World], Any]] = {
    "turn": lambda w: w.agent.turn("nope", "hi"),
    "aturn": lambda w: w.agent.aturn("nope", "hi"),
    "stream": lambda w: w.agent.stream("nope", "hi"),
    "astream": lambda w: w.agent.astream("nope", "hi"),
    "resume": lambda w: w.agent.resume("nope"),
    "aresume": lambda w: w.agent.aresume("nope"),
    "fork": lambda w: w.agent.fork("nope", "x"),
    "afork": lambda w: w.agent.afork("nope", "x"),
    "archive": lambda w: w.agent.archive("nope"),
    "aarchive": lambda w: w.agent.aarchive("nope"),
    "consolidate": lambda w: w.agent.consolidate("nope"),
    "aconsolidate": lambda w: w.agent.aconsolidate("nope"),
    "consolidate_many": lambda w: w.agent.consolidate_many([w.child, "nope"]),
    "aconsolidate_many": lambda w: w.agent.aconsolidate_many([w.child, "nope"]),
    "set_skills": lambda w: w.agent.set_skills("nope", []),
    "skills_of": lambda w: w.agent.skills_of("nope"),
    "askills_of": lambda w: w.agent.askills_of("nope"),
    "aset_skills": lambda w: w.agent.aset_skills("nope", []),
    "as_tool": lambda w: w.agent.as_tool("nope"),
    "children": lambda w: w.agent.children("nope"),
    "achildren": lambda w: w.agent.achildren("nope"),
    "ancestors": lambda w: w.agent.ancestors("nope"),
    "aancestors": lambda w: w.agent.aancestors("nope"),
    "siblings": lambda w: w.agent.siblings("nope"),
    "asiblings": lambda w: w.agent.asiblings("nope"),
    "move": lambda w: w.agent.move("nope", w.main),
    "amove": lambda w: w.agent.amove("nope", w.main),
    "remove": lambda w: w.agent.remove("nope"),
    "aremove": lambda w: w.agent.aremove("nope"),
    "session": lambda w: w.agent.session("nope"),
    "asession": lambda w: w.agent.asession("nope"),
    "child": lambda w: w.agent.child("nope"),
    "lineage": lambda w: w.agent.lineage("nope"),
    "alineage": lambda w: w.agent.alineage("nope"),
    "digest": lambda w: w.agent.digest("nope"),
    "adigest": lambda w: w.agent.adigest("nope"),
}
"""Every `StelloAgent` operation addressed to a session, called with an id that exists nowhere."""


@pytest.mark.parametrize("name", list(UNKNOWN_ID_CALLS))
async def test_every_operation_refuses_an_unknown_id(
    name: str, world_factory: Callable[[str], World]
) -> None:
    w = world_factory("tree")
    before = dump(w.path)
    with pytest.raises(LookupError) as caught:  # SessionNotFoundError or NodeNotFoundError
        await settle(UNKNOWN_ID_CALLS[name](w))
    assert isinstance(caught.value, StelloError)
    assert "'nope'" in str(caught.value)
    assert dump(w.path) == before


def test_the_table_covers_every_operation_on_a_session(figures: Figures) -> None:
    """Every public method of `StelloAgent` that takes a session id first is in the table
    above (or named here with the reason it does not refuse an unknown id)."""
    exempt = {
        "config": "names a checkpoint thread; reads nothing",
        "failures": "an unknown id simply has no failures",
        "clear_failures": "an unknown id simply has no failures",
        "afailures": "an unknown id simply has no failures",
        "aclear_failures": "an unknown id simply has no failures",
        "hold": "a context manager: the session is checked on entering it",
        "ahold": "a context manager: the session is checked on entering it",
    }
    addressed = {
        name
        for name, member in inspect.getmembers(StelloAgent, callable)
        if not name.startswith("_")
        and list(inspect.signature(member).parameters)[1:2]
        in (["session_id"], ["source_id"], ["session_ids"])
    }
    assert addressed - set(exempt) == set(UNKNOWN_ID_CALLS)
    assert set(exempt) <= addressed
    figures.set("bad-input cases (API)", len(CASES) + len(UNKNOWN_ID_CALLS))
    figures.set("bad-file cases", len(FILE_CASES))
    figures.set("odd valid inputs", len(ODD_INPUTS))
    figures.set("CLI cases", len(CLI_CASES))


# -- files that are not usable databases ----------------------------------------------------
def _not_a_database(path: Path) -> None:
    path.write_text("These are my notes, not a database.\n" * 200)


def _newer_schema(path: Path) -> None:
    prepare(path, memory=False)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO stello_schema (version, applied_at) VALUES (99, 'future')")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()


def _app_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    conn.close()


FILE_CASES = [
    ("storage on another application's database", _app_database,
     lambda p: SqliteMainStorage(p), ForeignDatabaseError, "another application's tables"),
    ("agent on another application's database", _app_database,
     lambda p: StelloAgent(model=ScriptedChatModel(), storage=p),
     ForeignDatabaseError, "allow_foreign_tables=True"),
    ("storage on a text file", _not_a_database, lambda p: SqliteMainStorage(p),
     NotADatabaseError, "is not a SQLite database"),
    ("agent on a text file", _not_a_database,
     lambda p: StelloAgent(model=ScriptedChatModel(), storage=p),
     NotADatabaseError, "is not a SQLite database"),
    ("storage on a newer schema", _newer_schema, lambda p: SqliteMainStorage(p),
     SchemaVersionError, "schema version 99"),
    ("agent on a newer schema", _newer_schema,
     lambda p: StelloAgent(model=ScriptedChatModel(), storage=p),
     SchemaVersionError, "upgrade stello-graph"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "call", "error", "match"),
    [case[1:] for case in FILE_CASES],
    ids=[case[0] for case in FILE_CASES],
)
def test_unusable_file_is_refused_and_left_as_it_was(
    tmp_path: Path,
    make: Callable[[Path], None],
    call: Callable[[Path], Any],
    error: type[BaseException],
    match: str,
) -> None:
    path = tmp_path / "file.db"
    make(path)
    before = path.read_bytes()
    with pytest.raises(error, match=match):
        call(path)
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists()


# -- odd but valid inputs -------------------------------------------------------------------
ODD_INPUTS = [
    "'; DROP TABLE stello_sessions; --",
    'Robert"); DELETE FROM stello_nodes WHERE ("1"="1',
    "100% _done_ \\ [x] * ? %%",
    "🌳 tree of thoughts 🧠",
    "שלום עולם",  # right-to-left
    "e\u0301 vs \u00e9",  # combining accent vs precomposed
    "zero\u200bwidth\u200djoiner",
    "\ufeffBOM first",
    "ｆｕｌｌｗｉｄｔｈ",
    "a" * 200,
]


@pytest.mark.parametrize("text", ODD_INPUTS, ids=range(len(ODD_INPUTS)))
def test_odd_valid_input_round_trips(world_factory: Callable[[str], World], text: str) -> None:
    w = world_factory("tree")
    node = w.agent.fork(w.child, text, tags=[text[:100]], metadata={text: text})
    meta = w.storage.get_session(node.id)
    assert meta is not None
    assert (meta.label, meta.tags, meta.metadata) == (text, (text[:100],), {text: text})
    assert w.storage.get_node(node.id) == TopologyNode(id=node.id, parent_id=w.child, label=text)
    assert [m.id for m in w.storage.list_sessions(tags=[text[:100]])] == [node.id]
    reply = w.agent.turn(node.id, text).content
    assert reply == f"re:{text}"
    assert w.storage.list_records(node.id)[0].content == text
    others = [m for m in w.storage.list_sessions() if not m.label.startswith("auto:")]
    assert len(others) == 5  # nothing else appeared or vanished (`auto:` forks are the model's)


# -- the CLI --------------------------------------------------------------------------------
HAS_CLI = find_spec("stello_graph.cli") is not None
RUN_CLI = "import sys; from stello_graph.cli import main; sys.exit(main())"

CLI_CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("unknown command", lambda db: ["no-such-command"], "no-such-command"),
    ("chat on a text file",
     lambda db: ["chat", "--db", str(db.with_suffix(".txt")), "--model", "scripted"],
     "not a SQLite database"),
    ("tree of a text file", lambda db: ["tree", "--db", str(db.with_suffix(".txt"))],
     "not a SQLite database"),
    ("export of a missing file", lambda db: ["export", "--db", str(db.with_suffix(".none"))],
     "no such file"),
    ("tree of an unknown tree id", lambda db: ["tree", "--db", str(db), "--tree", "nope"],
     "no tree 'nope'"),
    ("chat with no model configured", lambda db: ["chat", "--db", str(db)],
     "no chat model configured"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make_args", "match"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_cli_bad_input(
    world_factory: Callable[[str], World], make_args: Callable[[Path], list[str]], match: str
) -> None:
    w = world_factory("tree")
    w.agent.close()
    _not_a_database(w.path.with_suffix(".txt"))
    before = dump(w.path), w.path.with_suffix(".txt").read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, *make_args(w.path)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert match in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (dump(w.path), w.path.with_suffix(".txt").read_bytes()) == before


# -- damaged data -----------------------------------------------------------------------------
def raw_dump(database: Path | str) -> list[str]:
    """Every row of every table (LangGraph's included), as stored (texts that are not UTF-8
    included), in a fixed order."""
    if isinstance(database, str):
        import psycopg

        with psycopg.connect(database, autocommit=True) as server:
            tables = server.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            ).fetchall()
            found = [
                repr((table, *row))
                for (table,) in tables
                for row in server.execute(f'SELECT * FROM "{table}"').fetchall()
            ]
        return sorted(found)
    conn = sqlite3.connect(database)
    conn.text_factory = bytes
    try:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        tables = [table.decode() for (table,) in conn.execute(sql)]
        rows = [(t, row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"')]
        return sorted(repr((table, *row)) for table, row in rows)
    finally:
        conn.close()


@pytest.mark.parametrize("damage", list(DAMAGES))
async def test_damaged_rows_leave_the_tree_readable(
    database: Path | str, damage: str, figures: Figures
) -> None:
    """A row damaged outside stello (see `tests/storage/test_damaged_rows.py`): every whole-tree
    read, sync and async, shows every session and marks the damaged one; every read of the
    damaged session raises `DamagedDataError` naming it and the column; none of them writes."""
    t = make_tree(database)
    make, column = DAMAGES[damage]
    make(t)
    ids = {t.main, t.child, t.grandchild, t.sibling}
    before = raw_dump(database)
    with t.agent() as agent:
        s = agent.storage
        whole: dict[str, Callable[[], Any]] = {
            "tree": lambda: [n.id for n in agent.tree().nodes],
            "tree text": lambda: [r["id"] for r in agent.tree().to_dict()["nodes"]],
            "atree": lambda: agent.atree(),
            "digests": lambda: [d.id for d in agent.digests()],
            "adigests": lambda: agent.adigests(),
            "list_sessions": lambda: [m.id for m in s.list_sessions()],
            "alist_sessions": lambda: s.alist_sessions(),
            "get_tree": lambda: [n.id for n in s.get_tree()],
            "aget_tree": lambda: s.aget_tree(),
            "session stats": lambda: [x.id for x in s.list_session_stats()],
            "export": lambda: [e["id"] for e in export_tree(s, records=True)["sessions"]],
            "inspector tree": lambda: [n["id"] for n in tree_nodes(tree_view(s))],
        }
        for name, read in whole.items():
            found = await settle(read())
            if hasattr(found, "nodes"):  # a Topology
                found = [n.id for n in found.nodes]
            elif found and not isinstance(found[0], str):
                found = [getattr(x, "id", None) for x in found]
            assert set(found) == ids, name
            figures.add("whole-tree reads checked")
        marked = agent.tree().damaged
        assert list(marked) == ([] if column == "records" else [t.child])
        assert column in marked.get(t.child, (column,))
        reads: dict[str, Callable[[], Any]] = {
            "digest": lambda: agent.digest(t.child),
            **(
                {"list_records": lambda: s.list_records(t.child)}
                if column == "records"
                else {
                    "session": lambda: agent.session(t.child),
                    "asession": lambda: agent.asession(t.child),
                    "get_session": lambda: s.get_session(t.child),
                }
            ),
        }
        name = "data of its record 1" if column == "records" else column
        for what, read in reads.items() if column != "parent_id" else ():
            with pytest.raises(DamagedDataError, match=re.escape(f"column '{name}'")) as caught:
                await settle(read())
            assert t.child in str(caught.value), what
            figures.add("reads of the damaged session checked")
        assert raw_dump(database) == before  # no read wrote (nor mended) anything
        if column != "parent_id":  # refused too (on PostgreSQL its lease's token moves)
            with pytest.raises(DamagedDataError, match=re.escape(f"column '{name}'")):
                agent.turn(t.child, "hi")
        assert agent.turn(t.sibling, "still works").content == "ok"


DAMAGED_FILE_CASES: dict[str, tuple[Callable[[Path, dict[str, str]], None], int, str]] = {
    "a label that is not UTF-8": (
        lambda db, ids: _raw(db, "UPDATE stello_nodes SET label = CAST(X'FF' AS TEXT) "
                             "WHERE id = ?", ids["child"]),
        0, "[damaged: label]"),
    "tags that are not JSON": (
        lambda db, ids: _raw(db, "UPDATE stello_sessions SET tags = '[' WHERE id = ?", ids["zed"]),
        0, "[damaged: tags]"),
    "a cycle of parents": (
        lambda db, ids: _raw(db, "UPDATE stello_nodes SET parent_id = ? WHERE id = ?",
                             ids["grandchild"], ids["child"]),
        0, "[detached: its parents make a cycle]"),
    "damaged pages": (lambda db, ids: corrupt_pages(db), 2, "is damaged: PRAGMA quick_check found"),
}  # fmt: skip


def _raw(db: Path, sql: str, *params: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(sql, params)
    conn.close()


@pytest.mark.parametrize("case", list(DAMAGED_FILE_CASES))
@pytest.mark.parametrize("command", ["tree", "export"])
def test_cli_on_damaged_files(
    world_factory: Callable[[str], World], case: str, command: str, figures: Figures
) -> None:
    """`stello-graph tree` / `export` in a process of their own: damaged rows are shown marked
    (exit 0, a warning), damaged pages refused (exit 2); never a traceback, the file as it was."""
    w = world_factory("tree")
    with w.agent as agent:
        for n in range(12):  # the last pages of the file hold records
            agent.turn(w.child, f"u-0-{n}-" + "x" * 400)
    damage, code, match = DAMAGED_FILE_CASES[case]
    damage(w.path, {"main": w.main, "child": w.child, "grandchild": w.grandchild, "zed": w.zed})
    before = w.path.read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", RUN_CLI, command, "--db", str(w.path)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    if code == 0:
        assert "warning:" in done.stderr
        assert (
            match in done.stdout
            if command == "tree"
            else '"damaged"' in done.stdout or ('"detached"' in done.stdout)
        )
    else:
        assert match in done.stderr and done.stdout == ""
    assert w.path.read_bytes() == before
    figures.add("damaged-file CLI cases")
