"""Identifiers composed of several parts (a tree id, a session id, ...), never ambiguous.

Joining parts with a separator they may contain is ambiguous: `stello:team:x:notes` was the
checkpoint thread of tree `team`, session `x:notes` *and* of tree `team:x`, session `notes`.
`compose` percent-escapes each part (`:` and `/` included), so two different lists of parts
never give one id, and the id stays readable. Every id made of a tree id and a session id
(checkpoint threads, keys derived from them, leases) is made here. A LangGraph store
namespace is a tuple, unambiguous already, but its labels cannot hold a `.`: `store_label`.

Example:
    >>> thread_id("team", "x:notes"), thread_id("team:x", "notes")
    ('stello/team/x%3Anotes', 'stello/team%3Ax/notes')
"""

from __future__ import annotations

from urllib.parse import quote, unquote

__all__ = ["compose", "legacy_thread_id", "session_of_thread", "store_label", "thread_id"]


def compose(*parts: str) -> str:
    """The parts, each percent-escaped, joined by `/`: distinct parts give distinct ids."""
    return "/".join(quote(part, safe="") for part in parts)


def thread_id(tree_id: str, session_id: str) -> str:
    """The LangGraph checkpoint thread of the turns on one session of one tree."""
    return compose("stello", tree_id, session_id)


def session_of_thread(thread: str) -> tuple[str, str] | None:
    """The tree id and session id of a `thread_id`; `None` for any other thread."""
    parts = thread.split("/")
    if len(parts) != 3 or parts[0] != "stello":
        return None
    return unquote(parts[1]), unquote(parts[2])


def legacy_thread_id(tree_id: str, session_id: str) -> str:
    """The thread id earlier versions used (`stello:{tree}:{session}`, ambiguous).

    Only looked up, never written: a turn left in flight under it is resumed from it when
    its state names the same session (which, for a given session id, also pins the tree).
    """
    return f"stello:{tree_id}:{session_id}"


def store_label(part: str) -> str:
    """`part` as a LangGraph store namespace label (which cannot hold `.` or NUL).

    Only `%`, `.` and NUL are percent-escaped, so an id without them keeps its label (and
    the namespace it was published under) while distinct ids still get distinct labels.
    """
    return part.replace("%", "%25").replace(".", "%2E").replace("\x00", "%00")
