"""Text the user did not send, made storable: lone surrogates become U+FFFD.

A lone surrogate ("\\ud800") cannot be encoded as UTF-8, so the storage refuses it. From the
user that is a bad input (`InvalidInputError`, raised by the argument checks). But a model's
reply, a tool's result or a memory function's output can hold one too (a provider that split
a UTF-16 pair, a tool that decoded bytes with `surrogateescape`): the user did not send it, so
it must not fail their turn. The core passes such text through `storable` / `storable_message`
on its way in: each lone surrogate is replaced by U+FFFD (a pair split in two code points is
joined back into its character), and text without any comes back as the same object.
"""

from __future__ import annotations

from typing import Any, TypeVar

from langchain_core.messages import BaseMessage

__all__ = ["storable", "storable_message", "storable_value"]

M = TypeVar("M", bound=BaseMessage)


def storable(text: str) -> str:
    """`text` itself when it encodes as UTF-8, else a copy with each lone surrogate
    replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def storable_value(value: Any) -> Any:
    """`value` itself when every string in it (keys included) is storable, else a copy of its
    lists, tuples and dicts with the strings made storable."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        items = [(storable_value(k), storable_value(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        fixed = [storable_value(v) for v in value]
        if all(v is v0 for v, v0 in zip(fixed, value, strict=True)):
            return value
        return fixed if isinstance(value, list) else tuple(fixed)
    return value


def storable_message(message: M) -> M:
    """`message` itself when all its text is storable, else a copy with every field that
    held a lone surrogate made storable (content, tool calls, metadata, artifact, ...)."""
    fields = {**vars(message), **(message.__pydantic_extra__ or {})}
    update = {name: fixed for name, v in fields.items() if (fixed := storable_value(v)) is not v}
    return message.model_copy(update=update) if update else message
