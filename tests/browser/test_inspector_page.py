"""The inspector page in a real headless Chromium, on the demo's database: the map, a
session's transcript and context, live events, search, collapse, every write of its dialogs
and buttons. Screenshots go to build/inspector/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stello_graph.agent import StelloAgent
from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli import _offline
from tests.browser.conftest import VIEWPORT, Server, Shot, serve

pytestmark = pytest.mark.browser

TIMEOUT = 15_000


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT)


def _select(page: Any, label: str, tab: str = "session") -> None:
    page.click(f".vrow:has-text('{label}')")
    page.wait_for_selector("body[data-view^='session:']", timeout=TIMEOUT)
    if tab != "session":
        page.click(f"button[data-tab={tab}]")
        page.wait_for_selector(f"body[data-view^='{tab}:']", timeout=TIMEOUT)


def test_the_map_and_the_list_show_the_tree(page: Any, server: Server, shot: Shot) -> None:
    _open(page, server.url)
    rows = page.locator(".vrow .lbl").all_inner_texts()
    assert rows == ["Main Session", "Pricing", "Onboarding", "Growth"]
    assert int(page.get_attribute("#map", "data-labels") or 0) == 4  # few stars: all named
    assert "4 sessions" in page.inner_text("#counts")
    assert page.inner_text("#mode") == "read-only"
    shot(page, "tree")


def test_a_damaged_session_is_shown_marked_beside_the_others(
    browser: Any, demo_file: Path, tmp_path: Path
) -> None:
    """One byte that is not UTF-8 in a stored label: the page still shows the whole tree,
    the damaged session with its stand-in label and marked; opening it names the column
    (its reads answer 500, which the browser logs: a page of its own, not `page`)."""
    import sqlite3

    db = tmp_path / "damaged.db"
    shutil.copy(demo_file, db)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE stello_sessions SET label = CAST(X'FF' AS TEXT) WHERE label = 'Pricing'"
        )
    conn.close()
    page = browser.new_page(viewport=VIEWPORT)
    with SqliteMainStorage(db) as storage, serve(storage, db) as server:
        _open(page, server.url)
        rows = page.locator(".vrow .lbl").all_inner_texts()
        assert rows == ["Main Session", "(undecodable)", "Onboarding", "Growth"]
        marked = page.locator(".vrow:has(.damaged)")
        assert marked.count() == 1 and "(undecodable)" in marked.inner_text()
        assert "label" in (marked.locator(".damaged").get_attribute("title") or "")
        marked.click()
        panel = page.locator("#tab-session")
        # the panel says "Select a session" until the session's read answers: wait for that
        panel.locator(".empty", has_text="column").wait_for(timeout=TIMEOUT)
        assert "column 'label'" in panel.inner_text()
    page.close()


def test_a_session_shows_its_transcript_and_memory(page: Any, server: Server, shot: Shot) -> None:
    _open(page, server.url)
    _select(page, "Pricing")
    panel = page.locator("#tab-session")
    assert panel.locator("h2").inner_text() == "Pricing"
    turns = panel.locator(".turn")
    assert turns.count() == 2
    assert "Should the product have a free tier?" in turns.nth(0).inner_text()
    assert "covers records 1–2 of 4" in panel.locator(".box.l2").inner_text()
    assert "L2 stale by 1 turn" in panel.locator(".stats").inner_text()
    shot(page, "session")


def test_the_main_session_shows_tool_calls_as_cards(page: Any, server: Server) -> None:
    _open(page, server.url)
    _select(page, "Main Session")
    cards = page.locator("#tab-session .card[data-tool=create_session]")
    assert cards.count() == 3
    assert '"label": "Pricing"' in cards.nth(0).inner_text()
    assert page.locator("#tab-session .box.synth").first.inner_text().startswith("Launch plan:")


def test_the_context_view_labels_and_sizes_each_part(page: Any, server: Server, shot: Shot) -> None:
    _open(page, server.url)
    _select(page, "Main Session", tab="context")
    view = page.locator("#tab-context")
    kinds = view.locator(".part .k").all_inner_texts()
    assert kinds == ["system prompt", "synthesis"]
    assert (
        "You are the main session of a brainstorm." in view.locator(".part pre").first.inner_text()
    )
    assert view.locator(".bar span").count() == 3  # system prompt, synthesis, history
    assert "history" in view.locator(".keys").inner_text()
    assert view.locator(".ctx-msg").count() >= 2
    shot(page, "context")


def test_changes_by_another_process_appear_live(page: Any, server: Server, shot: Shot) -> None:
    _open(page, server.url)
    page.click("button[data-tab=events]")
    with StelloAgent(
        model=_offline.echo_model(), storage=server.db, consolidate_fn=_offline.summarise
    ) as other:
        pricing = next(n for n in other.children(other.main_session_id) if n.label == "Pricing")
        other.turn(pricing.id, "What about a student discount?")
        other.consolidate(pricing.id)
        other.fork(pricing.id, "Student discount")
    page.wait_for_selector(".ev[data-type=session_added]", timeout=TIMEOUT)
    page.wait_for_selector(".vrow:has-text('Student discount')", timeout=TIMEOUT)
    types = page.locator(".ev .ty").all_inner_texts()
    assert {"session_added", "turns_changed", "l2_changed"} <= set(types)
    page.select_option("select[aria-label='event type']", "l2_changed")
    assert set(page.locator(".ev .ty").all_inner_texts()) == {"l2_changed"}
    page.select_option("select[aria-label='event type']", "")
    shot(page, "events")


def test_search_and_collapse(page: Any, server: Server) -> None:
    _open(page, server.url)
    page.fill("#search", "grow")
    assert page.locator(".vrow .lbl").all_inner_texts() == ["Growth"]
    page.press("#search", "Enter")
    page.wait_for_selector("body[data-view='session:" + _id(page, "Growth") + "']", timeout=TIMEOUT)
    page.fill("#search", "")
    page.click(".vrow:has-text('Main Session') .twist")
    assert page.locator(".vrow .lbl").all_inner_texts() == ["Main Session"]
    page.click(".vrow:has-text('Main Session') .twist")
    assert page.locator(".vrow").count() == 4


def _id(page: Any, label: str) -> str:
    found: str = page.get_attribute(f".vrow:has-text('{label}')", "data-id")
    return found


def _show(page: Any, label: str) -> None:
    """Open the session labelled `label` from the list and wait for its view."""
    page.click(f".vrow[title='{label}']")
    page.wait_for_selector(f"#tab-session h2:text-is('{label}')", timeout=TIMEOUT)


def _dialog(page: Any, button: str, values: dict[str, str]) -> None:
    """Click a session's `button`, fill its dialog's fields as a user would, press OK."""
    page.click(f"#tab-session .actions button:has-text('{button}')")
    dialog = page.locator("dialog[open]")
    for name, value in values.items():
        field = dialog.locator(f"[name='{name}']")
        if field.evaluate("f => f.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    dialog.locator("button[value=ok]").click()
    dialog.wait_for(state="detached", timeout=TIMEOUT)


def test_every_dialog_and_button_of_the_page_writes(write_server: Server, page: Any) -> None:
    # the server is set up first, so it outlives the page: the page's last reloads (after the
    # writes' events) find it
    storage = write_server.storage
    _open(page, write_server.page_url)
    assert "token=" not in page.url  # kept for the tab, out of the address bar
    assert page.evaluate("sessionStorage.getItem('stello-token')")
    assert page.inner_text("#mode") == "read-write"
    pricing, main = _id(page, "Pricing"), _id(page, "Main Session")
    _show(page, "Pricing")

    _dialog(page, "Fork", {"label": "Student discount", "context": "inherit",
                           "system_prompt": "Be brief."})  # fmt: skip
    page.wait_for_selector("#tab-session h2:text-is('Student discount')", timeout=TIMEOUT)
    copy = next(n for n in storage.get_children(pricing) if n.label == "Student discount")
    assert storage.count_records(copy.id) == storage.count_records(pricing) == 4
    assert storage.get_system_prompt(copy.id) == "Be brief."

    _show(page, "Pricing")
    _dialog(page, "Fork", {"label": "From turn 1", "at_turn": "1"})
    page.wait_for_selector("#tab-session h2:text-is('From turn 1')", timeout=TIMEOUT)
    turn_one = next(n for n in storage.get_children(pricing) if n.label == "From turn 1")
    assert [r.type for r in storage.list_records(turn_one.id)] == ["human", "ai"]
    lineage = storage.get_lineage(turn_one.id)
    assert lineage is not None and (lineage.source_id, lineage.at_turn) == (pricing, 1)

    _show(page, "Pricing")
    _dialog(page, "Edit insight", {"insight": "Students pay half."})
    page.wait_for_selector(".box.insight:has-text('Students pay half.')", timeout=TIMEOUT)
    assert storage.get_insight(pricing) == "Students pay half."

    _dialog(page, "Edit system prompt", {"system_prompt": "Think about prices, briefly."})
    page.wait_for_selector(".box.prompt:has-text('prices, briefly')", timeout=TIMEOUT)
    assert storage.get_system_prompt(pricing) == "Think about prices, briefly."

    page.click("#tab-session .actions button:has-text('Consolidate')")
    page.wait_for_selector(".toast:has-text('consolidate: done')", timeout=TIMEOUT)
    assert storage.get_memory_through(pricing) == 4

    storage.put_memory(main, "(no synthesis yet)")
    page.click("#global-actions button:has-text('Integrate (flat)')")
    page.wait_for_selector(".toast:has-text('integrate (flat): done')", timeout=TIMEOUT)
    flat = storage.get_memory(main)
    assert flat is not None and flat.startswith("Pricing: ")
    assert storage.get_insight(pricing) == "Related branches: Onboarding, Growth"

    storage.put_memory(main, "(no synthesis yet)")
    page.click("#global-actions button:has-text('Integrate (tree)')")
    page.wait_for_selector(".toast:has-text('integrate (tree): done')", timeout=TIMEOUT)
    assert storage.get_memory(main) == flat

    page.once("dialog", lambda dialog: dialog.accept())  # "Archive “Pricing”?"
    page.click("#tab-session .actions button:has-text('Archive')")
    page.wait_for_selector(".toast:has-text('archive: done')", timeout=TIMEOUT)
    meta = storage.get_session(pricing)
    assert meta is not None and meta.status == "archived"


ODD_IDS = ("a/b", "..")
"""Ids the library takes that a URL path would split or collapse."""


@pytest.fixture
def odd_server(demo_file: Path, tmp_path: Path) -> Iterator[Server]:
    """A `write=True` inspector over the demo's tree with sessions of the `ODD_IDS`."""
    db = tmp_path / "odd.db"
    shutil.copy(demo_file, db)
    with StelloAgent(model=_offline.echo_model(), storage=db) as agent:
        for sid in ODD_IDS:
            agent.fork(agent.main_session_id, f"Odd {sid}", id=sid)
            agent.turn(sid, "Anyone there?")
    with SqliteMainStorage(db) as storage, serve(storage, db, write=True) as running:
        yield running


