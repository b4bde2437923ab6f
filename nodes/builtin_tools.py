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

from stello_graph._fork import ForkRequest, afork_session, fork_session
from stello_graph._ids import compose
from stello_graph.errors import DuplicateSessionError, InvalidInputError
from stello_graph.events import emit
from stello_graph.models import SessionMeta
from stello_graph.nodes.forking import LAST_FORK_KEY, SKILLS_KEY, afork_request, fork_request
from stello_graph.profiles import SplitGuardError

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloDeps

__all__ = ["CREATE_SESSION_DESCRIPTION", "BuiltinTools"]

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


def _child_id(tree_id: str, args: Mapping[str, Any]) -> str | None:
    """The same id each time one tool call of one turn runs (`None`: no turn to tie it to)."""
    parts = _turn_call(tree_id, args)
    return None if parts is None else str(uuid.uuid5(uuid.NAMESPACE_URL, compose("stello", *parts)))


def _legacy_child_id(tree_id: str, args: Mapping[str, Any]) -> str | None:
    """The id earlier versions gave that child: a turn they left in flight may run it again."""
    parts = _turn_call(tree_id, args)
    return (
        None if parts is None else str(uuid.uuid5(uuid.NAMESPACE_URL, ":".join(("stello", *parts))))
    )


def _replayed(meta: SessionMeta | None, parent: str | None, source: str) -> dict[str, str] | None:
    """The child an earlier run of this very tool call made, if that is what `meta` is."""
    if meta is None or parent != source:
        return None
    return {"session_id": meta.id, "label": meta.label}


def _description(deps: StelloDeps) -> str:
    if not deps.profile_map:
        return CREATE_SESSION_DESCRIPTION
    lines = [
        f"- {p.name}: {p.description or '(no description)'}" for p in deps.profile_map.values()
    ]
    return CREATE_SESSION_DESCRIPTION + "\nProfiles you can name in `profile`:\n" + "\n".join(lines)


class _Guard:
    """Applies the split guard: check and book a fork of a session in one transaction."""

    def __init__(self, deps: StelloDeps) -> None:
        self.deps = deps

    def _booked(self, settings: Mapping[str, Any], committed_turns: int) -> dict[str, Any]:
        guard = self.deps.split_guard
        assert guard is not None
        turns = committed_turns + 1  # the turn in progress counts
        last = settings.get(LAST_FORK_KEY)
        reason = guard.refusal(turns, last if isinstance(last, int) else None)
        if reason is not None:
            raise SplitGuardError(f"Fork refused: {reason}")
        return {**settings, LAST_FORK_KEY: turns}

    def book(self, source: str) -> dict[str, Any] | None:
        """Refuse (`SplitGuardError`) or record the fork; return the settings to restore."""
        if self.deps.split_guard is None:
            return None
        storage = self.deps.storage
        with storage.transaction():
            settings = storage.get_settings(source)
            storage.put_settings(source, self._booked(settings, storage.get_turn_count(source)))
        return settings

    async def abook(self, source: str) -> dict[str, Any] | None:
        if self.deps.split_guard is None:
            return None
        storage = self.deps.storage
        async with storage.atransaction():
            settings = await storage.aget_settings(source)
            turns = await storage.aget_turn_count(source)
            await storage.aput_settings(source, self._booked(settings, turns))
        return settings

    def undo(self, source: str, previous: dict[str, Any] | None) -> None:
        if previous is not None:
            self.deps.storage.put_settings(source, previous)

    async def aundo(self, source: str, previous: dict[str, Any] | None) -> None:
        if previous is not None:
            await self.deps.storage.aput_settings(source, previous)


class BuiltinTools:
    """The built-in tools of one `StelloDeps`, per session."""

    def __init__(self, deps: StelloDeps) -> None:
        self.deps = deps
        self._guard = _Guard(deps)
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

    def _replay(self, req: ForkRequest, legacy: str | None = None) -> dict[str, str] | None:
        for child_id in (req.id, legacy):
            if child_id is not None:
                node = self.deps.storage.get_node(child_id)
                meta = self.deps.storage.get_session(child_id)
                done = _replayed(meta, node.parent_id if node else None, req.source_id)
                if done is not None:
                    return done
        return None

    async def _areplay(self, req: ForkRequest, legacy: str | None = None) -> dict[str, str] | None:
        for child_id in (req.id, legacy):
            if child_id is not None:
                node = await self.deps.storage.aget_node(child_id)
                meta = await self.deps.storage.aget_session(child_id)
                done = _replayed(meta, node.parent_id if node else None, req.source_id)
                if done is not None:
                    return done
        return None

    def _fork(self, args: Mapping[str, Any]) -> dict[str, str]:
        source = args["state"]["session_id"]
        spec = _spec(args, _child_id(self.deps.storage.tree_id, args))
        req = fork_request(self.deps, source, spec, within_parent=True)
        done = self._replay(req, _legacy_child_id(self.deps.storage.tree_id, args))
        if done is not None:  # this very call already forked: a resumed tool round
            return done
        previous = self._guard.book(source)
        try:
            return self._created(source, fork_session(self.deps.storage, req))
        except DuplicateSessionError:
            self._guard.undo(source, previous)
            if (done := self._replay(req)) is None:
                raise
            return done
        except BaseException:
            self._guard.undo(source, previous)
            raise

    async def _afork(self, args: Mapping[str, Any]) -> dict[str, str]:
        source = args["state"]["session_id"]
        spec = _spec(args, _child_id(self.deps.storage.tree_id, args))
        req = await afork_request(self.deps, source, spec, within_parent=True)
        done = await self._areplay(req, _legacy_child_id(self.deps.storage.tree_id, args))
        if done is not None:
            return done
        previous = await self._guard.abook(source)
        try:
            return self._created(source, await afork_session(self.deps.storage, req))
        except DuplicateSessionError:
            await self._guard.aundo(source, previous)
            if (done := await self._areplay(req)) is None:
                raise
            return done
        except BaseException:
            await self._guard.aundo(source, previous)
            raise

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

        def content(
            name: str, state: Mapping[str, Any] | None, stored: Mapping[str, Any] | None
        ) -> str:
            allowed = names if stored is None else self.allowed_skills(stored)
            skill = skills.get(name) if name in allowed else None
            if skill is None:
                raise InvalidInputError(
                    f"Skill {name!r} is not available in this session; available: {list(allowed)}."
                )
            emit(self.deps.bus, "skill_activated", (state or {}).get("session_id"), skill=name)
            return skill.content

        def activate_skill(name: str, state: dict[str, Any] | None = None) -> str:
            sid = (state or {}).get("session_id")
            stored = self.deps.storage.get_settings(sid) if isinstance(sid, str) else None
            return content(name, state, stored)

        async def aactivate_skill(name: str, state: dict[str, Any] | None = None) -> str:
            sid = (state or {}).get("session_id")
            stored = await self.deps.storage.aget_settings(sid) if isinstance(sid, str) else None
            return content(name, state, stored)

        return StructuredTool.from_function(
            func=activate_skill,
            coroutine=aactivate_skill,
            name="activate_skill",
            description="Load the full instructions of a skill when the task needs it. "
            f"Skills available here:\n{listing}",
            args_schema=schema,
        )
