"""The star map: read back by parsing its SVG, never by comparing strings."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.errors import InvalidInputError
from stello_graph.models import SessionMeta, SessionStatus, TopologyNode
from stello_graph.starmap import ARCHIVED_OPACITY, layout, render_topology
from stello_graph.topology import Topology
from tests.cli.conftest import RunCli

NS = {"svg": "http://www.w3.org/2000/svg"}
T0 = datetime(2025, 1, 1, tzinfo=UTC)


class TreeBuilder:
    """Builds a `Topology` by hand: nodes, meta (with a clock) and turn counts."""

    def __init__(self) -> None:
        self.nodes: list[TopologyNode] = []
        self.metas: dict[str, SessionMeta] = {}
        self.turns: dict[str, int] = {}

    def add(
        self,
        sid: str,
        parent: str | None,
        label: str,
        *,
        turns: int = 0,
        minute: int = 0,
        status: SessionStatus = "active",
    ) -> TreeBuilder:
        role = "main" if parent is None else "standard"
        self.nodes.append(TopologyNode(id=sid, parent_id=parent, label=label))
        at = T0 + timedelta(minutes=minute)
        self.metas[sid] = SessionMeta(id=sid, label=label, role=role, status=status, updated_at=at)
        self.turns[sid] = turns
        return self

    def build(self) -> Topology:
        return Topology(tuple(self.nodes), dict(self.metas), dict(self.turns))


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def sessions(root: ET.Element) -> dict[str, ET.Element]:
    """Each session's `<g>`, by id."""
    groups = root.findall(".//svg:g[@data-id]", NS)
    return {g.attrib["data-id"]: g for g in groups}


def star(group: ET.Element) -> tuple[float, float, float]:
    circle = group.find("svg:circle", NS)
    assert circle is not None
    return float(circle.attrib["cx"]), float(circle.attrib["cy"]), float(circle.attrib["r"])


def label(group: ET.Element) -> str | None:
    text = group.find("svg:text", NS)
    return None if text is None else text.text


@pytest.fixture
def flat() -> Topology:
    tree = TreeBuilder().add("m", None, "Main Session", turns=2, minute=0)
    tree.add("a", "m", "Pricing", turns=9, minute=3)
    tree.add("b", "m", "Onboarding", turns=1, minute=1)
    tree.add("c", "m", "Growth", turns=4, minute=2, status="archived")
    return tree.build()


def test_main_at_centre_children_on_one_ring(flat: Topology) -> None:
    root = parse(render_topology(flat, size=400))
    assert root.attrib["viewBox"] == "0 0 400 400"
    groups = sessions(root)
    assert set(groups) == {"m", "a", "b", "c"}
    assert len(root.findall(".//svg:circle[@class='star']", NS)) == 4
    assert len(root.findall(".//svg:line[@class='edge']", NS)) == 3
    assert len(root.findall(".//svg:circle[@class='orbit']", NS)) == 1
    mx, my, _ = star(groups["m"])
    assert (mx, my) == (200, 200)
    distances = {round(math.hypot(star(groups[s])[0] - mx, star(groups[s])[1] - my)) for s in "abc"}
    assert len(distances) == 1 and distances.pop() > 100
    edges = root.findall(".//svg:line[@class='edge']", NS)
    assert {e.attrib["data-parent"] for e in edges} == {"m"}
    assert {e.attrib["data-child"] for e in edges} == {"a", "b", "c"}


def test_size_follows_turns_brightness_follows_recency(flat: Topology) -> None:
    groups = sessions(parse(render_topology(flat)))
    radius = {sid: star(groups[sid])[2] for sid in "abc"}
    assert radius["a"] > radius["c"] > radius["b"]  # 9 > 4 > 1 turns
    bright = {sid: float(groups[sid].attrib["data-brightness"]) for sid in "mabc"}
    assert bright["a"] == 1.0  # changed last
    assert bright["a"] > bright["c"] > bright["b"] > bright["m"]
    assert groups["a"].attrib["data-turns"] == "9"


