"""The topology slot: a child session's place in the tree, shown in its system message.

Opt-in (`StelloConfig.topology_slot`). When on, a child session's system message carries,
right after its identity line and before its insight, a short view of where it stands:
the path from the main session down to it, its siblings (the other children of its
parent) and its own children, by label, archived ones marked, and "you are here" on
itself. A model that sees its branches is less likely to open a duplicate one.

    <session_topology>
    Where this session stands in the tree of sessions:
    - Main Session
      - Ideas
        - Tea  <- you are here
          - Green tea
        - Coffee [archived]
    </session_topology>

The slot is bounded: at most `max_siblings` siblings and `max_children` children are
listed (then "... and N more"), at most `max_ancestors` ancestors (the nearest ones; then
"... N more above"), and the whole block, tags included, is at most `max_chars`
characters (cut at a line, and "[truncated]" marks it). A `hook` can decorate or replace
the text; its result is bounded the same way.

It is read with two storage calls per model call (`get_tree`, and the archived sessions),
whatever the depth; a session without a topology node (or a storage without a tree) shows
no slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stello_graph._flow import Flow, Storage
from stello_graph.errors import FunctionCallError, InvalidInputError
from stello_graph.models import SessionMeta, TopologyNode
from stello_graph.storage import MainStorage

__all__ = [
    "SLOT_TAG",
    "SlotEntry",
    "TopologySlot",
    "TopologyView",
    "check_topology_slot",
    "render_topology_slot",
]

SLOT_TAG = "session_topology"
"""The tag around the slot's text in the system message."""

_HERE = "  <- you are here"
_TRUNCATED = "[truncated]"


@dataclass(frozen=True, slots=True)
class SlotEntry:
    """One session the slot names: its id, label and whether it is archived."""

    id: str
    label: str
    archived: bool = False


@dataclass(frozen=True, slots=True)
class TopologyView:
    """What the slot shows, before it is rendered (given to `TopologySlot.hook`).

    Attributes:
        session: the session the prompt is for.
        ancestors: from the root (the main session) down to the parent.
        siblings: the parent's children in creation order, the session itself included.
        children: the session's own children, in creation order.
    """

    session: SlotEntry
    ancestors: tuple[SlotEntry, ...] = ()
    siblings: tuple[SlotEntry, ...] = ()
    children: tuple[SlotEntry, ...] = ()


SlotHook = Callable[[TopologyView, str], str | None]
"""`hook(view, text)`: the text to show (`text` decorated, or another), or `None` / `""`
for no slot."""


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"TopologySlot.{name} must be an int >= 1, got {value!r}.")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class TopologySlot:
    """Settings of the topology slot (`StelloConfig(topology_slot=TopologySlot(...))`).

    Example:
        >>> TopologySlot(max_chars=600).max_chars
        600
        >>> TopologySlot(max_chars=10)
        Traceback (most recent call last):
        ...
        stello_graph.errors.InvalidInputError: TopologySlot.max_chars must be at least 120 ...
    """

    max_chars: int = 1500
    """The most characters of the whole block, its tags included (at least 120): a longer
    one is cut at a line and ends with "[truncated]"."""
    max_ancestors: int = 6
    """The most ancestors shown (the nearest; the root is always among them when shown)."""
    max_siblings: int = 12
    """The most siblings listed (the session itself not counted)."""
    max_children: int = 12
    """The most children of the session listed."""
    hook: SlotHook | None = field(default=None, compare=False)
    """Decorates or replaces the text: `hook(view, text) -> str | None`."""

    def __post_init__(self) -> None:
        for name in ("max_ancestors", "max_siblings", "max_children"):
            _positive(getattr(self, name), name)
        if _positive(self.max_chars, "max_chars") < 120:
            raise InvalidInputError(
                f"TopologySlot.max_chars must be at least 120 (room for the tags and one "
                f"line), got {self.max_chars}."
            )
        if self.hook is not None and not callable(self.hook):
            raise InvalidInputError(f"TopologySlot.hook must be callable, got {self.hook!r}.")

    def flow(self, session_id: str) -> Flow[str | None]:
        """Read the tree and render the slot of `session_id` (`None`: no slot)."""
        nodes: list[TopologyNode] = yield Storage(MainStorage.get_tree)
        if not nodes:
            return None
        archived: list[SessionMeta] = yield Storage(MainStorage.list_sessions, status="archived")
        view = build_view(nodes, {meta.id for meta in archived}, session_id)
        return None if view is None else self.render(view)

    def render(self, view: TopologyView) -> str | None:
        """The block for `view`: rendered, passed through the hook, and bounded."""
        text = render_topology_slot(view, self)
        if self.hook is not None:
            try:
                hooked = self.hook(view, text)
            except Exception as exc:
                raise FunctionCallError(
                    f"The topology slot hook failed: {type(exc).__name__}: {exc}"
                ) from exc
            if hooked is not None and not isinstance(hooked, str):
                raise FunctionCallError(
                    f"The topology slot hook returned {type(hooked).__name__}, expected a "
                    "str or None."
                )
            text = hooked or ""
        return _bounded(text, self.max_chars) if text.strip() else None


