"""Typed errors raised by stello-graph.

Every error derives from `StelloError`. Mistakes in how the library is called (bad
arguments, missing configuration) derive from `StelloUsageError`; failures that happen at run
time (a session that does not exist, a model that raised, a database that cannot be used)
derive from the other branches::

    StelloError
    ├── StelloUsageError                 a developer mistake: fix the call
    │   ├── InvalidInputError            bad argument value (also a ValueError)
    │   │   ├── SkillLoadError           a SKILL.md file cannot be read as a skill
    │   │   └── TurnOutOfRangeError      a fork's `at_turn` names no user turn of its source
    │   ├── ModelNotConfiguredError      a call needs a chat model and none was given
    │   ├── FunctionNotConfiguredError   consolidate / integrate / compress function missing
    │   ├── MainSessionForkError         the main session cannot fork
    │   ├── NothingToIntegrateError      integrate() found no child L2 to read
    │   ├── StreamNotFinishedError       a stream's result was read before it ended
    │   ├── TimeTravelError              time travel that cannot branch (a ValueError)
    │   ├── UnknownProfileError          a fork named an unregistered profile (a LookupError)
    │   └── ScriptExhaustedError         (stello_graph.testing) a scripted model ran out
    ├── SessionError
    │   ├── SessionNotFoundError         no session with that id (also a LookupError)
    │   │   └── MainSessionNotFoundError the tree has no main session yet
    │   ├── SessionArchivedError         the session is archived and refuses the operation
    │   ├── DuplicateSessionError        a session with that id already exists
    │   ├── MainSessionExistsError       the tree already has a main session
    │   ├── SessionBusyError             the session is held by a turn this call is part of
    │   ├── LeaseLostError               a turn lost its hold on the session; nothing stored
    │   └── IntegrationSupersededError   another integration was stored meanwhile; nothing stored
    ├── TopologyError
    │   ├── NodeNotFoundError            no topology node with that id (also a LookupError)
    │   ├── NodeHasChildrenError         removing a node with children without cascade
    │   ├── TopologyCycleError           a move would put a node under its own subtree
    │   ├── DuplicateLabelError          a fork asked for unique labels reused a sibling's
    │   └── SplitGuardError              the split guard refused a fork the model asked for
    ├── ModelCallError                   the chat model raised; the cause is chained
    ├── ToolRoundLimitError              a turn asked for more tool rounds than allowed
    ├── FunctionCallError
    │   ├── ConsolidationError           the consolidate function failed or returned garbage
    │   └── IntegrationError             the integrate function failed or returned garbage
    └── StorageError                     the storage backend failed
        ├── SchemaVersionError           the database was written by a newer schema
        ├── NotADatabaseError            the file is not a SQLite database
        ├── ForeignDatabaseError         another application's database, not stello's
        ├── DamagedDataError             stored data that does not decode (a row, a file)
        └── StorageUnavailableError      the database server cannot be reached, or went away
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ConsolidationError",
    "DamagedDataError",
    "DuplicateLabelError",
    "DuplicateSessionError",
    "ForeignDatabaseError",
    "FunctionCallError",
    "FunctionNotConfiguredError",
    "IntegrationError",
    "IntegrationSupersededError",
    "InvalidInputError",
    "LeaseLostError",
    "MainSessionExistsError",
    "MainSessionForkError",
    "MainSessionNotFoundError",
    "ModelCallError",
    "ModelNotConfiguredError",
    "NodeHasChildrenError",
    "NodeNotFoundError",
    "NotADatabaseError",
    "NothingToIntegrateError",
    "SchemaVersionError",
    "SessionArchivedError",
    "SessionBusyError",
    "SessionError",
    "SessionNotFoundError",
    "SkillLoadError",
    "SplitGuardError",
    "StelloError",
    "StelloUsageError",
    "StorageError",
    "StorageUnavailableError",
    "StreamNotFinishedError",
    "TimeTravelError",
    "ToolRoundLimitError",
    "TopologyCycleError",
    "TopologyError",
    "TurnOutOfRangeError",
    "UnknownProfileError",
]


class StelloError(RuntimeError):
    """Base class of every error raised by stello-graph.

    A `RuntimeError`, so hosts that show the class and message of runtime errors only
    (LangGraph Server hides any other exception behind "An internal error occurred") show
    stello's: `SessionArchivedError: ...` reaches the SDK client as it was raised.
    """


class StelloUsageError(StelloError):
    """The library was called the wrong way; the message says how to fix the call."""


class InvalidInputError(StelloUsageError, ValueError):
    """An argument has a value the library cannot accept (empty text, wrong type, ...)."""


class SkillLoadError(InvalidInputError):
    """A `SKILL.md` file could not be read as a skill; the message names the file."""


class TurnOutOfRangeError(InvalidInputError):
    """A fork's `at_turn` names no user turn of its source (1-based; negative counts from
    the end)."""

    def __init__(self, session_id: str, at_turn: int, turns: int) -> None:
        valid = f"1..{turns} or -{turns}..-1" if turns else "none: it has no user turn yet"
        super().__init__(
            f"at_turn={at_turn} names no user turn of session {session_id!r}, which has "
            f"{turns} user turn(s) (valid: {valid})."
        )
        self.session_id = session_id
        self.at_turn = at_turn
        self.turns = turns


class ModelNotConfiguredError(StelloUsageError):
    """An operation needs a chat model, and none was given to the session."""


class FunctionNotConfiguredError(StelloUsageError):
    """consolidate / integrate / compress was called with no function given or bound."""


class MainSessionForkError(StelloUsageError):
    """The main session does not fork; children are created by the orchestration layer."""


class NothingToIntegrateError(StelloUsageError):
    """`integrate()` found no active child session with an L2 to read."""


class StreamNotFinishedError(StelloUsageError):
    """A stream's `result` was read before the stream was consumed to its end."""


