"""The inspector's writes: refused without `write=True`; validated; applied through the agent."""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from stello_graph import ChildL2, IntegrationResult, MainSession, StelloAgent
from stello_graph.testing import ScriptedChatModel
from tests.inspector.conftest import Tree, inspector_app, page_headers

WRITES = [
    ("POST", "fork", {"label": "New"}),
    ("POST", "consolidate", {}),
    ("POST", "archive", {}),
    ("PUT", "insight", {"insight": "x"}),
    ("PUT", "system_prompt", {"system_prompt": "x"}),
]


@pytest.mark.parametrize(("method", "action", "body"), WRITES)
def test_every_write_is_refused_when_read_only(
    tree: Tree, client: TestClient, method: str, action: str, body: dict[str, object]
) -> None:
    before = client.get("/api/tree").json()
    response = client.request(method, f"/api/session/{action}?id={tree.pricing}", json=body)
    assert response.status_code == 403
    assert "--write" in response.json()["error"]
    assert client.get("/api/tree").json() == before


def test_integrate_is_refused_when_read_only(client: TestClient) -> None:
    assert client.post("/api/integrate", json={"mode": "flat"}).status_code == 403


def test_fork_with_and_without_context(tree: Tree, writer: TestClient) -> None:
    response = writer.post(f"/api/session/fork?id={tree.pricing}", json={"label": "Plain"})
    assert response.status_code == 201
    plain = response.json()["node"]
    assert plain["parent_id"] == tree.pricing and tree.storage.count_records(plain["id"]) == 0
    body = {"label": "Copy", "context": "inherit", "system_prompt": "Be brief."}
    copy = writer.post(f"/api/session/fork?id={tree.pricing}", json=body).json()["node"]
    assert tree.storage.count_records(copy["id"]) == 8
    assert tree.storage.get_system_prompt(copy["id"]) == "Be brief."


def test_fork_at_a_turn_copies_the_records_up_to_its_end(tree: Tree, writer: TestClient) -> None:
    body = {"label": "From turn 1", "at_turn": 1}
    node = writer.post(f"/api/session/fork?id={tree.pricing}", json=body).json()["node"]
    records = tree.storage.list_records(node["id"])
    assert [r.type for r in records] == ["human", "ai", "tool", "ai"]
    too_far = writer.post(f"/api/session/fork?id={tree.pricing}", json={"label": "x", "at_turn": 9})
    assert too_far.status_code == 400 and "3 user turn(s)" in too_far.json()["error"]
    lineage = writer.get(f"/api/session?id={node['id']}").json()["lineage"]
    assert lineage == {"forked_from": tree.pricing, "source_label": "Pricing", "forked_at_turn": 1}
    assert writer.get(f"/api/session?id={tree.main}").json()["lineage"] is None


def test_consolidate_integrate_archive(tree: Tree, writer: TestClient) -> None:
    l2 = writer.post(f"/api/session/consolidate?id={tree.pricing}").json()["l2"]
    assert l2 == tree.storage.get_memory(tree.pricing)
    assert tree.storage.get_memory_through(tree.pricing) == 8
    flat = writer.post("/api/integrate", json={"mode": "flat"}).json()
    assert flat["synthesis"] == tree.storage.get_memory(tree.main)
    deep = writer.post("/api/integrate", json={"mode": "tree"}).json()
    assert deep["mode"] == "tree" and deep["calls"] >= 1
    meta = writer.post(f"/api/session/archive?id={tree.tiers}").json()["meta"]
    assert meta["status"] == "archived"
    again = writer.post(f"/api/session/consolidate?id={tree.tiers}")
    assert again.status_code == 409 and "archived" in again.json()["error"]


def test_an_integration_superseded_meanwhile_is_a_conflict(tree: Tree) -> None:
    """Another integration stored while the inspector's ran: a 409 that says so, nothing of
    the late one stored."""

    def meanwhile(children: list[ChildL2], current: str | None) -> IntegrationResult:
        MainSession.load(tree.storage).integrate(lambda c, s: IntegrationResult(synthesis="first"))
        return IntegrationResult(synthesis="late")

    agent = StelloAgent(model=ScriptedChatModel(), storage=tree.storage, integrate_fn=meanwhile)
    app = inspector_app(tree.storage, write=True, agent=lambda: agent)
    try:
        with TestClient(app, headers=page_headers(app)) as writer:
            found = writer.post("/api/integrate", json={"mode": "flat"})
    finally:
        agent.close()
    assert found.status_code == 409, found.json()
    assert found.json()["type"] == "IntegrationSupersededError"
    assert tree.storage.get_memory(tree.main) == "first"


