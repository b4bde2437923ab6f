"""Tools the server suite gives the sessions (`STELLO_TOOLS=tests.server._tools:TOOLS`)."""

from __future__ import annotations

from langchain_core.tools import tool
from langgraph.types import interrupt


@tool
def approve(action: str) -> str:
    """Ask a human to approve an action; returns their answer."""
    answer = interrupt({"approve": action})
    return f"{action}: {answer}"


TOOLS = [approve]
