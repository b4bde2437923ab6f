"""The inspector's read API, in process: what each endpoint returns, and bad input."""

from __future__ import annotations

from langchain_core.messages import SystemMessage
from starlette.testclient import TestClient

from stello_graph import StelloAgent
from stello_graph.compression import CompressionPolicy
from stello_graph.inspector._views import tree_nodes
from stello_graph.main_session import MainSession
from stello_graph.models import Compression
from stello_graph.schedule import BackgroundFailure, StorageFailureLog
from stello_graph.session import Session
from stello_graph.testing import ScriptedChatModel
from tests.inspector.conftest import Tree, inspector_app


def _nodes(client: TestClient) -> dict[str, dict[str, object]]:
    response = client.get("/api/tree")
    assert response.status_code == 200
    return {node["id"]: node for node in tree_nodes(response.json())}


def test_tree_lists_every_node_with_what_the_page_needs(tree: Tree) -> None:
    # Stored before the server starts: its poll loop serves the tree it encoded until a stored
    # event shows a change, and a failure appended straight to the log is no event.
    StorageFailureLog(tree.storage).append(
        BackgroundFailure(
            kind="consolidate", session_id=tree.tiers, error_type="E", message="x", attempts=3
        )
    )
    with TestClient(inspector_app(tree.storage)) as client:
        data = client.get("/api/tree").json()
        nodes = _nodes(client)
    assert data["main_session_id"] == tree.main and data["count"] == 4
    assert [n["id"] for n in data["nodes"]] == [tree.main, tree.pricing, tree.tiers, tree.growth]
    pricing, tiers, growth = nodes[tree.pricing], nodes[tree.tiers], nodes[tree.growth]
    assert pricing["parent_id"] == tree.main and tiers["parent_id"] == tree.pricing
    assert (nodes[tree.main]["depth"], pricing["depth"], tiers["depth"]) == (0, 1, 2)
    assert (pricing["turns"], pricing["records"], pricing["memory_through"]) == (3, 8, 6)
    assert pricing["stale_turns"] == 1  # one turn since the L2 was made
    assert pricing["has_l2"] and pricing["has_insight"] and pricing["has_subtree_synthesis"]
    assert growth["status"] == "archived" and nodes[tree.main]["role"] == "main"
    assert (tiers["failures"], pricing["failures"]) == (1, 0)
    assert pricing["label"] == "Pricing"


def test_the_compact_tree_has_the_same_nodes_as_rows(client: TestClient) -> None:
    full, compact = client.get("/api/tree").json(), client.get("/api/tree?compact=1").json()
    assert compact["fields"][:5] == ["id", "parent_id", "label", "role", "status"]
    assert all(isinstance(row, list) for row in compact["nodes"])
    assert tree_nodes(compact) == full["nodes"]
    assert {k: v for k, v in compact.items() if k not in ("fields", "nodes")} == {
        k: v for k, v in full.items() if k != "nodes"
    }


def test_session_shows_meta_memory_insight_and_prompt(tree: Tree, client: TestClient) -> None:
    data = client.get(f"/api/session?id={tree.pricing}").json()
    assert data["meta"]["label"] == "Pricing" and data["parent_id"] == tree.main
    assert data["system_prompt"] == "Think about prices."
    assert data["l2"] == tree.storage.get_memory(tree.pricing)
    assert (data["memory_through"], data["stale_turns"], data["records"]) == (6, 1, 8)
    assert data["insight"] == "Growth wants a free tier."
    assert data["subtree_synthesis"] == "Tiers: three of them."
    assert data["synthesis"] is None
    assert [c["id"] for c in data["children"]] == [tree.tiers]
    assert data["compression"] == {"summary": "They talked about tiers.", "through": 2}


def test_the_main_session_shows_its_synthesis(tree: Tree, client: TestClient) -> None:
    data = client.get(f"/api/session?id={tree.main}").json()
    assert data["synthesis"] == tree.storage.get_memory(tree.main) and data["synthesis"]
    assert data["l2"] is None and data["insight"] is None
    assert data["meta"]["role"] == "main"


def test_records_are_paged_and_grouped_by_turn(tree: Tree, client: TestClient) -> None:
    data = client.get(f"/api/session/records?id={tree.pricing}").json()
    assert data["total"] == 8 and data["memory_through"] == 6
    records = data["records"]
    assert [r["turn"] for r in records] == [1, 1, 1, 1, 2, 2, 3, 3]
    assert [r["index"] for r in records] == list(range(1, 9))
    call = records[1]["tool_calls"][0]
    assert (call["name"], call["args"]) == ("lookup", {"topic": "tiers"})
    assert records[2]["role"] == "tool" and records[2]["tool_call_id"] == call["id"]
    assert records[2]["content"] == "notes on tiers"
    page = client.get(f"/api/session/records?id={tree.pricing}&offset=4&limit=3").json()
    assert [(r["index"], r["turn"]) for r in page["records"]] == [(5, 2), (6, 2), (7, 3)]


def _system_of(tree: Tree, session_id: str) -> SystemMessage | None:
    session: Session | MainSession = tree.agent.session(session_id)
    return session.turn_context().system


def test_context_is_the_exact_prompt_of_the_next_turn(tree: Tree, client: TestClient) -> None:
    for sid in (tree.pricing, tree.main, tree.tiers):
        data = client.get(f"/api/session/context?id={sid}").json()
        ctx = tree.agent.session(sid).turn_context()
        system = [m for m in data["messages"] if m["role"] == "system"]
        expected = ctx.system.content if ctx.system is not None else None
        assert (system[0]["content"] if system else None) == expected
        history = [(m["role"], m["content"]) for m in data["messages"] if m["role"] != "system"]
        assert history == [(m.type, m.text) for m in ctx.history]


