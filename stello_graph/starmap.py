"""The star map: a topology drawn as standalone SVG, with no JavaScript.

The main session is the sun at the centre; the other sessions orbit it on one ring per depth,
each subtree in its own angular sector (as wide as its share of the tree's leaves), with an
edge from every parent to its children. A session's star grows with its number of turns (its
area is proportional to them), shines brighter the more recently it changed (its rank among
the tree's sessions, from dim to bright), and is greyed out and dashed once archived. Hovering a
star shows its label, id, turns and status (an SVG `<title>`), so a large tree stays readable
when its labels are thinned out.

Example:
    >>> from stello_graph.models import TopologyNode
    >>> from stello_graph.topology import Topology
    >>> tree = Topology((TopologyNode(id="m"), TopologyNode(id="a", parent_id="m", label="Ideas")))
    >>> svg = render_topology(tree, size=320)
    >>> svg.startswith("<svg") and "Ideas" in svg
    True
"""

from __future__ import annotations

import colorsys
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from xml.sax.saxutils import escape

from stello_graph._starmap_layout import (
    DEFAULT_MAX_STARS,
    MAX_SIZE,
    Star,
    TreeData,
    _Shown,
    _shown,
    layout,
)
from stello_graph.errors import InvalidInputError

__all__ = [
    "ARCHIVED_OPACITY",
    "DEFAULT_MAX_STARS",
    "MAX_SIZE",
    "Star",
    "TreeData",
    "layout",
    "place_labels",
    "render_topology",
]


ARCHIVED_OPACITY = 0.35
"""Opacity of an archived session's star, label and edge."""

_SKY = "#0b1021"
_ORBIT = "#27304d"
_EDGE = "#5b6b99"
_LABEL = "#d8deef"
_ARCHIVED = "#8a8f98"
_MAIN_HUE, _STAR_HUE = 0.12, 0.58  # gold sun, blue stars
# XML 1.0 forbids these code points even escaped (control characters, lone surrogates, ...).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# -- SVG ------------------------------------------------------------------------------------
def _text(value: str) -> str:
    """`value` made safe for XML text and attribute values."""
    return escape(_NOT_XML.sub("\ufffd", value), {'"': "&quot;"})


def _short(label: str, limit: int, tail: int | None = None) -> str:
    """`label` on one line, at most `limit` characters: cut in the middle, keeping its end
    (`tail` characters, a third by default), where siblings' labels often differ
    ("Interviews: round 1" / "Interviews: round 2")."""
    flat = " ".join(label.split())
    if len(flat) <= limit:
        return flat
    keep = (limit - 1) // 3 if tail is None else max(0, min(tail, limit - 2))
    head = flat[: limit - 1 - keep].rstrip()
    return head + "…" + (flat[len(flat) - keep :].lstrip() if keep else "")


