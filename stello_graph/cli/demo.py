"""A guided, deterministic walkthrough of a topology (`stello-graph demo`, `make demo`).

Offline by default, with a scripted model, on the embedded SQLite default: a file in the
current directory (`stello-demo.db`, made afresh on each run; a file the demo did not make is
never overwritten). On PostgreSQL (`--db postgresql://...`) it fills a tree that is still
empty (`--tree ID`; nothing is ever deleted there). The flow:

1. the user asks the main session to brainstorm; the model forks three branches itself
   (its `create_session` tool calls);
2. a turn in each branch; each branch is consolidated (L3 -> L2);
3. the main session integrates the three L2 into a synthesis and pushes insights;
4. the next turn of a branch carries its insight, once;
5. the tree is printed, and its star map written next to the database.

Given a real chat model (`stello-graph demo --model NAME`), the same flow runs against it:
the model chooses its branches (the demo opens any it did not), and consolidation and
integration are made by the model too.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph.agent import StelloAgent
from stello_graph.errors import InvalidInputError
from stello_graph.models import ChildL2, IntegrationResult
from stello_graph.testing import ScriptedChatModel

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

DB = Path("stello-demo.db")
MARK = "stello:demo"
"""The global key that marks a database as made by the demo (and safe to make afresh)."""
BRANCHES = {
    "Pricing": ("Should the product have a free tier?", "Yes: a free tier capped at 3 projects."),
    "Onboarding": ("How do new users get started?", "A three-step guided setup."),
    "Growth": ("Where do the first users come from?", "Developer communities first."),
}
SYSTEM_PROMPT = (
    "You are the main session of a brainstorm. When the user asks you to plan something, "
    "call the create_session tool once for each sub-topic, then name the branches you opened "
    "in one sentence."
)
KICKOFF = (
    "Let's plan the launch of a small developer tool: open one branch each for Pricing, "
    "Onboarding and Growth."
)
FOLLOW_UP = "What should we do next?"


def _reply(messages: list[BaseMessage]) -> str:
    """The scripted assistant: answers each branch's question, acknowledges the rest."""
    question = messages[-1].text
    for asked, answer in BRANCHES.values():
        if question == asked:
            return answer
    system = " ".join(m.text for m in messages if isinstance(m, SystemMessage))
    if "<insight>" in system:
        return "Taking the main session's insight into account: the cap shows during setup."
    return "Noted."


def _summarise(current: str | None, records: list[BaseMessage]) -> str:
    return " ".join(m.text for m in records if m.type == "ai")


def _integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
    by_label = {c.label: c.session_id for c in children}
    return IntegrationResult(
        synthesis="Launch plan: " + "; ".join(f"{c.label}: {c.l2}" for c in children),
        insights={by_label["Pricing"]: "Onboarding should show the 3-project cap up front."},
    )


def _brainstorm_model() -> ScriptedChatModel:
    # One fork per tool round, so the branches are created in a fixed order (tool calls of
    # one round run in parallel, in no particular order).
    forks = [ScriptedChatModel.tool_call("create_session", {"label": label}) for label in BRANCHES]
    return ScriptedChatModel(
        [*forks, "I opened three branches: " + ", ".join(BRANCHES)], respond=_reply
    )


def _question(label: str) -> str:
    known = BRANCHES.get(label)
    return known[0] if known else f"Let's focus on {label}: what matters most? Keep it short."


def _fresh(db: Path, tree_id: str) -> None:
    """Remove a previous demo database; refuse any other file."""
    if not db.parent.is_dir():
        raise InvalidInputError(f"Cannot create {str(db)!r}: no directory {str(db.parent)!r}.")
    if db.exists() and db.stat().st_size > 0:
        from stello_graph.checkpoints import SqliteMainStorage
        from stello_graph.cli._common import probe_database

        kind, _ = probe_database(db)
        made_by_demo = False
        if kind == "stello":
            with SqliteMainStorage(db, tree_id=tree_id) as storage:
                made_by_demo = storage.get_global(MARK) is not None
        if not made_by_demo:
            raise InvalidInputError(
                f"{str(db)!r} exists and was not made by the demo; the demo starts from an "
                "empty database: name another file with --db FILE."
            )
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _indent(text: str | None) -> str:
    return (text or "(none)").strip().replace("\n", "\n          ")


