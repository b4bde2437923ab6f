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
`session_id`) are also cleared by writing `None`: the compiled stello graph writes `None`
for each of them a new run's input leaves out (`RUN_INPUTS`), so a run never inherits them
from a run before it, finished or failed.

`ThreadMessages` is the `messages` key, the one that does last: the thread's conversation,
as in every LangGraph chat graph. A run's input messages are added to it, and a turn writes
it back with its records merged in, wrapped in LangGraph's `Overwrite`, which its
`messages` stream mode does not look into, so the records are not echoed as stream tokens
(and a checkpoint holds only LangGraph's and LangChain's own classes: its strict msgpack
mode loads it).

What a finished run leaves is checkpointed small, since a kept thread (a server thread, a
saver the agent does not prune) stores it in every checkpoint: `pending` (committed, the
same records as `messages`) as empty, `messages` in stello's compact record form, the mark
of a finished run's value as a short key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Self

from langchain_core.messages import BaseMessage, convert_to_messages
from langgraph.channels.base import BaseChannel, Value
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.errors import EmptyChannelError, InvalidUpdateError
from langgraph.graph.message import add_messages
from langgraph.types import MISSING, Overwrite  # type: ignore[attr-defined]  # not in __all__

from stello_graph.errors import InvalidInputError

__all__ = ["RUN_INPUTS", "RunAggregate", "RunInput", "RunValue", "ThreadMessages"]

RUN_INPUTS = ("session_id",)
"""The input keys that last a run (`RunInput`); a new run's input that lacks one clears it."""

_STALE = "~stello"
"""The key of the checkpointed form of a value left by a finished run: `{_STALE: value}`
(short: a kept thread stores it in every checkpoint of every key a run sets)."""
_PACKED = "~stello-records"
"""The key of `RunMessages`' checkpointed form of a finished run's messages, packed."""
_STALE_BEFORE = "__stello_previous_run__"
"""The same key in checkpoints written by earlier versions (still read)."""


def _stale(checkpoint: Any) -> tuple[bool, Any]:
    """Whether a checkpointed value is a finished run's, and the value itself."""
    if isinstance(checkpoint, dict) and len(checkpoint) == 1:
        for key in (_STALE, _STALE_BEFORE):
            if key in checkpoint:
                return True, checkpoint[key]
    return False, checkpoint


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
        stale, value = _stale(checkpoint)
        if value is not MISSING:  # a fresh value (or a plain `LastValue`'s, stored before)
            empty.value, empty.stale = value, stale
        return empty

    def update(self, values: Sequence[Any]) -> bool:
        if len(values) > 1:
            raise InvalidUpdateError(f"At key {self.key!r}: only one value per step.")
        if values:
            self.value, self.stale = values[0], False
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


_JSON_SCALARS = (str, int, float, bool, type(None))


def _json_exact(value: Any) -> bool:
    """Whether JSON gives `value` back as it is: its scalars of JSON's own types (not an
    enum, not a subclass), lists, and dicts with `str` keys."""
    if type(value) in _JSON_SCALARS:
        return True
    if type(value) is list:
        return all(_json_exact(item) for item in value)
    if type(value) is dict:
        return all(type(k) is str and _json_exact(v) for k, v in value.items())
    return False


def _packed(messages: Any) -> list[str] | None:
    """A finished run's messages in stello's compact record form (`encode_message`), or
    `None` when one of them might not come back equal (not a LangChain message of its own
    classes, a record's turn marks, a field JSON would change: a tuple, an enum, a key
    that is not a `str`)."""
    from stello_graph.checkpoints._serde import TURN_ID, TURN_SEQ, encode_message

    if not isinstance(messages, list):
        return None
    packed = []
    for message in messages:
        if not isinstance(message, BaseMessage) or type(message).__module__.split(".")[:2] != [
            "langchain_core",
            "messages",
        ]:
            return None
        metadata = message.response_metadata
        if TURN_ID in metadata or TURN_SEQ in metadata or not _json_exact(vars(message)):
            return None
        try:
            packed.append(encode_message(message)[1])
        except (InvalidInputError, TypeError, ValueError):
            return None
    return packed


def conversation(value: Any) -> list[BaseMessage]:
    """A run's `messages` input as messages (dicts and tuples as the SDK sends them)."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise InvalidInputError(
            f'"messages" must be a list of messages, got {type(value).__name__}.'
        )
    try:
        return convert_to_messages(value)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise InvalidInputError(f'"messages" holds something that is not a message: {exc}') from exc


class ThreadMessages(BinaryOperatorAggregate[list[Any]]):
    """The `messages` key: the thread's conversation, kept from run to run.

    A run's input messages are added to it (`add_messages`: by id, a message whose id is
    already there replacing it); a turn writes the whole conversation back, its records
    merged in, wrapped in `Overwrite` (which LangGraph's `messages` stream mode does not
    look into, so the records are not echoed as stream tokens). An input that is not a
    list of messages is refused (`InvalidInputError`).

    The value is checkpointed in stello's compact record form (`_PACKED`) when every
    message comes back equal from it: a kept thread stores the conversation in every
    checkpoint, and LangChain's own form of a message is ~150 bytes longer.
    Checkpoints of earlier versions (a finished run's value marked `_STALE`) are read too.
    """

    __slots__ = ("_packed",)

    def __init__(self, typ: Any, operator: Any = add_messages) -> None:
        super().__init__(typ, operator)
        self.value: Any = MISSING  # absent until a run writes it, as a run's input key
        self._packed: list[str] | None = None  # the value's packed form, once made

    def copy(self) -> Self:
        empty = super().copy()
        empty._packed = self._packed
        return empty

    def from_checkpoint(self, checkpoint: Any) -> Self:
        if isinstance(checkpoint, dict) and set(checkpoint) == {_PACKED}:
            from stello_graph.checkpoints._serde import decode_message

            empty = self.__class__(self.typ, self.operator)
            empty.key = self.key
            empty._packed = list(checkpoint[_PACKED])
            empty.value = [decode_message(m) for m in empty._packed]
            return empty
        return super().from_checkpoint(_stale(checkpoint)[1])

    def update(self, values: Sequence[Any]) -> bool:
        checked: list[Any] = [
            value if isinstance(value, Overwrite) else conversation(value) for value in values
        ]
        if checked and self.value is MISSING:
            self.value = []  # the first input goes through `add_messages` too (ids)
        changed = super().update(checked)
        if changed:
            self._packed = None
        return changed

    def checkpoint(self) -> Any:
        if self.value is MISSING or not self.value:
            return super().checkpoint()
        if self._packed is None:
            self._packed = _packed(self.value)
        return super().checkpoint() if self._packed is None else {_PACKED: self._packed}


class RunAggregate(BinaryOperatorAggregate[Value]):
    """A reducer's channel (`pending`'s `add_messages`) whose value lasts one run: the first
    step of the next run starts it over from empty, as `RunValue` clears its value.

    A finished run's value is its output (LangGraph reads the output after `finish()`) but
    is checkpointed empty: the next run would only clear it, and a finished turn's `pending`
    is committed, the same records `messages` keeps. Checkpointing it doubled the records
    in every kept checkpoint of a finished turn (and in the next run's input checkpoint).
    """

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
        stale, value = _stale(checkpoint)
        empty = super().from_checkpoint(value)
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
        # empty, not absent: LangGraph rebuilds an aggregate with a version and no stored
        # value from the writes of the thread's earlier checkpoints
        return self._empty() if self.stale else super().checkpoint()
