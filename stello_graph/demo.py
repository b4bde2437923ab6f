"""A guided, deterministic walkthrough of the session core (`make demo`).

Runs offline with a scripted model, on the embedded SQLite default: a file in the current
directory (`stello-demo.db`, recreated on each run).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from langchain_core.messages import BaseMessage

from stello_graph import IntegrationResult, MainSession, Session
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.models import ChildL2
from stello_graph.testing import ScriptedChatModel

DB = Path("stello-demo.db")
BRANCHES = {
    "Pricing": ("Should the product have a free tier?", "A free tier with a usage cap."),
    "Onboarding": ("How do new users get started?", "A three-step guided setup."),
    "Growth": ("Where do the first users come from?", "Developer communities first."),
}


def _summarise(current: str | None, records: list[BaseMessage]) -> str:
    return " ".join(m.text for m in records if m.type == "ai")


def _integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
    pricing = next(c.session_id for c in children if c.label == "Pricing")
    return IntegrationResult(
        synthesis="; ".join(f"{c.label}: {c.l2}" for c in children),
        insights={pricing: "Onboarding wants the cap visible at setup."},
    )


def run(out: TextIO = sys.stdout, db: Path = DB) -> None:
    def say(text: str = "") -> None:
        print(text, file=out)

    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    model = ScriptedChatModel([answer for _, answer in BRANCHES.values()] + ["Noted."])
    with SqliteMainStorage(db) as storage:
        main = MainSession.create(storage, integrate_fn=_integrate)
        say(f"Database: {db.resolve()}")
        sessions = {}
        for label, (question, _) in BRANCHES.items():
            child = Session.create(storage, model=model, label=label, consolidate_fn=_summarise)
            sessions[label] = child
            say(f"\n[{label}] user : {question}")
            say(f"[{label}] model: {child.send(question).content}")
            say(f"[{label}] L2   : {child.consolidate()}")
        result = main.integrate()
        say(f"\nSynthesis: {result.synthesis}")
        for session_id, insight in result.insights.items():
            say(f"Insight -> {Session.load(session_id, storage).meta.label}: {insight}")
        sessions["Pricing"].send("Any news?")
        shown = "cap visible" in model.prompts[-1][0].text
        say(f"\nThe next Pricing turn saw the insight: {shown}")
        say(f"Insight pending afterwards: {sessions['Pricing'].insight()!r}")


def main() -> None:
    run()


if __name__ == "__main__":
    main()
