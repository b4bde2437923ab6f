"""Reading what a turn shows its model: the session's context, compressed when it outgrows
the model's window (`CompressionPolicy`)."""

from __future__ import annotations

from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph._calls import call_async, call_sync, failing_as
from stello_graph._context import summary_block, system_message
from stello_graph._copies import detached_all
from stello_graph._flow import Call, Flow, Storage, arun, run
from stello_graph._session_core import SessionCore
from stello_graph._text import storable
from stello_graph._turn_parts import _READ, ContextParts, TurnContext, _opt_str
from stello_graph.compression import plan_cut
from stello_graph.errors import (
    FunctionCallError,
    FunctionNotConfiguredError,
    SessionNotFoundError,
)
from stello_graph.memory import CompressFn, llm_compressor
from stello_graph.models import Compression, SessionMeta
from stello_graph.storage import MainStorage, SessionSnapshot

__all__ = ["SessionContext"]


class SessionContext(SessionCore):
    """The context layer of a session: `open_turn`, `turn_context` and compression."""

    def open_turn(self, *, operation: str = "a turn") -> str | None:
        """Refuse a turn on an archived session; return the insight the turn will show.

        A cheap check for the start of a turn: the history is read by `turn_context`.
        """
        return run(self._open_flow(operation), self._storage)

    async def aopen_turn(self, *, operation: str = "a turn") -> str | None:
        """Async twin of `open_turn`."""
        return await arun(self._open_flow(operation), self._storage)

    def _open_flow(self, operation: str) -> Flow[str | None]:
        self._active((yield from self._meta_flow()), operation)
        if self.role == "main":
            return None
        insight: str | None = yield Storage(MainStorage.get_insight, self._id)
        return insight

    def turn_context(
        self,
        *,
        operation: str = "a turn",
        insight: object = _READ,
        turn_id: str | None = None,
        snapshot: SessionSnapshot | None = None,
    ) -> TurnContext:
        """Read everything a turn shows the model; refuse if the session is archived.

        `insight` replaces the stored insight (a multi-round turn keeps showing the insight
        it started with, even if a newer one arrives meanwhile). When the prompt would
        outgrow the model's context window, the oldest records are summarised (see
        `CompressionPolicy`); that may call the compress function.

        With the `turn_id` of a turn of several model calls, its later calls get the context
        its first one read (L3 changes only when a turn commits), unless the session's L3
        changed meanwhile: a turn reads its context once.

        The session is read in one storage read (`SessionStorage.read_session`), or not at
        all when the caller already read it under the turn's lease and passes its `snapshot`.
        """
        flow = self._context_flow(operation, insight, turn_id, snapshot)
        return run(flow, self._storage)

    async def aturn_context(
        self,
        *,
        operation: str = "a turn",
        insight: object = _READ,
        turn_id: str | None = None,
        snapshot: SessionSnapshot | None = None,
    ) -> TurnContext:
        """Async twin of `turn_context`."""
        flow = self._context_flow(operation, insight, turn_id, snapshot)
        return await arun(flow, self._storage)

    def _context_flow(
        self,
        operation: str,
        insight: object,
        turn_id: str | None,
        snapshot: SessionSnapshot | None = None,
    ) -> Flow[TurnContext]:
        sid, kept = self._id, self._turn
        held = turn_id is not None and kept is not None and kept[0] == turn_id
        if held and kept is not None and (yield Storage(MainStorage.count_records, sid)) == kept[1]:
            return kept[2]
        snap: SessionSnapshot | None = snapshot or (yield Storage(MainStorage.read_session, sid))
        if snap is None:
            raise SessionNotFoundError(sid)
        meta = self._active(snap.meta, operation)
        parts = ContextParts(prompt=snap.system_prompt, compression=snap.compression)
        if self.role == "main":
            parts.extra = snap.memory
        else:
            parts.extra = snap.insight if insight is _READ else _opt_str(insight)
            parts.branch = snap.subtree_synthesis
            if self._topology_slot is not None:
                parts.topology = yield from self._topology_slot.flow(sid)
        records = list(snap.records)
        system = self._system(meta, parts)
        cut = self._plan(system, parts, records)
        if cut is not None:
            parts.compression = yield from self._compress_flow(parts.compression, records, cut)
            system = self._system(meta, parts)
        through = parts.compression.through if parts.compression is not None else 0
        insight = None if self.role == "main" else parts.extra
        ctx = TurnContext(sid, system, self._history(records[through:]), insight, parts.compression)
        self._turn = None if turn_id is None else (turn_id, len(records), ctx)
        return ctx

    def _system(self, meta: SessionMeta, parts: ContextParts) -> SystemMessage | None:
        summary = parts.compression.summary if parts.compression is not None else None
        blocks = self._blocks(meta, parts)
        return system_message([parts.prompt, *blocks, summary_block(summary) if summary else None])

    def _blocks(self, meta: SessionMeta, parts: ContextParts) -> list[str | None]:
        """The system message's parts between the session's own prompt and the summary."""
        raise NotImplementedError

    # -- automatic compression --------------------------------------------------------------
    def _plan(
        self, system: SystemMessage | None, parts: ContextParts, records: list[BaseMessage]
    ) -> int | None:
        policy = self._compression
        if policy is None:
            return None
        window = policy.limit(self._model)
        head = [system] if system is not None else []
        # The usage figures of replies older than the summary in use measured a prompt that
        # still held the records it now covers: a tool round of the turn that cut (its own
        # replies are not in L3 yet), or the turn after one that failed, must not judge the
        # shorter history by them, or it cuts again and keeps less than the budget allows.
        cut = self._cut
        fresh = cut[1] if cut is not None and cut[0] == parts.compression else 0
        return plan_cut(policy, window, head, records, parts.compression, measured_from=fresh)

    def _compressor(self) -> CompressFn:
        policy = self._compression
        if policy is not None and policy.compress_fn is not None:
            return policy.compress_fn
        if self._model is None:
            raise FunctionNotConfiguredError(
                f"Session {self._id!r} has no compress function and no model to build one: "
                "pass CompressionPolicy(compress_fn=...) or a model."
            )
        return llm_compressor(self._model)

    def _compress_flow(
        self, current: Compression | None, records: list[BaseMessage], cut: int
    ) -> Flow[Compression]:
        start = current.through if current is not None else 0
        previous = current.summary if current is not None else None
        with failing_as(self._compress_error):
            older = detached_all(records[start:cut])
            result = yield Call(call_sync, call_async, (self._compressor(), previous, older))
        if not isinstance(result, str) or not result.strip():
            raise FunctionCallError(
                f"The compress function of session {self._id!r} returned {result!r:.60}, "
                "expected a non-empty summary.",
                session_id=self._id,
            )
        compression = Compression(summary=storable(result), through=cut)
        yield Storage(MainStorage.put_compression, self._id, compression)
        self._cut = compression, len(records)
        return compression

    def _compress_error(self, exc: Exception) -> FunctionCallError:
        return FunctionCallError(
            f"Compressing the context of session {self._id!r} failed: {type(exc).__name__}: {exc}",
            session_id=self._id,
        )