def _distinct_labels(stars: list[Star], limit: int) -> dict[str, str]:
    """Each star's shortened label; siblings whose cuts would read the same keep more of
    their ends, until they differ (or their whole tails are shown)."""
    out = {star.node.id: _short(star.node.label, limit) for star in stars}
    siblings: dict[str | None, list[Star]] = {}
    for star in stars:
        siblings.setdefault(star.node.parent_id, []).append(star)
    for group in siblings.values():
        for tail in range((limit - 1) // 3 + 1, limit - 1):
            seen = Counter(out[star.node.id] for star in group)
            clashes = [
                s for s in group if seen[out[s.node.id]] > 1 and out[s.node.id] != s.node.label
            ]
            if not clashes:
                break
            for star in clashes:
                out[star.node.id] = _short(star.node.label, limit, tail)
    return out


def _colour(star: Star) -> str:
    if star.archived:
        return _ARCHIVED
    hue = _MAIN_HUE if star.depth == 0 else _STAR_HUE
    red, green, blue = colorsys.hls_to_rgb(hue, 0.12 + 0.6 * star.brightness, 0.85)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


@dataclass(frozen=True, slots=True)
class _Label:
    text: str
    x: float
    y: float
    anchor: str
    font: float

    def box(self) -> tuple[float, float, float, float]:
        """Its extent, estimated from the characters (no font metrics without a browser)."""
        width = len(self.text) * self.font * _CHAR_WIDTH
        left = {"start": self.x, "end": self.x - width, "middle": self.x - width / 2}[self.anchor]
        return left, self.y - self.font * 0.85, left + width, self.y + self.font * 0.25


_CHAR_WIDTH = 0.6
"""Estimated width of a character, in ems (sans-serif, mixed case)."""


def _star_svg(star: Star, label: _Label | None, scale: float, hidden: int = 0) -> str:
    node, kind = star.node, "main" if star.depth == 0 else "standard"
    status = "archived" if star.archived else "active"
    hover = f"{node.label or '(no label)'} — {node.id}\n{star.turns} turns, {status}"
    more = f"\n{hidden:,} more session{'s' if hidden != 1 else ''} below, not drawn"
    opacity = ARCHIVED_OPACITY if star.archived else 1
    dash = f' stroke-dasharray="{2 * scale:.1f}"' if star.archived else ""
    parts = [
        f'<g class="session {kind} {status}" data-id="{_text(node.id)}" data-depth="{star.depth}"'
        f' data-turns="{star.turns}" data-brightness="{star.brightness:.3f}"'
        + (f' data-hidden="{hidden}"' if hidden else "")
        + f' opacity="{opacity}"><title>{_text(hover + (more if hidden else ""))}</title>',
        f'<circle class="star" cx="{star.x:.1f}" cy="{star.y:.1f}" r="{star.radius:.1f}"'
        f' fill="{_colour(star)}" stroke="{_LABEL}" stroke-opacity="0.5"'
        f' stroke-width="{scale:.1f}"{dash}/>',
    ]
    if hidden:  # a halo, wider with the number of sessions it stands for
        halo = star.radius + scale * (2 + math.log10(1 + hidden))
        parts.append(
            f'<circle class="cluster" cx="{star.x:.1f}" cy="{star.y:.1f}" r="{halo:.1f}"'
            f' fill="none" stroke="{_LABEL}" stroke-opacity="0.35"'
            f' stroke-width="{scale:.1f}" stroke-dasharray="1 {2 * scale:.1f}"/>'
        )
    if label is not None:
        parts.append(
            f'<text class="label" x="{label.x:.1f}" y="{label.y:.1f}"'
            f' font-size="{label.font:.1f}" text-anchor="{label.anchor}"'
            f' fill="{_LABEL}">{_text(label.text)}</text>'
        )
    return "".join(parts) + "</g>"


def _label_spots(
    star: Star, font: float, centre: float, outward: bool, chars: int
) -> Iterator[tuple[float, float, str]]:
    """Where a label may go, best first. Its usual place: a leaf's runs outward, away from
    every edge; a parent's sits under (or over) its star, clear of the edges to its children
    further out. Then under, over, right of and left of its star. Only places that keep it
    on the map (its width is estimated: there is no font metrics without a browser)."""
    dx, dy = star.x - centre, star.y - centre
    distance = math.hypot(dx, dy)
    cos, sin = (dx / distance, dy / distance) if distance else (0.0, 1.0)
    gap, width = star.radius + font * 0.3, chars * font * _CHAR_WIDTH
    size = 2 * centre
    x = star.x + math.copysign(gap, cos)
    if outward and abs(cos) > 0.35 and ((x + width <= size) if cos > 0 else (x - width >= 0)):
        yield x, star.y + font * 0.35, "start" if cos > 0 else "end"
    else:
        half = min(width / 2, centre)
        x = min(max(star.x, half), size - half)
        yield x, star.y + (gap + font * 0.8 if sin >= 0 else -gap), "middle"
    for y in (star.y + gap + font * 0.8, star.y - gap):
        if font <= y <= size and width / 2 <= star.x <= size - width / 2:
            yield star.x, y, "middle"
    if star.x + gap + width <= size:
        yield star.x + gap, star.y + font * 0.35, "start"
    if star.x - gap - width >= 0:
        yield star.x - gap, star.y + font * 0.35, "end"


def _overlaps(box: tuple[float, ...], others: list[tuple[float, ...]]) -> bool:
    return any(box[0] < o[2] and o[0] < box[2] and box[1] < o[3] and o[1] < box[3] for o in others)


def place_labels(
    stars: list[Star], size: float, max_labels: int, label_chars: int
) -> dict[str, _Label]:
    """The labels drawn, by session id: whole rings from the centre out while they fit in
    `max_labels`; inside those, nearer and busier stars first, each label at the first of
    its spots that overlaps no label placed before it (else the star keeps only its hover
    title). No two labels overlap."""
    parents = {star.node.parent_id for star in stars}
    deepest = _labelled_depth(stars, max_labels)
    texts = _distinct_labels(stars, label_chars)
    scale, centre = size / 640, size / 2
    order = sorted(
        (star for star in stars if star.depth <= deepest),
        key=lambda star: (star.depth, -star.turns),
    )
    placed: dict[str, _Label] = {}
    cell = 48 * scale
    grid: dict[tuple[int, int], list[tuple[float, ...]]] = {}
    for star in order:
        text = texts[star.node.id]
        if not text:
            continue
        font = (13 if star.depth == 0 else 11) * scale
        leaf = star.node.id not in parents
        for x, y, anchor in _label_spots(star, font, centre, leaf, len(text)):
            label = _Label(text, x, y, anchor, font)
            left, top, right, bottom = label.box()
            pad = 1.5 * scale  # a gap between labels (and room for the SVG's rounding)
            box = (left - pad, top - pad, right + pad, bottom + pad)
            cells = [
                (i, j)
                for i in range(int(box[0] // cell), int(box[2] // cell) + 1)
                for j in range(int(box[1] // cell), int(box[3] // cell) + 1)
            ]
            near = [b for c in cells for b in grid.get(c, ())]
            if not _overlaps(box, near):
                placed[star.node.id] = label
                for c in cells:
                    grid.setdefault(c, []).append(box)
                break
    return placed


def _edges_svg(stars: list[Star], scale: float) -> Iterator[str]:
    by_id = {star.node.id: star for star in stars}
    # Thousands of edges at full strength would paint the sky solid.
    strength = f' stroke-opacity="{max(0.15, min(0.8, 8 / math.sqrt(max(1, len(stars))))):.2f}"'
    for star in stars[1:]:
        parent = by_id.get(star.node.parent_id or "", stars[0])
        dim = f' opacity="{ARCHIVED_OPACITY}"' if star.archived else ""
        yield (
            f'<line class="edge" data-parent="{_text(parent.node.id)}"'
            f' data-child="{_text(star.node.id)}" x1="{parent.x:.1f}" y1="{parent.y:.1f}"'
            f' x2="{star.x:.1f}" y2="{star.y:.1f}" stroke="{_EDGE}"{strength}'
            f' stroke-width="{scale:.1f}"{dim}/>'
        )


def _orbits_svg(stars: list[Star], size: float) -> Iterator[str]:
    centre = size / 2
    rings = {s.depth: math.hypot(s.x - centre, s.y - centre) for s in stars[1:]}
    for depth, ring in sorted(rings.items()):
        yield (
            f'<circle class="orbit" data-depth="{depth}" cx="{centre:.1f}" cy="{centre:.1f}"'
            f' r="{ring:.1f}" fill="none" stroke="{_ORBIT}" stroke-dasharray="3 5"/>'
        )


def _labelled_depth(stars: list[Star], max_labels: int) -> int:
    """The deepest ring whose labels, with all those nearer the centre, fit in `max_labels`
    (a ring is labelled whole or not at all); -1 when not even the sun's label fits."""
    per_depth = Counter(star.depth for star in stars)
    deepest, total = -1, 0
    for depth in sorted(per_depth):
        total += per_depth[depth]
        if total > max_labels:
            break
        deepest = depth
    return deepest


def _legend(stars: list[Star], shown: _Shown) -> str:
    archived = sum(star.archived for star in stars)
    count = f"{shown.total:,} session{'s' if shown.total != 1 else ''}"
    if shown.hidden:
        count += f" ({len(stars):,} drawn, the rest counted on the star above them)"
        return f"{count} · {archived} archived among those drawn · size: turns"
    return f"{count} · {archived} archived · size: turns · brightness: recency"


def render_topology(
    tree: TreeData,
    *,
    size: float = 640.0,
    max_labels: int = 120,
    label_chars: int = 24,
    max_stars: int = DEFAULT_MAX_STARS,
) -> str:
    """Draw `tree` as a standalone SVG star map (no scripts, no external resources).

    Args:
        tree: the topology to draw (`Topology.read(storage)`, `StelloAgent.tree()`).
        size: width and height of the map, in pixels.
        max_labels: label at most this many sessions: whole rings, from the centre out
            (every star still has a hover title).
        label_chars: longer labels are cut to this many characters, in the middle (with an
            ellipsis; siblings' cuts stay distinct). Labels never overlap: a star whose
            label has no free spot shows it only in its hover title, which always holds
            the full label.
        max_stars: draw at most this many sessions, from the centre out (whole rings, then
            the first sessions of the next); every session left out is counted on the drawn
            star it hangs under (a dotted halo, `data-hidden`, and its hover title), and the
            legend gives the tree's total. The default keeps a map under ~2 MB.

    Returns:
        The SVG document, as a string (UTF-8 text with no XML declaration, ready to inline in
        HTML or to write to a `.svg` file).

    Raises:
        InvalidInputError: a size, label limit or label length that cannot be drawn.
    """
    limits = (("max_labels", max_labels, 0), ("label_chars", label_chars, 2),
              ("max_stars", max_stars, 1))  # fmt: skip
    for name, value, low in limits:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInputError(f"{name} must be an int >= {low}, got {value!r}.")
    shown = _shown(tree, max_stars)
    stars = layout(shown, size=size)
    scale, legend = size / 640, _text(_legend(stars, shown))
    labels = place_labels(stars, size, max_labels, label_chars)
    return "".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{size:g}" height="{size:g}"'
            f' viewBox="0 0 {size:g} {size:g}" role="img" font-family="sans-serif">'
            f"<title>stello-graph topology: {legend}</title>"
            f'<rect class="sky" width="100%" height="100%" fill="{_SKY}"/><g class="orbits">',
            *_orbits_svg(stars, size),
            '</g><g class="edges">',
            *_edges_svg(stars, scale),
            '</g><g class="sessions">',
            *(  # children first, so parents (and the sun) sit on top
                _star_svg(star, labels.get(star.node.id), scale, shown.hidden.get(star.node.id, 0))
                for star in reversed(stars)
            ),
            f'</g><text class="legend" x="{8 * scale:.1f}" y="{size - 8 * scale:.1f}"'
            f' font-size="{10 * scale:.1f}" fill="{_EDGE}">{legend}</text></svg>',
        ]
    )
