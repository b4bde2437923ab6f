"""A griffe extension for the API pages: read `Example:` as Google style's examples section.

The docstrings follow Google style, where `Example:` and `Examples:` both open the examples
section (Napoleon reads both); griffe reads only `Examples:` so, and renders `Example:` as an
admonition, which shows the `>>>` lines as nested quotes. This names the section as griffe
expects before the docstring is parsed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename each docstring's `Example:` section to `Examples:` as the object is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