def test_sessions_whose_ids_a_path_would_mangle_open_and_take_writes(
    odd_server: Server, page: Any
) -> None:
    _open(page, odd_server.page_url)
    for sid in ODD_IDS:
        _show(page, f"Odd {sid}")
        assert page.get_attribute("#tab-session", "data-session") == sid
        assert "Anyone there?" in page.inner_text("#tab-session .transcript")
        _dialog(page, "Edit insight", {"insight": f"For {sid}."})
        page.wait_for_selector(f".box.insight:has-text('For {sid}.')", timeout=TIMEOUT)
        assert odd_server.storage.get_insight(sid) == f"For {sid}."
        page.click("button[data-tab=context]")
        page.wait_for_selector(f"body[data-view='context:{sid}']", timeout=TIMEOUT)
        assert "Anyone there?" in page.inner_text("#tab-context")
        page.click("button[data-tab=session]")


_BOXES = "window.stelloInspector.map.labelBoxes"
_OVERLAPS = f"""() => {{
  const b = {_BOXES};
  let n = 0;
  for (let i = 0; i < b.length; i++) for (let j = i + 1; j < b.length; j++)
    if (b[i][0] < b[j][2] && b[j][0] < b[i][2] && b[i][1] < b[j][3] && b[j][1] < b[i][3]) n++;
  return n;
}}"""


def test_a_large_tree_labels_never_overlap_at_any_zoom(
    page: Any, large_server: Server, shot: Shot
) -> None:
    _open(page, large_server.url)
    assert "2000 sessions" in page.inner_text("#counts")
    assert page.locator(".vrow").count() < 100  # the list is virtualised
    box = page.locator("#map").bounding_box()
    centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    counts = []
    for _ in range(4):
        page.mouse.move(*centre)
        page.mouse.wheel(0, -500)  # zoom in around the centre
        page.wait_for_timeout(150)
        counts.append(page.evaluate(f"{_BOXES}.length"))
        assert page.evaluate(_OVERLAPS) == 0
    assert counts[-1] > counts[0]  # zooming in names more stars
    page.fill("#search", "#1999")
    page.press("#search", "Enter")
    page.wait_for_selector("body[data-view^='session:s1999']", timeout=TIMEOUT)
    assert page.evaluate(_OVERLAPS) == 0
    shot(page, "large")
