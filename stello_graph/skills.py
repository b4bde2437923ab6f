"""Skills: named instructions a session's model can activate on demand (`activate_skill`).

A skill is loaded into the conversation only when the model asks for it, so a session can
have many at hand without paying for them in every prompt. Each session has an allow-list:
inherited from the session it was forked from, none (`[]`), or an explicit list; it limits
both what the model is shown and what it can activate.

Example:
    >>> s = Skill(name="haiku", description="Write a haiku", content="5-7-5 syllables.")
    >>> s.name
    'haiku'
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from stello_graph.errors import InvalidInputError, SkillLoadError

__all__ = ["Skill", "SkillLoadError", "load_skills", "parse_skill"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)(.*)\Z", re.DOTALL)


class Skill(BaseModel):
    """A named piece of instructions the model can activate.

    Attributes:
        name: a short identifier (letters, digits, `_`, `.`, `-`).
        description: one line telling the model when the skill helps.
        content: what the model receives when it activates the skill.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    content: str

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"skill name {value!r} must be 1-64 letters, digits, '_', '.' or '-'")
        return value


def parse_skill(text: str, *, default_name: str | None = None, where: str = "<text>") -> Skill:
    """A skill from the text of a `SKILL.md`: YAML front matter (`name`, `description`)
    between `---` lines, then the content."""
    import yaml  # on first use: an agent without skills never parses YAML

    match = _FRONT.match(text)
    if match is None:
        raise SkillLoadError(f"{where}: a SKILL.md starts with front matter between '---' lines.")
    try:
        front: Any = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise SkillLoadError(f"{where}: the front matter is not valid YAML: {exc}") from None
    if not isinstance(front, dict):
        raise SkillLoadError(f"{where}: the front matter must be a mapping.")
    name = front.get("name", default_name)
    description = front.get("description")
    if not isinstance(name, str) or not isinstance(description, str) or not description.strip():
        raise SkillLoadError(f"{where}: the front matter needs 'name' and 'description'.")
    try:
        return Skill(name=name, description=description.strip(), content=match.group(2).strip())
    except ValueError as exc:
        raise SkillLoadError(f"{where}: {exc}") from None


def load_skills(folder: str | os.PathLike[str]) -> list[Skill]:
    """Every `SKILL.md` under `folder` (one per sub-folder, named after it by default).

    Raises:
        SkillLoadError: a file is malformed, or two skills share a name.
        InvalidInputError: `folder` is not a directory.
    """
    root = Path(folder)
    if not root.is_dir():
        raise InvalidInputError(f"Skills folder {os.fspath(folder)!r} is not a directory.")
    skills: dict[str, Skill] = {}
    for path in sorted(root.rglob("SKILL.md")):
        text = path.read_text(encoding="utf-8")
        skill = parse_skill(text, default_name=path.parent.name, where=str(path))
        if skill.name in skills:
            raise SkillLoadError(f"Two skills are named {skill.name!r}.")
        skills[skill.name] = skill
    return list(skills.values())


def check_allow_list(names: object, known: Sequence[str]) -> list[str]:
    """An explicit allow-list: a list of registered skill names."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidInputError(f"skills must be a list of skill names, got {names!r}.")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidInputError(f"Unknown skill(s) {unknown!r}; registered: {sorted(known)!r}.")
    return list(dict.fromkeys(str(n) for n in names))
