"""Built-in tools a session's model can be given: `create_session` and `activate_skill`.

`create_session` lets the model fork the session it is talking in, during its own turn: the
child and its TopologyNode are written at once (the turn's own records are committed only at
its end, so nothing waits on anything) and the model gets `{"session_id", "label"}` back. It
can name a registered profile; an unknown profile, skills beyond the session's own (a child
gets at most its parent's skills, whether named in `skills` or by the profile), or a fork the
split guard refuses, comes back to the model as an error result it can read, never as an
exception in the turn.

The child's id is derived from the turn and the tool call, so a tool round that runs again
(a turn resumed after a crash that came after the fork but before the round was
checkpointed) finds the child it already made instead of forking a second one.

`activate_skill` is offered whenever skills are registered and the session may use some: its
description lists exactly the skills of the session's allow-list, and it refuses any other.
The allow-list is read from storage when the tool runs, so a skill revoked meanwhile (by
another agent or process, even during the turn) cannot be activated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field, create_model

from stello_graph._flow import Atomic, Flow, Storage, arun, run
from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._ids import compose
from stello_graph.errors import DuplicateSessionError, InvalidInputError
from stello_graph.events import emit
from stello_graph.models import SessionMeta
from stello_graph.nodes.forking import LAST_FORK_KEY, SKILLS_KEY, fork_request_flow
from stello_graph.profiles import SplitGuard, SplitGuardError
from stello_graph.storage import MainStorage

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloDeps

__all__ = ["CREATE_SESSION_DESCRIPTION", "BuiltinTools"]

_Prepared = tuple[ForkRequest, dict[str, str] | None, dict[str, Any] | None]

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
    context: Literal["none", "inherit", "compress"] = Field(
        default="none",
        description="'none' starts empty; 'inherit' copies this conversation once; "
        "'compress' starts from a summary of it.",
    )
    at_turn: int | None = Field(
        default=None,
        description="With context 'inherit' or 'compress': start from the end of this earlier "
        "user turn of this conversation (1 is the first, -1 the last) instead of all of it.",
    )
    profile: str | None = Field(default=None, description="A registered profile to start from.")
    profile_vars: dict[str, str] | None = Field(
        default=None, description="Variables of the profile's system prompt."
    )
    skills: list[str] | None = Field(
        default=None,
        description="Skills the new session may use (at most this session's): leave out to "
        "inherit, [] for none.",
    )
    state: Annotated[dict[str, Any], InjectedState] = Field(default_factory=dict)
    tool_call_id: Annotated[str | None, InjectedToolCallId] = None


def _spec(args: Mapping[str, Any], child_id: str | None) -> dict[str, Any]:
    spec = {k: v for k, v in args.items() if k not in ("state", "tool_call_id") and v is not None}
    spec.setdefault("context", "none")
    if child_id is not None:
        spec["id"] = child_id
    return spec


def _turn_call(tree_id: str, args: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What ties a tool call to its turn: tree, session, first record, call (or `None`)."""
    state, tool_call_id = args.get("state") or {}, args.get("tool_call_id")
    pending = state.get("pending") or []
    first = pending[0] if pending else None
    if tool_call_id is None or not isinstance(first, BaseMessage) or first.id is None:
        return None
    return (tree_id, str(state["session_id"]), first.id, str(tool_call_id))


