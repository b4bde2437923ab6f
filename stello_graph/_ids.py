"""Identifiers composed of several parts (a tree id, a session id, ...), never ambiguous.

Joining parts with a separator they may contain is ambiguous: `stello:team:x:notes` was the
checkpoint thread of tree `team`, session `x:notes` *and* of tree `team:x`, session `notes`.
`compose` percent-escapes each part (`:` and `/` included), so two different lists of parts
never give one id, and the id stays readable. Every id made of a tree id and a session id
(checkpoint threads, keys derived from them, leases) is made here. A LangGraph store
namespace is a tuple, unambiguous already, but its labels cannot hold a `.`: `store_label`.
An owner of a lease or a claim is `host/pid/nonce` (`new_owner`), so that a holder that died
can be told from a live one (`owner_is_dead`).

Example:
    >>> thread_id("team", "x:notes"), thread_id("team:x", "notes")
    ('stello/team/x%3Anotes', 'stello/team%3Ax/notes')
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from urllib.parse import quote, unquote

__all__ = [
    "add_live",
    "compose",
    "discard_live",
    "legacy_thread_id",
    "new_owner",
    "owner_is_dead",
    "session_of_thread",
    "store_label",
    "thread_id",
]

_HOST = socket.gethostname()

# Owners of this process that hold (or are acquiring) a lease or a job claim: any other
# owner naming this process is a leftover, free to take over.
_live: set[str] = set()
_live_lock = threading.Lock()


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


def new_owner() -> str:
    """A fresh owner name: `host/pid/nonce`."""
    return f"{_HOST}/{os.getpid()}/{uuid.uuid4().hex[:16]}"


def owner_is_dead(owner: str) -> bool:
    """Whether `owner` surely holds nothing any more: a process of this machine that is
    gone, or an owner of this process that released or never finished acquiring."""
    host, _, rest = owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        with _live_lock:
            return owner not in _live
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by another user
        return False
    return False


def add_live(owner: str) -> None:
    """Count `owner`, of this process, as live (holding or acquiring a lease or a claim)."""
    with _live_lock:
        _live.add(owner)


def discard_live(owner: str) -> None:
    with _live_lock:
        _live.discard(owner)
