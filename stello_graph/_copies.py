"""Copies of L3 records that share nothing mutable with the stored ones.

The storages keep decoded records (SQLite in its record cache, the in-memory storage in its
lists) and a turn reads all of L3 at every model call, so the core reads them without copies.
Whatever leaves the core (`list_records`, the records given to a consolidate or compress
function) is a `detached` copy instead: changing it cannot change what a later read or prompt
shows. `detached` costs a shallow `model_copy` plus a copy of the message's containers (content
blocks, tool calls, metadata); strings and numbers are immutable and stay shared. That is a
few microseconds a record, about half of `model_copy(deep=True)`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["detached", "detached_all"]

M = TypeVar("M", bound="BaseMessage")

_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {key: _copy(item) for key, item in value.items()}
    if kind is list:
        return [_copy(item) for item in value]
    if kind is tuple:
        return tuple(_copy(item) for item in value)
    return copy.deepcopy(value)  # not from JSON: rare, and copied whatever it is


def detached(message: M) -> M:
    """A copy of `message` whose every mutable part (fields, lists, dicts) is its own."""
    new = message.model_copy()  # a fresh `__dict__` and extras, the values still shared
    fields = vars(new)
    for name, value in fields.items():
        if type(value) not in _IMMUTABLE:
            fields[name] = _copy(value)
    extra = new.__pydantic_extra__
    if extra:
        for name, value in extra.items():
            extra[name] = _copy(value)
    return new


def detached_all(messages: Iterable[M]) -> list[M]:
    """`detached` copies of `messages`, as a new list."""
    return [detached(message) for message in messages]
