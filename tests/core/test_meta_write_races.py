"""Writes that check a session's status (archive, meta updates, system prompt, insight) while
another writer changes it: the check and the write are one transaction, so an archive is
never undone and a concurrent update is never lost or written to an archived session.

Each test runs a second writer in another thread at the worst moment: right after the first
writer read the session's meta, before it wrote. The `Interleaved` storage starts it there and
waits until it has finished, or until it waits for the transaction the first writer holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from typing import Any, cast

import pytest

from stello_graph import Session, SessionArchivedError
from stello_graph.models import SessionMeta
from stello_graph.storage import MainStorage

Mode = str


class Interleaved:
    """A storage that runs `other` in a second thread just after the caller's first read of
    the session's meta, and records writes made to an archived session."""

    def __init__(self, storage: MainStorage, session_id: str) -> None:
        self._storage = storage
        self._session_id = session_id
        self._caller = threading.get_ident()
        self._held = 0  # transactions the caller's thread holds
        self._released = threading.Event()  # `other` finished, or waits for the caller
        self.other: Callable[[], object] | None = None
        self.other_error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.writes_when_archived: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    # -- transactions: know when the caller holds one -----------------------------------
    @contextmanager
    def _counted(self, inner: AbstractContextManager[None]) -> Iterator[None]:
        mine = threading.get_ident() == self._caller
        if not mine and self._held:
            self._released.set()  # the other writer is about to wait for the caller
        with inner:
            self._held += mine
            try:
                yield
            finally:
                self._held -= mine

    def transaction(self) -> AbstractContextManager[None]:
        return self._counted(self._storage.transaction())

    def atransaction(self) -> AbstractAsyncContextManager[None]:
        outer = self

        class _Async:
            async def __aenter__(self) -> None:
                self.inner = outer._storage.atransaction()
                await self.inner.__aenter__()
                outer._held += 1

            async def __aexit__(self, *exc: Any) -> bool | None:
                outer._held -= 1
                return await self.inner.__aexit__(*exc)

        return _Async()

    # -- the moment: right after the caller read the meta --------------------------------
    def _after_read(self, session_id: str) -> None:
        other, self.other = self.other, None
        if other is None or session_id != self._session_id:
            return
        if threading.get_ident() != self._caller:
            self.other = other
            return

        def run() -> None:
            try:
                other()
            except BaseException as exc:
                self.other_error = exc
            finally:
                self._released.set()

        self.thread = threading.Thread(target=run)
        self.thread.start()
        self._released.wait()

    def get_session(self, session_id: str) -> SessionMeta | None:
        found = self._storage.get_session(session_id)
        self._after_read(session_id)
        return found

    async def aget_session(self, session_id: str) -> SessionMeta | None:
        found = await self._storage.aget_session(session_id)
        self._after_read(session_id)
        return found

    # -- writes that must not land on an archived session --------------------------------
    def _check_active(self, what: str, session_id: str) -> None:
        meta = self._storage.get_session(session_id)
        if meta is not None and meta.status == "archived":
            self.writes_when_archived.append(what)

    async def _acheck_active(self, what: str, session_id: str) -> None:
        meta = await self._storage.aget_session(session_id)
        if meta is not None and meta.status == "archived":
            self.writes_when_archived.append(what)

    def put_system_prompt(self, session_id: str, prompt: str | None) -> None:
        self._check_active("system prompt", session_id)
        self._storage.put_system_prompt(session_id, prompt)

    async def aput_system_prompt(self, session_id: str, prompt: str | None) -> None:
        await self._acheck_active("system prompt", session_id)
        await self._storage.aput_system_prompt(session_id, prompt)

    def put_insight(self, session_id: str, insight: str) -> None:
        self._check_active("insight", session_id)
        self._storage.put_insight(session_id, insight)

    async def aput_insight(self, session_id: str, insight: str) -> None:
        await self._acheck_active("insight", session_id)
        await self._storage.aput_insight(session_id, insight)

    def join(self) -> None:
        assert self.thread is not None, "the other writer never ran"
        self.thread.join()


@pytest.fixture
def race(main_storage: MainStorage) -> tuple[Interleaved, Session, Session]:
    """`(storage, s, other)`: one session seen through two `Session` objects, as by two
    writers, on the interleaving storage."""
    created = Session.create(main_storage, label="Before", tags=["t0"])
    storage = Interleaved(main_storage, created.id)
    as_storage = cast(MainStorage, storage)
    return storage, Session.load(created.id, as_storage), Session.load(created.id, as_storage)


async def _call(s: Session, mode: Mode, name: str, *args: Any, **kwargs: Any) -> Any:
    if mode == "sync":
        return getattr(s, name)(*args, **kwargs)
    return await getattr(s, f"a{name}")(*args, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_update_never_undoes_a_concurrent_archive(
    race: tuple[Interleaved, Session, Session], mode: Mode
) -> None:
    storage, s, other = race
    storage.other = other.archive
    await _call(s, mode, "update_meta", label="After")
    storage.join()
    assert storage.other_error is None
    meta = s.meta
    assert meta.status == "archived"  # the update ran first, then the archive: both stay
    assert meta.label == "After"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_archive_never_drops_a_concurrent_update(
    race: tuple[Interleaved, Session, Session], mode: Mode
) -> None:
    storage, s, other = race
    storage.other = lambda: other.update_meta(label="Renamed")
    await _call(s, mode, "archive")
    storage.join()
    meta = s.meta
    assert meta.status == "archived"
    # the update either landed before the archive, or was refused after it: never lost
    if storage.other_error is None:
        assert meta.label == "Renamed"
    else:
        assert isinstance(storage.other_error, SessionArchivedError)
        assert meta.label == "Before"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_two_updates_of_different_fields_both_stay(
    race: tuple[Interleaved, Session, Session], mode: Mode
) -> None:
    storage, s, other = race
    storage.other = lambda: other.update_meta(label="Renamed")
    await _call(s, mode, "update_meta", tags=["t1"])
    storage.join()
    assert storage.other_error is None
    assert (s.meta.label, s.meta.tags) == ("Renamed", ("t1",))


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("write", ["set_system_prompt", "set_insight"])
async def test_a_write_checked_active_never_lands_on_an_archived_session(
    race: tuple[Interleaved, Session, Session], mode: Mode, write: str
) -> None:
    storage, s, other = race
    storage.other = other.archive
    await _call(s, mode, write, "new text")
    storage.join()
    assert storage.other_error is None
    assert s.meta.status == "archived"
    assert storage.writes_when_archived == []