def test_context_parts_are_labelled_and_sized(tree: Tree, client: TestClient) -> None:
    data = client.get(f"/api/session/context?id={tree.pricing}").json()
    parts = data["messages"][0]["parts"]
    assert [p["kind"] for p in parts] == [
        "system prompt", "identity", "insight", "subtree synthesis", "compression summary"
    ]  # fmt: skip
    assert parts[0]["text"] == "Think about prices."
    assert all(p["chars"] == len(p["text"]) and p["tokens"] == -(-p["chars"] // 4) for p in parts)
    assert data["history_from"] == 3  # the summary stands for the first two records
    kinds = {s["kind"]: s for s in data["sizes"]}
    assert set(kinds) == {p["kind"] for p in parts} | {"history"}
    history = [m for m in data["messages"] if m["role"] != "system"]
    assert kinds["history"]["chars"] == sum(m["chars"] for m in history)
    main = client.get(f"/api/session/context?id={tree.main}").json()
    assert [p["kind"] for p in main["messages"][0]["parts"]] == ["system prompt", "synthesis"]


def test_context_shows_the_agents_topology_slot(tree: Tree) -> None:
    with TestClient(inspector_app(tree.storage, topology_slot=True)) as client:
        data = client.get(f"/api/session/context?id={tree.tiers}").json()
    parts = data["messages"][0]["parts"]
    assert [p["kind"] for p in parts][:3] == ["system prompt", "identity", "topology"]
    assert "    - Tiers  <- you are here" in parts[2]["text"]
    with StelloAgent(model=ScriptedChatModel(default="ok"), storage=tree.storage,
                     topology_slot=True) as agent:  # fmt: skip
        expected = agent.session(tree.tiers).turn_context().system
    assert expected is not None and data["messages"][0]["content"] == expected.content


def test_context_never_compresses_but_says_when_the_next_turn_would(tree: Tree) -> None:
    before = tree.storage.get_compression(tree.pricing)
    policy = CompressionPolicy(context_window=16, compress_fn=lambda *_: "never called")
    with TestClient(inspector_app(tree.storage, policy=policy)) as client:
        data = client.get(f"/api/session/context?id={tree.pricing}").json()
    assert data["compression_due"]["due"] is True
    assert tree.storage.get_compression(tree.pricing) == before
    with TestClient(inspector_app(tree.storage)) as client:
        assert (
            client.get(f"/api/session/context?id={tree.pricing}").json()["compression_due"] is None
        )


def test_an_archived_session_still_shows_its_prompt(tree: Tree, client: TestClient) -> None:
    tree.storage.put_compression(tree.growth, Compression(summary="s", through=0))
    data = client.get(f"/api/session/context?id={tree.growth}").json()
    assert data["archived"] is True
    assert data["messages"][0]["parts"][0]["kind"] == "identity"


def test_unknown_ids_and_routes_are_404_with_a_clear_body(client: TestClient) -> None:
    for path in ("/api/session", "/api/session/records", "/api/session/context"):
        response = client.get(path, params={"id": "nope"})
        assert response.status_code == 404, path
        assert response.json()["error"] == "Session 'nope' does not exist."
    response = client.get("/api/nothing-here")
    assert response.status_code == 404 and "/api/nothing-here" in response.json()["error"]


def test_bad_paging_is_a_400(tree: Tree, client: TestClient) -> None:
    bad = ["limit=0", "limit=5000", "offset=-1", "offset=x", "offset=+1", "offset=" + "9" * 40]
    # int() takes these; the API does not
    bad += ["offset=\uff11", "offset=1_0", "offset=%201", "offset=1%20", "limit=\u00b2"]
    path = f"/api/session/records?id={tree.pricing}"
    for query in bad:
        response = client.get(f"{path}&{query}")
        assert response.status_code == 400, query
        assert "must be an integer in" in response.json()["error"]
    assert len(client.get(f"{path}&offset=0&limit=3").json()["records"]) == 3


def test_a_bad_event_cursor_is_a_400_not_a_500(client: TestClient) -> None:
    for name in ("\u00b2", "x", "-1", "1.5"):
        response = client.get("/api/events", params={"after": name})
        assert response.status_code == 400, name
        assert "'after' must be an integer" in response.json()["error"]
    resumed = client.get("/api/events", headers={b"Last-Event-ID": "\u00b2".encode("latin-1")})
    assert resumed.status_code == 400
    assert "'Last-Event-ID' must be an integer" in resumed.json()["error"]


ODD_IDS = ["a/b", "..", ".", "/", "a/../b", "x?y=1#z", "%2F..", "trailing/"]
"""Session ids the library takes that a URL path mangles (split at `/`, `..` collapsed)."""


def test_every_id_the_library_takes_can_be_opened(tree: Tree, client: TestClient) -> None:
    for sid in ODD_IDS:
        tree.agent.fork(tree.pricing, f"Odd {sid}", id=sid)
        tree.agent.turn(sid, "Hello?")
    for sid in ODD_IDS:
        view = client.get("/api/session", params={"id": sid})
        assert view.status_code == 200, sid
        assert (view.json()["meta"]["id"], view.json()["meta"]["label"]) == (sid, f"Odd {sid}")
        page = client.get("/api/session/records", params={"id": sid, "limit": 5}).json()
        assert [r["content"] for r in page["records"]] == ["Hello?", "Noted."], sid
        context = client.get("/api/session/context", params={"id": sid}).json()
        assert context["messages"][-1]["content"] == "Noted.", sid
    missing = client.get("/api/session")
    assert missing.status_code == 400 and "query parameter 'id'" in missing.json()["error"]


def test_the_page_and_its_modules_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and 'type="module"' in page.text
    script = client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert client.get("/api/info").json()["write"] is False
