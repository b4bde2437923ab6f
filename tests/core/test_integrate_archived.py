"""`MainSession.integrate(include_archived=...)`: the final L2 of archived sessions as input."""

from __future__ import annotations

import pytest

from stello_graph import ChildL2, IntegrationResult, InvalidInputError, MainSession, Session
from stello_graph.storage import MainStorage
from tests.conftest import Api


def insight_to_all(children: list[ChildL2], current: str | None) -> IntegrationResult:
    return IntegrationResult(
        synthesis=" + ".join(c.l2 for c in children),
        insights={c.session_id: "note" for c in children},
    )


async def integrate(api: Api, main: MainSession, ids: object) -> IntegrationResult:
    if api.mode == "sync":
        return main.integrate(insight_to_all, include_archived=ids)  # type: ignore[arg-type]
    return await main.aintegrate(insight_to_all, include_archived=ids)  # type: ignore[arg-type]


async def test_archived_l2_is_an_input_without_insight(api: Api) -> None:
    storage: MainStorage = api.storage
    main = MainSession.create(storage)
    live, gone, bare = (Session.create(storage, label=x) for x in ("Live", "Gone", "Bare"))
    storage.put_memory(live.id, "live L2")
    storage.put_memory(gone.id, "gone L2")
    gone.archive()
    bare.archive()  # archived without an L2: nothing to bring

    result = await integrate(api, main, [gone.id, gone.id, bare.id, live.id, "unknown"])
    assert result.synthesis == "live L2 + gone L2"
    assert result.insights == {live.id: "note"}
    assert storage.get_insight(gone.id) is None
    assert main.synthesis() == "live L2 + gone L2"

    plain = await integrate(api, main, [])
    assert plain.synthesis == "live L2"


@pytest.mark.parametrize("bad", ["one-id", 7, [7]])
async def test_include_archived_refuses_bad_input(api: Api, bad: object) -> None:
    main = MainSession.create(api.storage)
    live = Session.create(api.storage, label="Live")
    api.storage.put_memory(live.id, "live L2")
    with pytest.raises(InvalidInputError):
        await integrate(api, main, bad)
    assert main.synthesis() is None
