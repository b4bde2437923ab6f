"""What the inspector refuses to a web page the user visits: a write not sent by its own page
(no JSON content type, another Origin, no token), and any request under another `Host` (a
DNS-rebinding page); off loopback with writes on, a read without the token."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from stello_graph.export import export_tree
from stello_graph.inspector import create_app
from stello_graph.inspector.app import is_loopback
from tests.inspector.conftest import Tree, page_headers

# what a cross-site page can send without asking first: a form or a `no-cors` fetch
SIMPLE_BODIES: list[dict[str, Any]] = [
    {"content": b'{"label": "Cross-site"}', "headers": {"Content-Type": "text/plain"}},
    {"content": b"", "headers": {"Content-Type": "text/plain;charset=UTF-8"}},
    {
        "content": b'{"label=": "x"}',
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
    },
    {"content": b"", "headers": {"Content-Type": "multipart/form-data; boundary=x"}},
    {"content": b""},  # no content type at all
]
WRITES = [
    ("POST", "fork", {"label": "Cross-site", "system_prompt": "x"}),
    ("POST", "consolidate", {}),
    ("POST", "archive", {}),
    ("PUT", "insight", {"insight": "planted"}),
    ("POST", "insight", {"insight": "planted"}),
    ("PUT", "system_prompt", {"system_prompt": "replaced"}),
    ("POST", "system_prompt", {"system_prompt": "replaced"}),
]


def _write_app(tree: Tree, **options: Any) -> Any:
    return create_app(tree.storage, write=True, agent=lambda: tree.agent, **options)


def _attempts(tree: Tree) -> list[tuple[str, str, dict[str, Any]]]:
    """Every write, as (method, path, what `client.request` takes besides them)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for method, action, body in WRITES:
        out.append((method, f"/api/session/{action}?id={tree.pricing}", {"json": body}))
    out.append(("POST", "/api/integrate", {"json": {"mode": "flat"}}))
    return out


def test_a_write_with_a_body_a_form_can_send_is_refused(tree: Tree) -> None:
    app = _write_app(tree, host="testserver")
    own = page_headers(app)
    before = export_tree(tree.storage, records=True)
    with TestClient(app) as client:
        for method, path, _ in _attempts(tree):
            for body in SIMPLE_BODIES:
                headers = {**own, **body.get("headers", {})}
                if "Content-Type" not in body.get("headers", {}):
                    del headers["Content-Type"]
                response = client.request(method, path, content=body["content"], headers=headers)
                assert response.status_code == 403, (path, body, response.text)
                assert "Content-Type: application/json" in response.json()["error"]
    assert export_tree(tree.storage, records=True) == before


@pytest.mark.parametrize(
    "origin",
    [None, "http://evil.example", "null", "http://testserver:8080", "https://testserver"],
)
def test_a_write_from_another_origin_is_refused(tree: Tree, origin: str | None) -> None:
    app = _write_app(tree, host="testserver")
    headers = page_headers(app)
    del headers["Origin"]
    if origin is not None:
        headers["Origin"] = origin
    before = export_tree(tree.storage, records=True)
    with TestClient(app, headers=headers) as client:
        for method, path, options in _attempts(tree):
            response = client.request(method, path, **options)
            assert response.status_code == 403, (path, response.text)
            assert "Origin 'http://testserver'" in response.json()["error"]
    assert export_tree(tree.storage, records=True) == before


@pytest.mark.parametrize(
    "token", [None, "", "guess", "wrong-token-of-the-same-length-as-a-real-one"]
)
def test_a_write_without_the_apps_token_is_refused(tree: Tree, token: str | None) -> None:
    app = _write_app(tree, host="testserver")
    headers = page_headers(app)
    del headers["X-Stello-Token"]
    if token is not None:
        headers["X-Stello-Token"] = token
    before = export_tree(tree.storage, records=True)
    with TestClient(app, headers=headers) as client:
        for method, path, options in _attempts(tree):
            response = client.request(method, path, **options)
            assert response.status_code == 403, (path, response.text)
            assert "token in X-Stello-Token" in response.json()["error"]
            assert app.state.inspector.token not in response.text
    assert export_tree(tree.storage, records=True) == before


def test_each_app_has_its_own_token(tree: Tree) -> None:
    first, second = _write_app(tree), _write_app(tree)
    tokens = {first.state.inspector.token, second.state.inspector.token}
    assert len(tokens) == 2 and all(len(token) >= 32 for token in tokens)