def test_archived_sessions_are_dimmed(flat: Topology) -> None:
    root = parse(render_topology(flat))
    groups = sessions(root)
    assert float(groups["c"].attrib["opacity"]) == ARCHIVED_OPACITY
    assert all(float(groups[s].attrib["opacity"]) == 1 for s in "mab")
    assert "archived" in groups["c"].attrib["class"].split()
    (edge,) = root.findall(".//svg:line[@data-child='c']", NS)
    assert float(edge.attrib["opacity"]) < 1


def test_deeper_sessions_get_outer_rings_inside_their_parents_sector() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for branch in ("a", "b", "c", "d"):
        tree.add(branch, "m", branch.upper())
    tree.add("a1", "a", "A1").add("a2", "a", "A2").add("a11", "a1", "A11")
    groups = sessions(parse(render_topology(tree.build(), size=600)))

    def polar(sid: str) -> tuple[float, float]:
        x, y, _ = star(groups[sid])
        return math.hypot(x - 300, y - 300), math.atan2(y - 300, x - 300)

    ring = {sid: round(polar(sid)[0], 1) for sid in groups}
    assert ring["a"] == ring["b"] == ring["c"] == ring["d"]
    assert ring["a1"] == ring["a2"] > ring["a"]
    assert ring["a11"] > ring["a1"]
    assert [groups[s].attrib["data-depth"] for s in ("m", "a", "a1", "a11")] == list("0123")
    # A has 2 of the tree's 5 leaves: its sector spans 2/5 of the circle, around its angle.
    sector = 2 * math.pi * 2 / 5
    for child in ("a1", "a2", "a11"):
        gap = abs(math.remainder(polar(child)[1] - polar("a")[1], 2 * math.pi))
        assert gap < sector / 2


def test_labels_are_escaped_and_odd_unicode_survives() -> None:
    nasty = 'Tom & "Jerry" <script>alert(1)</script>'
    odd = "Zoë 🚀 \u202eevil\x00\x1b[31m\ud800"
    tree = TreeBuilder().add("m", None, "Main").add("x", "m", nasty).add("y", "m", odd)
    svg = render_topology(tree.build(), label_chars=200)
    assert "<script>" not in svg
    groups = sessions(parse(svg))
    assert label(groups["x"]) == nasty
    shown = label(groups["y"])
    assert shown is not None and shown.startswith("Zoë 🚀 \u202eevil")
    assert "\x00" not in shown and "\ud800" not in shown
    title = groups["x"].find("svg:title", NS)
    assert title is not None and nasty in (title.text or "")


def test_long_labels_are_cut_and_big_trees_thin_their_labels() -> None:
    tree = TreeBuilder().add("m", None, "Main").add("a", "m", "x" * 80)
    for n in range(30):
        tree.add(f"a{n}", "a", f"leaf {n}")
    groups = sessions(parse(render_topology(tree.build(), max_labels=10, label_chars=12)))
    assert label(groups["a"]) == "x" * 8 + "…" + "x" * 3  # cut in the middle, 12 characters
    assert label(groups["a5"]) is None  # the outer ring did not fit in 10 labels
    assert groups["a5"].find("svg:title", NS) is not None


def test_empty_and_single_node_trees() -> None:
    root = parse(render_topology(Topology(())))
    assert sessions(root) == {}
    single = sessions(parse(render_topology(TreeBuilder().add("m", None, "Main").build())))
    assert star(single["m"])[:2] == (320, 320)


@pytest.mark.parametrize(
    ("option", "value"),
    [("size", 10), ("size", "big"), ("max_labels", -1), ("label_chars", 1), ("max_stars", 0)],
)
def test_bad_options_are_refused(flat: Topology, option: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=option):
        render_topology(flat, **{option: value})  # type: ignore[arg-type]


def test_layout_places_a_large_tree_fast_enough_to_draw() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for n in range(2000):
        tree.add(f"s{n}", "m" if n < 40 else f"s{n % 40}", f"S{n}", turns=n % 7, minute=n)
    stars = layout(tree.build())
    assert len(stars) == 2001
    assert all(0 <= s.x <= 640 and 0 <= s.y <= 640 and s.radius > 0 for s in stars)
    parse(render_topology(tree.build()))


