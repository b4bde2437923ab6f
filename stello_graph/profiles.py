"""Fork profiles (named templates for new sessions) and the split guard (limits on the
model's own forks).

Example:
    >>> reviewer = ForkProfile(
    ...     name="reviewer",
    ...     description="A critical reviewer of one proposal",
    ...     system_prompt=lambda v: f"You review {v['topic']} critically.",
    ...     context="inherit",
    ... )
    >>> reviewer.resolve_prompt("Be brief.", {"topic": "the pricing plan"})
    'You review the pricing plan critically.\\n\\nBe brief.'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stello_graph._fork import ForkContext
from stello_graph._validate import check_chat_model, check_label, check_tools
from stello_graph.errors import InvalidInputError, SplitGuardError, UnknownProfileError

__all__ = ["ForkProfile", "SplitGuard", "SplitGuardError", "UnknownProfileError"]

PromptMode = Literal["preset", "prepend", "append"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ForkProfile:
    """A named template for new sessions, picked by the caller or by the model.

    Attributes:
        name: how forks (and the model's `create_session` calls) refer to it.
        description: what it is for; shown to the model in `create_session`.
        system_prompt: the profile's prompt, or a function of the fork's `profile_vars`.
        system_prompt_mode: how it combines with the prompt the caller or model supplies:
            `"preset"` (the profile's prompt only), `"prepend"` (profile's, then supplied) or
            `"append"` (supplied, then profile's).
        context: the default context mode of forks with this profile.
        prompt: the default opening assistant line.
        tools: the tools of sessions made with it (default: the agent's).
        skills: the skills allow-list of sessions made with it (default: inherited).
        model: the chat model of sessions made with it, or its name
            (`"anthropic:claude-sonnet-4-5"`, built when the profile is made; default: the
            agent's).
    """

    name: str
    description: str = ""
    system_prompt: str | Callable[[Mapping[str, str]], str] | None = None
    system_prompt_mode: PromptMode = "prepend"
    context: ForkContext | None = None
    prompt: str | None = None
    tools: Sequence[Any] | None = None
    skills: Sequence[str] | None = None
    model: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidInputError(f"A profile needs a non-blank name, got {self.name!r}.")
        check_label(self.name)
        if self.system_prompt_mode not in ("preset", "prepend", "append"):
            raise InvalidInputError(
                f"system_prompt_mode must be 'preset', 'prepend' or 'append', "
                f"got {self.system_prompt_mode!r}."
            )
        if self.tools is not None:
            check_tools(self.tools, f"Profile {self.name!r}: tools")
        if self.model is not None:
            built = check_chat_model(self.model, f"Profile {self.name!r}: model")
            object.__setattr__(self, "model", built)  # a name, built once (frozen: made now)

    def _own_prompt(self, variables: Mapping[str, str]) -> str | None:
        if not callable(self.system_prompt):
            return self.system_prompt
        try:
            text = self.system_prompt(dict(variables))
        except KeyError as exc:
            raise InvalidInputError(
                f"Profile {self.name!r} needs the variable {exc.args[0]!r} in profile_vars."
            ) from None
        if not isinstance(text, str):
            raise InvalidInputError(f"Profile {self.name!r} built a {type(text).__name__} prompt.")
        return text

    def resolve_prompt(
        self, supplied: str | None, variables: Mapping[str, str] | None = None
    ) -> str | None:
        """The child's system prompt from the profile's and the `supplied` one."""
        own = self._own_prompt(variables or {})
        if own is None:
            return supplied
        if self.system_prompt_mode == "preset" or not supplied:
            return own
        if self.system_prompt_mode == "prepend":
            return f"{own}\n\n{supplied}"
        return f"{supplied}\n\n{own}"


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitGuard:
    """Limits on forks the model makes itself (through `create_session`).

    Attributes:
        min_turns: user turns a session must have had (the current one included) before its
            model may fork it.
        cooldown_turns: user turns between two model-initiated forks of the same session.
    """

    min_turns: int = 0
    cooldown_turns: int = 0

    def __post_init__(self) -> None:
        for name in ("min_turns", "cooldown_turns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInputError(f"{name} must be an int >= 0, got {value!r}.")

    def refusal(self, turns: int, last_fork_turn: int | None) -> str | None:
        """Why a fork at user turn `turns` is refused, or `None` when it is allowed."""
        if turns < self.min_turns:
            return (
                f"this session has had {turns} user turn(s); forking needs at least "
                f"{self.min_turns}. Keep the discussion here for now."
            )
        if last_fork_turn is not None and turns - last_fork_turn < self.cooldown_turns:
            wait = self.cooldown_turns - (turns - last_fork_turn)
            return (
                f"this session forked {turns - last_fork_turn} turn(s) ago; wait {wait} more "
                f"user turn(s) (cooldown {self.cooldown_turns})."
            )
        return None
