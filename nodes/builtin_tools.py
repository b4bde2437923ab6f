"""Built-in tools a session's model can be given.

`create_session` lets the model fork the session it is talking in, during its own turn: the
child and its TopologyNode are written at once (the turn's own records are committed only at
its end, so nothing waits on anything) and the model gets `{"session_id", "label"}` back.

The child's id is derived from the turn and the tool call, so a tool round that runs again
(a turn resumed after a crash that came after the fork but before the round was
checkpointed) finds the child it already made instead of forking a second one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field

from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph.errors import DuplicateSessionError
from stello_graph.events import emit
from stello_graph.models import SessionMeta
from stello_graph.storage import MainStorage

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloDeps

__all__ = ["CREATE_SESSION_DESCRIPTION", "make_builtin_tools"]

CREATE_SESSION_DESCRIPTION = """\
Create a new branch session, forked from the current one, for a sub-topic that deserves its \
own focused conversation. The new session becomes a child of the current one in the topology. \
Returns the new session's id and label."""


class CreateSessionArgs(BaseModel):
    """Arguments of `create_session` as the model sees them."""

    label: str = Field(description="Short, human-readable name of the new session.")
    system_prompt: str | None = Field(
        default=None, description="System prompt of the new session (default: inherited)."
    )
    prompt: str | None = Field(
        default=None, description="Opening assistant message of the new session."
    )
    context: Literal["none", "inherit"] = Field(
        default="none",
        description="'none' starts empty; 'inherit' copies this conversation once.",
    )
    state: Annotated[dict[str, Any], InjectedState] = Field(default_factory=dict)
    tool_call_id: Annotated[str | None, InjectedToolCallId] = None


def _child_id(deps: StelloDeps, state: dict[str, Any], tool_call_id: str | None) -> str | None:
    """The same id each time one tool call of one turn runs (`None`: no turn to tie it to)."""
    pending = state.get("pending") or []
    first = pending[0] if pending else None
    if tool_call_id is None or not isinstance(first, BaseMessage) or first.id is None:
        return None
    key = f"stello:{deps.storage.tree_id}:{state['session_id']}:{first.id}:{tool_call_id}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))


def _request(state: dict[str, Any], args: dict[str, Any], child_id: str | None) -> ForkRequest:
    return ForkRequest.build(
        state["session_id"],
        args["label"],
        context=args.get("context") or "none",
        system_prompt=args.get("system_prompt"),
        prompt=args.get("prompt"),
        id=child_id,
    )


def _created(deps: StelloDeps, source: str, meta: SessionMeta) -> dict[str, str]:
    emit(deps.bus, "session_forked", meta.id, parent_id=source, label=meta.label, by="model")
    return {"session_id": meta.id, "label": meta.label}


def _replayed(storage: MainStorage, req: ForkRequest) -> dict[str, str]:
    """The child an earlier run of this very tool call made; re-raise if it is not that."""
    assert req.id is not None
    meta, node = storage.get_session(req.id), storage.get_node(req.id)
    if meta is None or node is None or node.parent_id != req.source_id:
        raise DuplicateSessionError(req.id)
    return {"session_id": meta.id, "label": meta.label}


async def _areplayed(storage: MainStorage, req: ForkRequest) -> dict[str, str]:
    assert req.id is not None
    meta, node = await storage.aget_session(req.id), await storage.aget_node(req.id)
    if meta is None or node is None or node.parent_id != req.source_id:
        raise DuplicateSessionError(req.id)
    return {"session_id": meta.id, "label": meta.label}


def _create_session_tool(deps: StelloDeps) -> BaseTool:
    def create_session(
        label: str,
        system_prompt: str | None = None,
        prompt: str | None = None,
        context: Literal["none", "inherit"] = "none",
        state: Annotated[dict[str, Any] | None, InjectedState] = None,
        tool_call_id: Annotated[str | None, InjectedToolCallId] = None,
    ) -> dict[str, str]:
        args = {"label": label, "system_prompt": system_prompt, "prompt": prompt}
        state = state or {}
        req = _request(state, {**args, "context": context}, _child_id(deps, state, tool_call_id))
        try:
            return _created(deps, req.source_id, fork_session(deps.storage, req))
        except DuplicateSessionError:
            if req.id is None:
                raise
            return _replayed(deps.storage, req)

    async def acreate_session(
        label: str,
        system_prompt: str | None = None,
        prompt: str | None = None,
        context: Literal["none", "inherit"] = "none",
        state: Annotated[dict[str, Any] | None, InjectedState] = None,
        tool_call_id: Annotated[str | None, InjectedToolCallId] = None,
    ) -> dict[str, str]:
        args = {"label": label, "system_prompt": system_prompt, "prompt": prompt}
        state = state or {}
        req = _request(state, {**args, "context": context}, _child_id(deps, state, tool_call_id))
        try:
            return _created(deps, req.source_id, await afork_session(deps.storage, req))
        except DuplicateSessionError:
            if req.id is None:
                raise
            return await _areplayed(deps.storage, req)

    return StructuredTool.from_function(
        func=create_session,
        coroutine=acreate_session,
        name="create_session",
        description=CREATE_SESSION_DESCRIPTION,
        args_schema=CreateSessionArgs,
    )


def make_builtin_tools(deps: StelloDeps, names: Sequence[str]) -> list[BaseTool]:
    """The built-in tools named in `names`, bound to `deps`."""
    tools: list[BaseTool] = []
    if "create_session" in names:
        tools.append(_create_session_tool(deps))
    return tools