def test_topology_reads_turns_and_renders_itself() -> None:
    storage = InMemoryMainStorage()
    from langchain_core.messages import AIMessage, HumanMessage

    storage.put_session(SessionMeta(id="m", label="Main", role="main"))
    storage.put_node(TopologyNode(id="m"))
    storage.put_session(SessionMeta(id="a", label="A"))
    storage.put_node(TopologyNode(id="a", parent_id="m", label="A"))
    for _ in range(3):
        storage.append_records("a", [HumanMessage("q"), AIMessage("r")], user_turn=True)
    tree = Topology.read(storage)
    assert tree.turns == {"m": 0, "a": 3}
    assert tree.to_dict()["nodes"][1]["turns"] == 3
    assert tree._repr_svg_() == render_topology(tree)
    assert sessions(parse(tree.render_svg(size=300)))["a"].attrib["data-turns"] == "3"


def test_labels_stay_on_the_map() -> None:
    long = "A rather long branch name"
    tree = TreeBuilder().add("m", None, "Main").add("r", "m", long).add("l", "m", long)
    root = parse(render_topology(tree.build(), size=400, label_chars=40))
    for group in sessions(root).values():
        text = group.find("svg:text", NS)
        assert text is not None
        x, width = float(text.attrib["x"]), len(text.text or "") * 11 * 400 / 640 * 0.6
        start = {"start": x, "end": x - width, "middle": x - width / 2}[text.attrib["text-anchor"]]
        assert start >= 0 and start + width <= 400, (text.text, text.attrib)


def test_jupyter_shows_a_topology_as_its_star_map(flat: Topology) -> None:
    formatters = pytest.importorskip("IPython.core.formatters")
    shown, _ = formatters.DisplayFormatter().format(flat)
    assert set(sessions(parse(shown["image/svg+xml"]))) == {"m", "a", "b", "c"}
    assert shown["text/plain"] == "<Topology: 4 sessions, 1 archived, root 'Main Session'>"


# -- labels never overlap; cut labels stay distinct ----------------------------------------
def _label_boxes(root: ET.Element, size: float) -> list[tuple[str, tuple[float, ...]]]:
    """Each drawn label's box, its width estimated from its characters (0.6 em each)."""
    boxes: list[tuple[str, tuple[float, ...]]] = []
    for text in root.findall(".//svg:text[@class='label']", NS):
        font, x, y = (float(text.attrib[k]) for k in ("font-size", "x", "y"))
        width = len(text.text or "") * font * 0.6
        left = {"start": x, "end": x - width, "middle": x - width / 2}[text.attrib["text-anchor"]]
        boxes.append((text.text or "", (left, y - font * 0.85, left + width, y + font * 0.25)))
        assert left >= -0.5 and left + width <= size + 0.5, (text.text, text.attrib)
    return boxes


def _assert_no_overlap(boxes: list[tuple[str, tuple[float, ...]]]) -> None:
    for i, (a, p) in enumerate(boxes):
        for b, q in boxes[i + 1 :]:
            assert not (p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]), (a, b)


def brainstorm(sessions: int) -> Topology:
    """A main session, six themes, and sessions under them with long, similar labels."""
    tree = TreeBuilder().add("m", None, "Main Session", turns=12)
    themes = ["Pricing", "Onboarding", "Growth", "Customer interviews", "Hiring", "Infra"]
    for t, theme in enumerate(themes):
        tree.add(f"t{t}", "m", theme, turns=5 + t, minute=t)
    for n in range(sessions - 1 - len(themes)):
        parent = f"t{n % len(themes)}" if n < 60 else f"c{n % 60}"
        theme = themes[n % len(themes)]
        tree.add(f"c{n}", parent, f"{theme}: follow-up discussion round {n}", turns=n % 9, minute=n)
    return tree.build()


