"""How the orchestration turns fork options into a `ForkRequest`: profiles, skills, compress.

Shared by the `fork` node (forks asked by the caller) and the `create_session` tool (forks
asked by the model), so both follow the same rules:

* a named profile supplies the system prompt (combined with the supplied one by its mode),
  the default context mode, opening line, skills allow-list, tools and model;
* the child's skills allow-list is the one given, else the profile's, else its parent's;
  a fork the model asks for (`create_session`) gets at most its parent's skills, while the
  developer's `fork` may give any registered skill;
* a label another child of the source has is refused when the agent asks for unique labels
  (`StelloConfig.unique_labels`), so the model continues a branch instead of duplicating it;
* `context="compress"` finds its compress function (the agent's compression policy, else an
  LLM compressor on the agent's model) or fails before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stello_graph._flow import Flow, Storage, arun, run
from stello_graph._fork import ForkRequest
from stello_graph._validate import check_depth
from stello_graph.errors import InvalidInputError
from stello_graph.profiles import ForkProfile
from stello_graph.skills import check_allow_list
from stello_graph.storage import MainStorage

if TYPE_CHECKING:
    from stello_graph.nodes.deps import StelloDeps

__all__ = ["LAST_FORK_KEY", "PROFILE_KEY", "SKILLS_KEY", "afork_request", "fork_request"]

SKILLS_KEY = "skills"
"""Settings key of a session's skills allow-list (`None` or missing: every skill)."""
PROFILE_KEY = "profile"
"""Settings key of the profile a session was made with."""
LAST_FORK_KEY = "last_fork_turn"
"""Settings key of the user turn at which the model last forked the session."""

_OPTIONS = frozenset(
    {
        *("context", "system_prompt", "inherit_system_prompt", "prompt", "tags", "metadata"),
        *("id", "at_turn"),
    }
)
_UNSET: Any = object()


def _profile(deps: StelloDeps, name: object) -> ForkProfile | None:
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidInputError(f"profile must be a profile name, got {name!r}.")
    return deps.profile(name)


def _variables(raw: object) -> Mapping[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        raise InvalidInputError(f"profile_vars must be a dict of strings, got {raw!r}.")
    return {k: str(v) for k, v in raw.items()}


def _allow_list(
    deps: StelloDeps,
    given: object,
    profile: ForkProfile | None,
    parent: object,
    within_parent: bool,
) -> list[str] | None:
    known = list(deps.skill_map)
    inherited = list(parent) if isinstance(parent, list) else None
    if given is not _UNSET and given is not None:
        chosen = check_allow_list(given, known)
    elif profile is not None and profile.skills is not None:
        chosen = check_allow_list(profile.skills, known)
    else:
        return inherited
    beyond = [n for n in chosen if inherited is not None and n not in inherited]
    if within_parent and beyond:
        raise InvalidInputError(
            f"The new session cannot have the skill(s) {beyond!r}: a session you fork gets at "
            f"most its parent's skills {inherited!r}. Pass skills= a subset of them."
        )
    return chosen


def fork_request_flow(
    deps: StelloDeps, source_id: str, spec: Mapping[str, Any], within_parent: bool = False
) -> Flow[ForkRequest]:
    """`fork_request`'s steps, for either driver."""
    parent: Mapping[str, Any] = yield Storage(MainStorage.get_settings, source_id)
    unknown = set(spec) - _OPTIONS - {"label", "profile", "profile_vars", "skills"}
    if unknown:
        raise InvalidInputError(f"Unknown fork option(s) {sorted(unknown)}.")
    check_depth(spec.get("profile_vars"), "profile_vars")  # before anything reads or shows it
    profile = _profile(deps, spec.get("profile"))
    if profile is None and spec.get("profile_vars") not in (None, {}):
        raise InvalidInputError(
            f"profile_vars were given without a profile ({spec['profile_vars']!r:.80}); "
            "name the profile whose prompt uses them, or leave them out."
        )
    options = {k: v for k, v in spec.items() if k in _OPTIONS and v is not None}
    if profile is not None:
        variables = _variables(spec.get("profile_vars"))
        options["system_prompt"] = profile.resolve_prompt(options.get("system_prompt"), variables)
        options.setdefault("context", profile.context or "none")
        if profile.prompt is not None:
            options.setdefault("prompt", profile.prompt)
    skills = _allow_list(
        deps, spec.get("skills", _UNSET), profile, parent.get(SKILLS_KEY), within_parent
    )
    settings = {SKILLS_KEY: skills, PROFILE_KEY: profile.name if profile else None}
    compress_fn = deps.compress_function() if options.get("context") == "compress" else None
    return ForkRequest.build(
        source_id,
        spec.get("label"),
        **options,
        compress_fn=compress_fn,
        settings=settings,
        unique_label=deps.config.unique_labels,
    )


def fork_request(
    deps: StelloDeps, source_id: str, spec: Mapping[str, Any], *, within_parent: bool = False
) -> ForkRequest:
    """Validate fork options (`spec`: `label` plus fork options, `profile`, `profile_vars`,
    `skills`) against the agent's profiles and skills.

    With `within_parent` (forks the model asks for), the child's skills must be among its
    parent's; otherwise any registered skill may be given.
    """
    return run(fork_request_flow(deps, source_id, spec, within_parent), deps.storage)


async def afork_request(
    deps: StelloDeps, source_id: str, spec: Mapping[str, Any], *, within_parent: bool = False
) -> ForkRequest:
    """Async twin of `fork_request`."""
    return await arun(fork_request_flow(deps, source_id, spec, within_parent), deps.storage)