def check_topology_slot(value: object) -> TopologySlot | None:
    """The setting as a `TopologySlot` (`True`: the default one; `None` / `False`: off)."""
    if value is None or value is False:
        return None
    if value is True:
        return TopologySlot()
    if isinstance(value, TopologySlot):
        return value
    raise InvalidInputError(
        f"topology_slot must be a TopologySlot, True or None, got {type(value).__name__}."
    )


def build_view(
    nodes: list[TopologyNode], archived: set[str], session_id: str
) -> TopologyView | None:
    """The view of `session_id` in the tree `nodes` (`None` when it has no node there)."""
    by_id: dict[str | None, TopologyNode] = {node.id: node for node in nodes}
    me = by_id.get(session_id)
    if me is None:
        return None

    def entry(node: TopologyNode) -> SlotEntry:
        return SlotEntry(node.id, node.label, node.id in archived)

    ancestors: list[SlotEntry] = []
    seen, current = {me.id}, me
    while (parent := by_id.get(current.parent_id)) is not None and parent.id not in seen:
        ancestors.append(entry(parent))
        seen.add(parent.id)
        current = parent
    parent_id = me.parent_id
    siblings = [entry(n) for n in nodes if parent_id is not None and n.parent_id == parent_id]
    children = [entry(n) for n in nodes if n.parent_id == me.id]
    return TopologyView(
        entry(me), tuple(reversed(ancestors)), tuple(siblings or [entry(me)]), tuple(children)
    )


def _name(entry: SlotEntry) -> str:
    label = " ".join(entry.label.split()) or "(no label)"
    return f"{label} [archived]" if entry.archived else label


def render_topology_slot(view: TopologyView, slot: TopologySlot | None = None) -> str:
    """The slot's text for `view`, within the limits of `slot` (default ones if `None`)."""
    slot = slot if slot is not None else TopologySlot()
    lines = [f"<{SLOT_TAG}>", "Where this session stands in the tree of sessions:"]
    names = [_name(ancestor) for ancestor in view.ancestors]
    hidden = max(0, len(names) - slot.max_ancestors)
    if hidden:  # the root, then the nearest ones
        names[1 : 1 + hidden] = [f"... {hidden} more above"]
    lines.extend(f"{'  ' * depth}- {name}" for depth, name in enumerate(names))
    indent = "  " * len(names)
    me = view.session.id
    index = next((i for i, e in enumerate(view.siblings) if e.id == me), 0)
    others = [e for e in view.siblings if e.id != me]
    listed = others[: slot.max_siblings]  # those before the session, then those after it
    lines.extend(f"{indent}- {_name(e)}" for e in listed[:index])
    lines.append(f"{indent}- {_name(view.session)}{_HERE}")
    children = view.children
    lines.extend(f"{indent}  - {_name(e)}" for e in children[: slot.max_children])
    if len(children) > slot.max_children:
        lines.append(f"{indent}  - ... and {len(children) - slot.max_children} more")
    lines.extend(f"{indent}- {_name(e)}" for e in listed[index:])
    if len(others) > slot.max_siblings:
        lines.append(f"{indent}- ... and {len(others) - slot.max_siblings} more sibling(s)")
    lines.append(f"</{SLOT_TAG}>")
    return "\n".join(lines)


def _bounded(text: str, limit: int) -> str:
    """`text` cut at a line so that it and the marker fit in `limit` characters; a block
    that was cut keeps its closing tag when it had one."""
    if len(text) <= limit:
        return text
    closing = f"</{SLOT_TAG}>"
    tail = f"{_TRUNCATED}\n{closing}" if text.rstrip().endswith(closing) else _TRUNCATED
    room = limit - len(tail) - 1
    head = text[:room]
    cut = head.rfind("\n")
    head = head[:cut] if cut > 0 else head
    return f"{head}\n{tail}"