class TimeTravelError(StelloUsageError, ValueError):
    """Time travel on a stello thread that cannot branch: a replay or an edit of a
    checkpoint in the middle of a turn, or an edit of a key other than `messages`.

    A run from an earlier checkpoint between turns, or after an edit of `messages`, goes on
    from a fork of the session at the turn that checkpoint stands at (see
    `stello_graph.nodes.entry`); nothing is written before this error.
    """

    def __init__(self, what: str, why: str) -> None:
        super().__init__(
            f"{what} is refused on a stello thread: {why}. A session's history (L3) is kept "
            "by its committed turns; to go back to an earlier turn, replay a checkpoint "
            "between turns (the run goes on from a fork), or fork the session there "
            "(`agent.fork(session_id, label, at_turn=N)`)."
        )


class UnknownProfileError(StelloUsageError, LookupError):
    """A fork named a profile that is not registered (register it, or name a known one)."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        listed = ", ".join(repr(k) for k in known) or "none are registered"
        super().__init__(f"Unknown fork profile {name!r}; known profiles: {listed}.")
        self.name = name


class _OfSession(StelloError):
    """An error that may name the session it happened in (`session_id`)."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionError(_OfSession):
    """Base class of errors about one session."""


class SessionNotFoundError(SessionError, LookupError):
    """No session with the given id exists in this storage (and tree)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id!r} does not exist.", session_id=session_id)


class MainSessionNotFoundError(SessionNotFoundError):
    """The tree has no main session yet (create one with `MainSession.create`)."""

    def __init__(self, tree_id: str) -> None:
        SessionError.__init__(
            self,
            f"Tree {tree_id!r} has no main session; create one with MainSession.create().",
        )
        self.tree_id = tree_id


class SessionArchivedError(SessionError):
    """The session is archived: it accepts no new turns, forks, consolidations or updates."""

    def __init__(self, session_id: str, operation: str = "this operation") -> None:
        super().__init__(
            f"Session {session_id!r} is archived and refuses {operation}.",
            session_id=session_id,
        )
        self.operation = operation


class DuplicateSessionError(SessionError):
    """A session with the requested id already exists."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"A session with id {session_id!r} already exists; pass another id or none.",
            session_id=session_id,
        )


class MainSessionExistsError(SessionError):
    """The tree already has a main session; load it instead of creating another."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"This tree already has a main session ({session_id!r}); "
            "use MainSession.load() or another tree_id.",
            session_id=session_id,
        )


class SessionBusyError(SessionError):
    """The session is held by a turn that this very call is part of (a tool of that turn, or
    code inside `StelloAgent.hold`), or it stayed held longer than the caller would wait.

    Waiting would never end in the first case: the turn waits for the tool that waits for
    the turn. Run the operation after the turn ends instead.
    """

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"Session {session_id!r} is busy: {reason}", session_id=session_id)


class LeaseLostError(SessionError):
    """A turn's lease on its session lapsed and another holder took the session over, so
    the turn's records were not committed (nothing of it is stored); run it again."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"The turn on session {session_id!r} lost its lease (it was not renewed in time "
            "and another turn took the session over): nothing of it was stored; run it again.",
            session_id=session_id,
        )


