"""Lineage: where each forked session came from, kept with the session.

A fork stores its source session (`forked_from`) and the user turn of the source its
context ends at (`forked_at_turn`, 1-based) in the child's row, beside its meta. The
topology node says where a session *sits* (it can be moved); the lineage says where it
*came from*, and stays true when the tree is rearranged or the source is removed.

    >>> from stello_graph import StelloAgent
    >>> from stello_graph.checkpoints import InMemoryMainStorage
    >>> from stello_graph.testing import ScriptedChatModel
    >>> agent = StelloAgent(model=ScriptedChatModel(default="Noted."),
    ...                     storage=InMemoryMainStorage())
    >>> ideas = agent.fork(agent.main_session_id, "Ideas")
    >>> for question in ("Tea?", "Coffee?", "Water?"):
    ...     _ = agent.turn(ideas.id, question)
    >>> tea = agent.fork(ideas.id, "Tea", context="inherit", at_turn=1)
    >>> [(p.source_id == ideas.id, p.at_turn) for p in agent.lineage(tea.id)][0]
    (True, 1)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ForkPoint"]


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """One generation of a session's lineage: the session, and where it was forked from.

    Attributes:
        session_id: the forked session.
        source_id: the session it was forked from (`forked_from`). It may have been removed
            since: the lineage keeps its id.
        at_turn: the user turn of the source (1-based) that the child's context ends at
            (`forked_at_turn`); `None` when the child inherited no history of its source
            (`context="none"`) or the source had no user turn yet.
    """

    session_id: str
    source_id: str
    at_turn: int | None = None