def _child_ids(tree_id: str, args: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The same id each time one tool call of one turn runs, and the id earlier versions gave
    that child (a turn they left in flight may run it again); `None`: no turn to tie it to."""
    parts = _turn_call(tree_id, args)
    if parts is None:
        return None, None
    keys = (compose("stello", *parts), ":".join(("stello", *parts)))
    new, legacy = (str(uuid.uuid5(uuid.NAMESPACE_URL, key)) for key in keys)
    return new, legacy


def _description(deps: StelloDeps) -> str:
    if not deps.profile_map:
        return CREATE_SESSION_DESCRIPTION
    lines = [
        f"- {p.name}: {p.description or '(no description)'}" for p in deps.profile_map.values()
    ]
    return CREATE_SESSION_DESCRIPTION + "\nProfiles you can name in `profile`:\n" + "\n".join(lines)


def _booking(guard: SplitGuard, source: str) -> Flow[dict[str, Any]]:
    """Apply the split guard: refuse (`SplitGuardError`) or record the fork of `source`
    (in one transaction); the settings to restore."""
    settings: dict[str, Any] = yield Storage(MainStorage.get_settings, source)
    turns = (yield Storage(MainStorage.get_turn_count, source)) + 1  # the turn in progress counts
    last = settings.get(LAST_FORK_KEY)
    reason = guard.refusal(turns, last if isinstance(last, int) else None)
    if reason is not None:
        raise SplitGuardError(f"Fork refused: {reason}")
    yield Storage(MainStorage.put_settings, source, {**settings, LAST_FORK_KEY: turns})
    return settings


class BuiltinTools:
    """The built-in tools of one `StelloDeps`, per session."""

    def __init__(self, deps: StelloDeps) -> None:
        self.deps = deps
        self._skill_tools: dict[tuple[str, ...], BaseTool] = {}
        self._create: BaseTool | None = None
        self.refresh()

    def refresh(self) -> None:
        """Rebuild after the registered profiles changed."""
        enabled = "create_session" in self.deps.builtin_tools
        self._create = self._create_session_tool() if enabled else None

    def allowed_skills(self, settings: Mapping[str, Any]) -> tuple[str, ...]:
        """The registered skills a session with these settings may activate."""
        allowed = settings.get(SKILLS_KEY)
        names = self.deps.skill_map if allowed is None else allowed
        return tuple(n for n in names if n in self.deps.skill_map)

    def for_session(self, settings: Mapping[str, Any]) -> list[BaseTool]:
        """The built-in tools of a session with these settings."""
        tools: list[BaseTool] = [self._create] if self._create is not None else []
        names = self.allowed_skills(settings)
        if names:
            tools.append(self._skill_tool(names))
        return tools

    # -- create_session ---------------------------------------------------------------------
    def _created(self, source: str, meta: SessionMeta) -> dict[str, str]:
        emit(self.deps.bus, "session_forked", meta.id, parent_id=source, label=meta.label,
             by="model")  # fmt: skip
        return {"session_id": meta.id, "label": meta.label}

    def _replay(self, req: ForkRequest, legacy: str | None = None) -> Flow[dict[str, str] | None]:
        for child_id in (req.id, legacy):
            if child_id is not None:
                node = yield Storage(MainStorage.get_node, child_id)
                meta = yield Storage(MainStorage.get_session, child_id)
                if meta is not None and node is not None and node.parent_id == req.source_id:
                    return {"session_id": meta.id, "label": meta.label}  # this very call's
        return None

    def _before(self, args: Mapping[str, Any]) -> Flow[_Prepared]:
        """The fork's request; the child an earlier run of this very call made (a resumed
        tool round: nothing more to do), else the settings the split guard's booking left."""
        tree_id, source = self.deps.storage.tree_id, args["state"]["session_id"]
        child_id, legacy = _child_ids(tree_id, args)
        req = yield from fork_request_flow(
            self.deps, source, _spec(args, child_id), within_parent=True
        )
        done = yield from self._replay(req, legacy)
        guard = self.deps.split_guard
        if done is not None or guard is None:
            return req, done, None
        return req, None, (yield Atomic(_booking(guard, source)))

    def _failed(
        self, req: ForkRequest, previous: dict[str, Any] | None, exc: BaseException
    ) -> Flow[dict[str, str]]:
        """After a failed fork: undo the guard's booking; a fork another run of this call
        made meanwhile stands for it."""
        if previous is not None:
            yield Storage(MainStorage.put_settings, req.source_id, previous)
        if isinstance(exc, DuplicateSessionError):
            done = yield from self._replay(req)
            if done is not None:
                return done
        raise exc

    def _fork(self, args: Mapping[str, Any]) -> dict[str, str]:
        req, done, previous = run(self._before(args), self.deps.storage)
        if done is not None:
            return done
        try:
            return self._created(req.source_id, fork_session(self.deps.storage, req))
        except BaseException as exc:
            return run(self._failed(req, previous, exc), self.deps.storage)

    async def _afork(self, args: Mapping[str, Any]) -> dict[str, str]:
        req, done, previous = await arun(self._before(args), self.deps.storage)
        if done is not None:
            return done
        try:
            return self._created(req.source_id, await afork_session(self.deps.storage, req))
        except BaseException as exc:
            return await arun(self._failed(req, previous, exc), self.deps.storage)

    def _create_session_tool(self) -> BaseTool:
        def create_session(**args: Any) -> dict[str, str]:
            return self._fork(args)

        async def acreate_session(**args: Any) -> dict[str, str]:
            return await self._afork(args)

        return StructuredTool.from_function(
            func=create_session,
            coroutine=acreate_session,
            name="create_session",
            description=_description(self.deps),
            args_schema=CreateSessionArgs,
        )

    # -- activate_skill ---------------------------------------------------------------------
    def _skill_tool(self, names: tuple[str, ...]) -> BaseTool:
        found = self._skill_tools.get(names)
        if found is None:
            found = self._skill_tools[names] = self._make_skill_tool(names)
        return found

    def _make_skill_tool(self, names: tuple[str, ...]) -> BaseTool:
        skills = {n: self.deps.skill_map[n] for n in names}
        listing = "\n".join(f"- {s.name}: {s.description}" for s in skills.values())
        schema = create_model(
            "ActivateSkillArgs",
            name=(Literal[names], Field(description="The skill to activate.")),  # type: ignore[arg-type]
            state=(Annotated[dict[str, Any], InjectedState], Field(default_factory=dict)),
        )

        def content(name: str, state: Mapping[str, Any] | None) -> Flow[str]:
            sid = (state or {}).get("session_id")
            stored = None
            if isinstance(sid, str):
                stored = yield Storage(MainStorage.get_settings, sid)
            allowed = names if stored is None else self.allowed_skills(stored)
            skill = skills.get(name) if name in allowed else None
            if skill is None:
                raise InvalidInputError(
                    f"Skill {name!r} is not available in this session; available: {list(allowed)}."
                )
            emit(self.deps.bus, "skill_activated", (state or {}).get("session_id"), skill=name)
            return skill.content

        def activate_skill(name: str, state: dict[str, Any] | None = None) -> str:
            return run(content(name, state), self.deps.storage)

        async def aactivate_skill(name: str, state: dict[str, Any] | None = None) -> str:
            return await arun(content(name, state), self.deps.storage)

        return StructuredTool.from_function(
            func=activate_skill,
            coroutine=aactivate_skill,
            name="activate_skill",
            description="Load the full instructions of a skill when the task needs it. "
            f"Skills available here:\n{listing}",
            args_schema=schema,
        )