def run(
    out: TextIO = sys.stdout,
    db: str | os.PathLike[str] = DB,
    *,
    model: BaseChatModel | None = None,
    tree_id: str = "default",
) -> Path:
    """Run the walkthrough, printing to `out`; return the path of the star map it wrote.

    Args:
        out: where the walkthrough is told.
        db: the database to make (a previous demo database there is replaced), or a
            `postgresql://` DSN (the star map is then written to the current directory).
        model: a chat model to run the flow against (default: the scripted one, offline).
        tree_id: the tree to fill (on PostgreSQL, one that holds no session yet).

    Raises:
        InvalidInputError: `db` exists and was not made by the demo, or the tree of a
            PostgreSQL database already holds sessions.
    """
    from stello_graph.checkpoints import is_postgres_dsn
    from stello_graph.cli._common import open_storage

    target, dsn = os.fspath(db), is_postgres_dsn(os.fspath(db))
    if not dsn:
        _fresh(Path(target), tree_id)
    storage, shown = open_storage(target, tree_id, create=True)
    with storage:
        if storage.get_main_session() is not None:  # a file is made afresh; a PostgreSQL tree
            # is never emptied
            raise InvalidInputError(
                f"Tree {tree_id!r} of {shown} already holds sessions; the demo starts from an "
                "empty tree: name another with --tree ID."
            )
        scripted = model is None
        agent = StelloAgent(
            model=_brainstorm_model() if model is None else model,
            storage=storage,
            consolidate_fn=_summarise if scripted else None,
            integrate_fn=_integrate if scripted else None,
            system_prompt=SYSTEM_PROMPT,
        )
        with agent:
            agent.storage.put_global(MARK, {"version": 1})
            svg = (DB if dsn else Path(target)).with_suffix(".svg")
            _walkthrough(agent, out, shown, svg)
    _go_on(out, shown if dsn else target, tree_id)  # a DSN without its password
    return svg


def _go_on(out: TextIO, db: str, tree_id: str) -> None:
    named = f"--db {shlex.quote(db)}"
    named += "" if tree_id == "default" else f" --tree {shlex.quote(tree_id)}"
    print(f"Go on:    stello-graph chat {named} --model scripted", file=out)
    print(f"          stello-graph tree {named}", file=out)
    print(f"          stello-graph inspect {named}   (the inspector extra)", file=out)


def _walkthrough(agent: StelloAgent, out: TextIO, shown: str, svg: Path) -> None:
    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"Database: {shown}")
    main = agent.main_session_id
    say("\n1. Brainstorm in the main session")
    say(f"   user : {KICKOFF}\n   model: {_indent(agent.turn(main, KICKOFF).content)}")
    branches = agent.storage.get_children(main)
    missing = [label for label in BRANCHES if label not in {n.label for n in branches}]
    if len(branches) < len(BRANCHES):  # a real model may not fork: open the rest ourselves
        say(f"   (the model opened {len(branches)} branch(es); the demo opens the rest)")
        branches += [agent.fork(main, label) for label in missing[: 3 - len(branches)]]
    for node in branches:
        question = _question(node.label)
        say(f"\n2. Branch {node.label!r}")
        say(f"   user : {question}\n   model: {_indent(agent.turn(node.id, question).content)}")
        say(f"   L2   : {_indent(agent.consolidate(node.id))}")
    result = agent.integrate()
    say(f"\n3. Integration\n   synthesis: {_indent(result.synthesis)}")
    for session_id, insight in result.insights.items():
        say(f"   insight -> {agent.session(session_id).meta.label}: {_indent(insight)}")
    target = next((n for n in branches if n.id in result.insights), None)
    if target is None:
        say("\n4. (no insight was pushed this time, so no turn carries one)")
    else:
        say(f"\n4. The next {target.label} turn carries the insight (once)")
        say(f"   model: {_indent(agent.turn(target.id, FOLLOW_UP).content)}")
        pending = agent.storage.get_insight(target.id) is not None
        say(f"   insight still pending: {pending}")
    tree = agent.tree()
    svg.write_text(tree.render_svg(), encoding="utf-8")
    say(f"\n5. The tree: {len(tree)} sessions")
    say(str(tree))
    say(f"\nStar map: {svg} (open it in a browser)")
