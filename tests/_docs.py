"""The code examples of the README and of the documentation site (`docs/`), as tests run them.

Conventions of the pages (docs/development.md, "Writing the docs", says them to writers):

* every ```` ```python ```` block is an example, run offline by the main suite
  (`tests/test_docs.py`), twice: a reader runs an example again, on the files it left;
* a ```` ```text title="Output" ```` block right after an example (blank lines between at
  most) is what it prints: the first run must print exactly that, ids aside;
* an example that needs what the main suite has none of is marked by an HTML comment on the
  line before it, `<!-- test: postgres -->` or `<!-- test: server -->`, and is run by that
  suite instead (`tests/postgres/test_readme.py`, `tests/server/test_langgraph_server.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
"""Every page whose examples run: the README and the documentation site's pages."""
NEEDS = ("postgres", "server")
"""What a marked example can need; the suite of the same name runs it."""

_FENCE = re.compile(r"^```(\S*)(.*)$")
_MARK = re.compile(r"^<!-- test: (\S+) -->$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Example:
    """One ```` ```python ```` block of a page."""

    page: Path
    line: int
    """The line of its opening fence (1-based)."""
    code: str
    needs: str | None
    """The suite that runs it (`postgres`, `server`), or None: the main suite."""
    output: str | None
    """What it prints, as the page shows it (None: the page shows no output)."""

    @property
    def name(self) -> str:
        """`page:line`, the test id."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compile(self) -> CodeType:
        return compile(self.code, self.name, "exec")


@dataclass(frozen=True, slots=True)
class _Block:
    lang: str
    info: str
    start: int  # 0-based index of the opening fence
    end: int  # 0-based index of the closing fence
    text: str
    mark: str | None


def _blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    mark: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence and fence.group(1):
            end = lines.index("```", index + 1)
            text = "\n".join(lines[index + 1 : end]) + "\n"
            blocks.append(_Block(fence.group(1), fence.group(2).strip(), index, end, text, mark))
            mark, index = None, end + 1
            continue
        found = _MARK.match(line)
        if found:
            mark = found.group(1)
        elif line.strip():
            mark = None
        index += 1
    return blocks


def examples(page: Path) -> list[Example]:
    """The examples of one page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = _blocks(lines)
    found = []
    for index, block in enumerate(blocks):
        after = blocks[index + 1] if index + 1 < len(blocks) else None
        if block.lang != "python":
            continue
        between = lines[block.end + 1 : after.start] if after else ["x"]
        shown = (
            after is not None
            and after.lang == "text"
            and after.info == 'title="Output"'
            and not any(line.strip() for line in between)
        )
        found.append(
            Example(
                page=page,
                line=block.start + 1,
                code=block.text,
                needs=block.mark,
                output=after.text if shown and after else None,
            )
        )
    return found


def all_examples() -> list[Example]:
    """The examples of every page (`PAGES`)."""
    return [example for page in PAGES for example in examples(page)]


def examples_needing(suite: str) -> list[Example]:
    """The examples marked `<!-- test: SUITE -->`."""
    return [example for example in all_examples() if example.needs == suite]


def same_output(printed: str, shown: str) -> bool:
    """Whether an example printed what its page shows, ids (UUIDs) aside."""
    return _UUID.sub("<id>", printed).rstrip() == _UUID.sub("<id>", shown).rstrip()
