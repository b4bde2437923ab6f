"""A guided, deterministic walkthrough of a topology (`make demo`).

Offline, with a scripted model, on the embedded SQLite default: a file in the current
directory (`stello-demo.db`, recreated on each run). The flow:

1. the user asks the main session to brainstorm; the model forks three branches itself
   (its `create_session` tool calls);
2. a turn in each branch; each branch is consolidated (L3 -> L2);
3. the main session integrates the three L2 into a synthesis and pushes insights;
4. the next turn of a branch carries its insight, once;
5. the tree is printed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph.agent import StelloAgent
from stello_graph.models import ChildL2, IntegrationResult
from stello_graph.testing import ScriptedChatModel

DB = Path("stello-demo.db")
BRANCHES = {
    "Pricing": ("Should the product have a free tier?", "Yes: a free tier capped at 3 projects."),
    "Onboarding": ("How do new users get started?", "A three-step guided setup."),
    "Growth": ("Where do the first users come from?", "Developer communities first."),
}


def _reply(messages: list[BaseMessage]) -> str:
    """The scripted assistant: answers each branch's question, acknowledges the rest."""
    question = messages[-1].text
    for asked, answer in BRANCHES.values():
        if question == asked:
            return answer
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    if system is not None and "<insight>" in system.text:
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


def run(out: TextIO = sys.stdout, db: Path = DB) -> StelloAgent:
    """Run the walkthrough, printing to `out`; return the (closed) agent."""

    def say(text: str = "") -> None:
        print(text, file=out)

    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    agent = StelloAgent(
        model=_brainstorm_model(),
        storage=str(db),
        consolidate_fn=_summarise,
        integrate_fn=_integrate,
    )
    with agent:
        say(f"Database: {db.resolve()}")
        main = agent.main_session_id
        say("\n1. Brainstorm in the main session")
        reply = agent.turn(main, "Let's plan the launch.").content
        say(f"   user : Let's plan the launch.\n   model: {reply}")
        branches = agent.storage.get_children(main)
        for node in branches:
            question, _ = BRANCHES[node.label]
            say(f"\n2. Branch {node.label!r}")
            say(f"   user : {question}\n   model: {agent.turn(node.id, question).content}")
            say(f"   L2   : {agent.consolidate(node.id)}")
        result = agent.integrate()
        say(f"\n3. Integration\n   synthesis: {result.synthesis}")
        for session_id, insight in result.insights.items():
            say(f"   insight -> {agent.session(session_id).meta.label}: {insight}")
        pricing = next(n for n in branches if n.label == "Pricing")
        say("\n4. The next Pricing turn carries the insight (once)")
        say(f"   model: {agent.turn(pricing.id, 'What should we do next?').content}")
        say(f"   insight still pending: {agent.storage.get_insight(pricing.id) is not None}")
        say("\n5. The tree")
        say(str(agent.tree()))
        say("\n" + json.dumps({"sessions": len(agent.tree()), "db": str(db)}))
    return agent


def main() -> None:
    run()


if __name__ == "__main__":
    main()