@pytest.mark.parametrize(("count", "size"), [(29, 640), (300, 640), (300, 1200)])
def test_no_two_labels_overlap(count: int, size: int) -> None:
    tree = brainstorm(count)
    root = parse(render_topology(tree, size=size, max_labels=400))
    boxes = _label_boxes(root, size)
    assert len(boxes) >= 7  # the sun and its ring at least
    _assert_no_overlap(boxes)
    groups = sessions(root)
    assert len(groups) == count
    for node in tree.nodes:  # every star keeps its full label in its hover title
        title = groups[node.id].find("svg:title", NS)
        assert title is not None and (title.text or "").startswith(node.label)


def test_siblings_with_a_common_prefix_get_distinct_cuts() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for n in (1, 2, 3):
        tree.add(f"i{n}", "m", f"Customer interviews with early adopters, round {n}")
    tree.add("x", "m", "Customer interviews with early adopters, round 1 (redo)")
    groups = sessions(parse(render_topology(tree.build(), label_chars=24)))
    shown = [label(groups[sid]) for sid in ("i1", "i2", "i3", "x")]
    assert all(text is not None and len(text) <= 24 and "…" in text for text in shown), shown
    assert len(set(shown)) == 4, shown


def test_a_label_without_room_is_left_to_its_title() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for n in range(40):
        tree.add(f"s{n}", "m", f"A long label for session number {n}")
    root = parse(render_topology(tree.build(), size=320, max_labels=100, label_chars=40))
    boxes = _label_boxes(root, 320)
    assert 1 < len(boxes) < 41  # some labels had no free spot
    _assert_no_overlap(boxes)


@pytest.mark.parametrize("size", ["10", "100", "-640", "big", "nan", "inf", "1e9"])
def test_the_size_option_is_validated(size: str, demo_db: Path, cli: RunCli) -> None:
    run = cli("tree", "--db", str(demo_db), "--svg", "-", "--size", size)
    assert run.code == 2
    assert (
        f"--size: must be a number of pixels above 100 and at most 20000, got {size!r}" in run.err
    )
    assert run.out == ""


def test_a_valid_size_draws_at_that_size(demo_db: Path, cli: RunCli) -> None:
    run = cli("tree", "--db", str(demo_db), "--svg", "-", "--size", "320.5")
    assert run.code == 0 and parse(run.out).attrib["width"] == "320.5"


def test_a_tree_too_big_to_draw_is_aggregated_on_the_stars_drawn() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for n in range(10):
        tree.add(f"b{n}", "m", f"B{n}")
    for n in range(300):  # 30 under each branch, every tenth with 2 children of its own
        tree.add(f"s{n}", f"b{n % 10}", f"S{n}")
        if n % 10 == 0:
            tree.add(f"s{n}x", f"s{n}", "X").add(f"s{n}y", f"s{n}", "Y")
    topology = tree.build()
    root = parse(render_topology(topology, max_stars=50))
    drawn = sessions(root)
    assert len(drawn) == 50 and {"m", *(f"b{n}" for n in range(10))} <= set(drawn)
    hidden = {
        sid: int(g.attrib["data-hidden"]) for sid, g in drawn.items() if "data-hidden" in g.attrib
    }
    assert sum(hidden.values()) == len(topology.nodes) - 50  # every session counted once
    assert all(sid not in hidden or sid.startswith(("b", "s")) for sid in drawn)
    assert len(root.findall(".//svg:circle[@class='cluster']", NS)) == len(hidden)
    title = drawn[next(iter(hidden))].find("svg:title", NS)
    assert title is not None and title.text is not None and "more session" in title.text
    legend = root.find("svg:title", NS)
    assert legend is not None and legend.text is not None
    assert f"{len(topology.nodes):,} sessions (50 drawn" in legend.text
    # a tree within the limit is drawn whole, with no halo
    whole = parse(render_topology(topology))
    assert len(sessions(whole)) == len(topology.nodes)
    assert whole.findall(".//svg:circle[@class='cluster']", NS) == []


def test_the_default_limit_keeps_a_big_map_small() -> None:
    tree = TreeBuilder().add("m", None, "Main")
    for n in range(12_000):
        tree.add(f"s{n}", "m" if n < 12 else f"s{n // 12 - 1}", f"Session {n}", turns=n % 5)
    svg = render_topology(tree.build())
    assert len(sessions(parse(svg))) == 2_500
    assert len(svg.encode()) < 2_000_000