def test_edit_insight_and_system_prompt(tree: Tree, writer: TestClient) -> None:
    insight, prompt = (
        f"/api/session/{what}?id={tree.tiers}" for what in ("insight", "system_prompt")
    )
    assert writer.put(insight, json={"insight": "Mind the cap."}).status_code == 200
    assert tree.storage.get_insight(tree.tiers) == "Mind the cap."
    writer.put(insight, json={"insight": None})
    assert tree.storage.get_insight(tree.tiers) is None
    writer.put(prompt, json={"system_prompt": "Be short."})
    assert tree.storage.get_system_prompt(tree.tiers) == "Be short."
    main_insight = writer.put(f"/api/session/insight?id={tree.main}", json={"insight": "x"})
    assert main_insight.status_code == 400 and "synthesis" in main_insight.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("fork", {}, "'label' must be a non-empty string"),
        ("fork", {"label": "x", "context": "all"}, "'context' must be 'none' or 'inherit'"),
        ("fork", {"label": "x", "at_turn": 0}, "'at_turn' must be an int >= 1"),
        ("fork", {"label": "x", "colour": "red"}, "Unknown field(s) 'colour'"),
        ("insight", {"insight": 3}, "'insight' must be a non-empty string or null"),
        ("consolidate", [1], "must be a JSON object"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_value(
    tree: Tree, writer: TestClient, path: str, body: object, message: str
) -> None:
    method = "PUT" if path == "insight" else "POST"
    response = writer.request(method, f"/api/session/{path}?id={tree.pricing}", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_bad_json_unknown_ids_and_unknown_writes(tree: Tree, writer: TestClient) -> None:
    raw = writer.post(f"/api/session/fork?id={tree.pricing}", content=b"{nope")
    assert raw.status_code == 400 and "not JSON" in raw.json()["error"]
    missing = writer.post("/api/session/consolidate?id=nope")
    assert missing.status_code == 404 and "'nope'" in missing.json()["error"]
    unknown = writer.post(f"/api/session/explode?id={tree.pricing}")
    assert unknown.status_code == 404 and "'explode'" in unknown.json()["error"]
    bad_mode = writer.post("/api/integrate", json={"mode": "sideways"})
    assert bad_mode.status_code == 400 and "'sideways'" in bad_mode.json()["error"]


def test_fork_form_offers_the_inherited_turns_of_a_forked_session(
    tree: Tree, writer: TestClient
) -> None:
    # The copy inherits Pricing's 3 user turns and has none of its own yet: the fork form
    # offers the 3 turns at_turn can name, not the session's own turn count (0).
    body = {"label": "Copy", "context": "inherit"}
    copy = writer.post(f"/api/session/fork?id={tree.pricing}", json=body).json()["node"]["id"]
    view = writer.get(f"/api/session?id={copy}").json()
    assert (view["turns"], view["fork_turns"]) == (0, 3)
    tree.agent.turn(copy, "One more?")
    view = writer.get(f"/api/session?id={copy}").json()
    assert (view["turns"], view["fork_turns"]) == (1, 4)
    body = {"label": "From turn 4", "at_turn": view["fork_turns"]}
    node = writer.post(f"/api/session/fork?id={copy}", json=body).json()["node"]
    assert sum(r.type == "human" for r in tree.storage.list_records(node["id"])) == 4


def test_shutting_down_closes_the_agent_off_the_event_loop(tree: Tree) -> None:
    """Closing an agent waits for its background jobs: the server's shutdown does it in a
    worker thread, after the poll's last read, never on the loop."""
    closed: list[bool] = []

    class Recording(StelloAgent):
        def close(self) -> None:
            try:
                asyncio.get_running_loop()
                closed.append(False)  # on the loop
            except RuntimeError:
                closed.append(True)
            super().close()

    made: list[StelloAgent] = []

    def agent() -> StelloAgent:
        made.append(Recording(model=ScriptedChatModel(default="ok"), storage=tree.storage))
        return made[0]

    app = inspector_app(tree.storage, write=True, agent=agent)
    with TestClient(app, headers=page_headers(app)) as writer:
        assert writer.post(f"/api/session/fork?id={tree.pricing}", json={"label": "X"}).is_success
    assert made and closed == [True]


def test_every_write_reaches_a_session_whose_id_a_path_would_mangle(
    tree: Tree, writer: TestClient
) -> None:
    for sid in ("a/b", ".."):
        tree.agent.fork(tree.pricing, f"Odd {sid}", id=sid)
        tree.agent.turn(sid, "Hello?")
        params = {"id": sid}
        node = writer.post("/api/session/fork", params=params, json={"label": "Child"})
        assert node.status_code == 201 and node.json()["node"]["parent_id"] == sid
        assert writer.put("/api/session/insight", params=params, json={"insight": "i"}).is_success
        assert tree.storage.get_insight(sid) == "i"
        prompt = {"system_prompt": "p"}
        assert writer.put("/api/session/system_prompt", params=params, json=prompt).is_success
        assert tree.storage.get_system_prompt(sid) == "p"
        assert writer.post("/api/session/consolidate", params=params).is_success
        assert tree.storage.get_memory_through(sid) == 2
        assert writer.post("/api/session/archive", params=params).is_success
        assert tree.storage.get_session(sid).status == "archived"  # type: ignore[union-attr]