def test_the_pages_write_still_goes_through(tree: Tree) -> None:
    app = _write_app(tree, host="127.0.0.1", port=8321)
    headers = {**page_headers(app), "Origin": "http://localhost:8321"}
    with TestClient(app, base_url="http://localhost:8321", headers=headers) as client:
        response = client.put(f"/api/session/insight?id={tree.pricing}", json={"insight": "ok"})
    assert response.status_code == 200 and tree.storage.get_insight(tree.pricing) == "ok"


SERVED = [
    "http://127.0.0.1:8321",
    "http://localhost:8321",
    "http://LocalHost:8321",
    "http://[::1]:8321",
]
NOT_SERVED = [
    "http://evil.example",
    "http://evil.example:8321",
    "http://127.0.0.1.evil.example:8321",
    "http://127.0.0.1:8322",  # another port
    "http://127.0.0.1",  # port 80
    "http://192.168.1.20:8321",  # an address of this machine it was not asked to serve
]


@pytest.mark.parametrize("base_url", NOT_SERVED)
def test_a_request_under_another_host_is_refused_reads_included(tree: Tree, base_url: str) -> None:
    app = _write_app(tree, host="127.0.0.1", port=8321)
    with TestClient(app, base_url=base_url) as client:
        for path in ("/", "/static/app.js", "/api/info", "/api/tree",
                     f"/api/session?id={tree.pricing}", f"/api/session/context?id={tree.pricing}",
                     "/api/events"):  # fmt: skip
            response = client.get(path)
            assert response.status_code == 421, (base_url, path)
            assert "not Host" in response.json()["error"]
            assert "Pricing" not in response.text


@pytest.mark.parametrize("base_url", SERVED)
def test_the_served_address_and_the_loopback_names_are_served(tree: Tree, base_url: str) -> None:
    with TestClient(_write_app(tree, host="127.0.0.1", port=8321), base_url=base_url) as client:
        assert client.get("/").status_code == 200
        assert client.get("/api/tree").json()["count"] == 4


def test_malformed_hosts_are_refused(tree: Tree) -> None:
    with TestClient(_write_app(tree, host="127.0.0.1", port=8321)) as client:
        for host in ("", "127.0.0.1:", "127.0.0.1:x", "[::1", "127.0.0.1:8321:1", ":8321"):
            assert client.get("/api/tree", headers={"Host": host}).status_code == 421, host


def test_the_host_given_is_served_and_any_port_when_none_is_given(tree: Tree) -> None:
    app = create_app(tree.storage, host="devbox.lan", port=9000)
    with TestClient(app, base_url="http://devbox.lan:9000") as client:
        assert client.get("/api/tree").status_code == 200
    anyport = create_app(tree.storage, host="::1")
    for base_url in ("http://[::1]:1234", "http://[::1]", "http://localhost:5"):
        with TestClient(anyport, base_url=base_url) as client:
            assert client.get("/api/tree").status_code == 200, base_url
    with TestClient(anyport, base_url="http://evil.example:1234") as client:
        assert client.get("/api/tree").status_code == 421


def test_off_loopback_with_writes_reads_need_the_token(tree: Tree) -> None:
    app = _write_app(tree, host="192.0.2.7", port=8321)
    token = app.state.inspector.token
    with TestClient(app, base_url="http://192.0.2.7:8321") as client:
        assert client.get("/").status_code == 200  # the page holds no data; its API does
        for path in ("/api/info", "/api/tree", f"/api/session?id={tree.pricing}", "/api/events"):
            bare = client.get(path)
            assert bare.status_code == 403 and "token" in bare.json()["error"], path
            wrong = client.get(path, headers={"X-Stello-Token": "guess"})
            assert wrong.status_code == 403, path
        assert client.get("/api/tree", headers={"X-Stello-Token": token}).json()["count"] == 4
        assert client.get(f"/api/tree?token={token}").json()["count"] == 4  # as EventSource does
        # a write still needs the header, the Origin and JSON
        query = client.post(f"/api/integrate?token={token}", json={})
        assert query.status_code == 403


def test_reads_need_no_token_on_loopback_or_when_read_only(tree: Tree) -> None:
    for app, base_url in [
        (_write_app(tree, host="localhost", port=8321), "http://localhost:8321"),
        (create_app(tree.storage, host="192.0.2.7", port=8321), "http://192.0.2.7:8321"),
    ]:
        with TestClient(app, base_url=base_url) as client:
            assert client.get("/api/tree").status_code == 200, base_url


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("LOCALHOST", True),
     ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
     ("192.168.1.20", False), ("devbox.lan", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("host", "port"), [("", None), ("  ", 80), ("x", 0), ("x", 70000)])
def test_a_bad_host_or_port_is_refused(tree: Tree, host: str, port: int | None) -> None:
    from stello_graph.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"host|port"):
        create_app(tree.storage, host=host, port=port)
