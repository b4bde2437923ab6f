"""Channels of the stello graph's state: values that last one run.

On a checkpointed thread (every LangGraph Server thread, every `StelloAgent` session) the
state of one run is the starting point of the next. A key the input sets (`session_id`) or
a result a run returns (`content`, `forked`, ...) must not be seen by the next run when that
run does not set it again: `{"op": "consolidate"}` after a turn on another session must not
consolidate that session, and a fork's output must not show the previous turn's reply.

`RunValue` is a `LastValue` that knows when its run finished: LangGraph calls `finish()`
on every channel when a run's last step is done, and the channel marks its value as the
previous run's. The value stays readable (the run's output and `get_state` show it), but
the first step of the next run that does not write it clears it. A run that is interrupted
or crashes does not finish, so a resumed turn still sees its session.

A run that fails does not finish either, so the keys a run's input may set (`RunInput`:
`session_id`, `messages`) are also cleared by writing `None`: the compiled stello graph
writes `None` for each of them a new run's input leaves out (`RUN_INPUTS`), so a run never
inherits them from a run before it, finished or failed.

`RunMessages` is the `messages` key: a `RunInput` holding a list of messages. Nodes write
it wrapped in `TurnRecords`, which LangGraph's `messages` stream mode does not look into,
so the turn's records are the run's output without being echoed as stream tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self

from langchain_core.messages import BaseMessage
from langgraph._internal._typing import MISSING
from langgraph.channels.base import BaseChannel, Value
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.errors import EmptyChannelError, InvalidUpdateError

__all__ = ["RUN_INPUTS", "RunAggregate", "RunInput", "RunMessages", "RunValue", "TurnRecords"]

RUN_INPUTS = ("session_id", "messages")
"""The input keys that last a run (`RunInput`); a new run's input that lacks one clears it."""

_STALE = "__stello_previous_run__"
"""The key of the checkpointed form of a value left by a finished run."""


class RunValue(Generic[Value], BaseChannel[Value, Value, Any]):
    """The last value written in this run; cleared by the next run unless written again."""

    __slots__ = ("stale", "value")

    def __init__(self, typ: Any, key: str = "") -> None:
        super().__init__(typ, key)
        self.value: Any = MISSING
        self.stale = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    @property
    def ValueType(self) -> Any:
        return self.typ

    @property
    def UpdateType(self) -> Any:
        return self.typ

    def copy(self) -> Self:
        empty = self.__class__(self.typ, self.key)
        empty.value, empty.stale = self.value, self.stale
        return empty

    def from_checkpoint(self, checkpoint: Any) -> Self:
        empty = self.__class__(self.typ, self.key)
        if isinstance(checkpoint, dict) and set(checkpoint) == {_STALE}:
            empty.value, empty.stale = checkpoint[_STALE], True
        elif checkpoint is not MISSING:  # a fresh value (or a plain `LastValue`'s, stored before)
            empty.value = checkpoint
        return empty

    def _accept(self, value: Any) -> Any:
        return value

    def update(self, values: Sequence[Any]) -> bool:
        if len(values) > 1:
            raise InvalidUpdateError(f"At key {self.key!r}: only one value per step.")
        if values:
            self.value, self.stale = self._accept(values[0]), False
            return True
        if self.stale and self.value is not MISSING:  # a new run's step that did not write it
            self.value, self.stale = MISSING, False
            return True
        return False

    def finish(self) -> bool:
        if self.value is MISSING or self.stale:
            return False
        self.stale = True
        return True  # a new version, so the checkpoint keeps the mark

    def get(self) -> Value:
        if self.value is MISSING:
            raise EmptyChannelError()
        return self.value  # type: ignore[no-any-return]

    def is_available(self) -> bool:
        return self.value is not MISSING

    def checkpoint(self) -> Any:
        if self.value is MISSING:
            return MISSING
        return {_STALE: self.value} if self.stale else self.value


class RunInput(RunValue[Value]):
    """A `RunValue` that a run's input sets; `None` clears it (the key is then absent)."""

    __slots__ = ()

    def update(self, values: Sequence[Any]) -> bool:
        if len(values) == 1 and values[0] is None:
            changed = self.value is not MISSING
            self.value, self.stale = MISSING, False
            return changed
        return super().update(values)


@dataclass(frozen=True, slots=True)
class TurnRecords:
    """A node's write of the turn's records to `messages` (see the module docstring)."""

    records: list[BaseMessage]


class RunMessages(RunInput[list[Any]]):
    """The `messages` key: the input's messages, then the turn's records (`TurnRecords`)."""

    __slots__ = ()

    def _accept(self, value: Any) -> Any:
        return list(value.records) if isinstance(value, TurnRecords) else value


class RunAggregate(BinaryOperatorAggregate[Value]):
    """A reducer's channel (`pending`'s `add_messages`) whose value lasts one run: the first
    step of the next run starts it over from empty, as `RunValue` clears its value."""

    __slots__ = ("stale",)

    def __init__(self, typ: Any, operator: Any) -> None:
        super().__init__(typ, operator)
        self.stale = False

    def _empty(self) -> Any:
        return BinaryOperatorAggregate(self.typ, self.operator).value

    def copy(self) -> Self:
        empty = super().copy()
        empty.stale = self.stale
        return empty

    def from_checkpoint(self, checkpoint: Any) -> Self:
        stale = isinstance(checkpoint, dict) and set(checkpoint) == {_STALE}
        empty = super().from_checkpoint(checkpoint[_STALE] if stale else checkpoint)
        empty.stale = stale
        return empty

    def update(self, values: Sequence[Any]) -> bool:
        if self.stale:  # a new run's first step: what the last run left is not this run's
            self.value, self.stale = self._empty(), False
            return super().update(values) or True
        return super().update(values)

    def finish(self) -> bool:
        if self.stale or self.value is MISSING:
            return False
        self.stale = True
        return True

    def checkpoint(self) -> Any:
        value = super().checkpoint()
        return {_STALE: value} if self.stale and value is not MISSING else value