class IntegrationSupersededError(SessionError):
    """Another integration of the tree was stored while this one ran, so this one's result
    (made from the synthesis it read, no longer the stored one) was dropped: nothing of it
    is stored. The archived branches it brought stay pending for the next integration."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"The integration of main session {session_id!r} was superseded: another "
            "integration was stored while it ran, so its result (made from a synthesis that "
            "is no longer the stored one) was dropped and nothing of it was stored; "
            "integrate again to include what changed.",
            session_id=session_id,
        )


class TopologyError(StelloError):
    """Base class of errors about the topology tree."""


class NodeNotFoundError(TopologyError, LookupError):
    """No topology node with the given id exists."""

    def __init__(self, node_id: str, *, message: str | None = None) -> None:
        super().__init__(message or f"Topology node {node_id!r} does not exist.")
        self.node_id = node_id


class NodeHasChildrenError(TopologyError):
    """The node has children; remove them first or pass `cascade=True`."""

    def __init__(self, node_id: str, children: int) -> None:
        super().__init__(
            f"Topology node {node_id!r} has {children} child node(s); "
            "pass cascade=True to remove the whole subtree."
        )
        self.node_id = node_id
        self.children = children


class TopologyCycleError(TopologyError):
    """The requested parent lies inside the node's own subtree."""

    def __init__(self, node_id: str, parent_id: str) -> None:
        super().__init__(
            f"Cannot put node {node_id!r} under {parent_id!r}: "
            f"{parent_id!r} is {node_id!r} itself or one of its descendants."
        )
        self.node_id = node_id
        self.parent_id = parent_id


class DuplicateLabelError(TopologyError):
    """A fork asked for a label unique among its siblings (`unique_labels`), and a sibling
    already has it: nothing was written."""

    def __init__(self, parent_id: str, label: str, sibling_id: str) -> None:
        super().__init__(
            f"Session {parent_id!r} already has a child labelled {label!r} ({sibling_id!r}): "
            "continue in that session, or choose another label."
        )
        self.parent_id = parent_id
        self.label = label
        self.sibling_id = sibling_id


class SplitGuardError(TopologyError):
    """The split guard refused a model-initiated fork; the message gives the reason."""


class ModelCallError(_OfSession):
    """The chat model raised during a call; the original exception is the `__cause__`."""


class ToolRoundLimitError(_OfSession):
    """A turn's model kept asking for tools past `max_tool_rounds`; nothing was committed."""

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(
            f"The turn on session {session_id!r} exceeded max_tool_rounds={limit}: the model "
            "asked for tools again. Nothing of the turn was stored; raise the limit or change "
            "the tools.",
            session_id=session_id,
        )
        self.limit = limit


class FunctionCallError(_OfSession):
    """A user-supplied (or default LLM-backed) memory function failed."""


class ConsolidationError(FunctionCallError):
    """The consolidate function raised or returned something other than text."""


class IntegrationError(FunctionCallError):
    """The integrate function raised or returned something other than an IntegrationResult."""


class StorageError(StelloError):
    """The storage backend failed in a way the caller cannot fix by changing arguments."""


class SchemaVersionError(StorageError):
    """The database was written by a newer version of stello-graph than this one."""


class NotADatabaseError(StorageError):
    """The file given as a database is not a SQLite database."""


class ForeignDatabaseError(StorageError):
    """The database holds another application's tables and no stello-graph data.

    Stello adds its tables to such a SQLite file only when asked
    (`SqliteMainStorage(path, allow_foreign_tables=True)`); the file is left untouched. A
    PostgreSQL database is refused when it holds tables named like stello's that stello did
    not make.
    """


class DamagedDataError(StorageError):
    """Stored data cannot be read back: a session's row holds a value that does not decode
    (text that is not UTF-8, a JSON column that is not JSON, an unknown role or status), or
    the database file fails SQLite's `PRAGMA quick_check`.

    A read of the damaged session raises it, naming the session and the column; whole-tree
    reads (`tree()`, `digests()`, the export, the inspector) show every other session as it
    is and the damaged one as a placeholder marked `damaged` with its columns.
    """


class StorageUnavailableError(StorageError):
    """The database server cannot be reached (wrong address, server down, refused login),
    or the connection was lost during an operation.

    Nothing of the interrupted transaction is stored; the operation can be retried once the
    server is back (the storage reconnects on its next call).
    """
