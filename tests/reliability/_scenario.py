"""The deterministic world the reliability suites run in: model, tool and memory functions.

Everything here is a pure function of its inputs (hashes, never `random` or `hash()`), so a
turn resumed in another process makes the same decisions, and the verifier can tell from the
stored data alone what every record should look like:

* a turn's user text is unique (`u-<run>-<n>`); its final reply is `re:<text>`;
* a turn takes 0-2 tool rounds (chosen by a hash of the text); a round calls `lookup`, and
  sometimes `create_session` with the label `auto:<text>#<round>` (unique);
* every reply of a turn that was shown an insight carries `[saw:<insight>]`, so the L3 of a
  session tells which insights were delivered by committed turns;
* an L2 is `L2 covers <n>; last <text>`: `n` must equal the stored cursor;
* a synthesis is `syn-<run>-<k>`, an insight `ins-<run>-<k>-<i>`: `(run, k)` orders them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, tool

from stello_graph import ChildL2, IntegrationResult
from stello_graph._context import message_text

__all__ = [
    "INSIGHT",
    "AckWriter",
    "Integrator",
    "consolidate",
    "l2_count",
    "lookup",
    "order_key",
    "read_acks",
    "respond",
    "asks_for_tools",
    "saw_tags",
    "turn_part",
]

INSIGHT = re.compile(r"ins-\d+-\d+-\d+")
"""An insight text, as written by `Integrator` and found again in prompts and replies."""
_SAW = re.compile(r"\[saw:(ins-\d+-\d+-\d+)\]")
_L2 = re.compile(r"^L2 covers (\d+); last ")


def digest(*parts: object) -> int:
    """A stable hash of `parts` (the same in every process, unlike `hash()`)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


# -- the chat model ------------------------------------------------------------------------------
def planned_rounds(text: str) -> int:
    """Tool rounds the model takes in the turn on `text`: 0 (half the turns), 1 or 2."""
    return (0, 0, 1, 2)[digest("rounds", text) % 4]


def asks_for_tools(message: BaseMessage) -> bool:
    """An AI reply with tool calls, parsed or not (both open a tool round)."""
    return isinstance(message, AIMessage) and bool(message.tool_calls or message.invalid_tool_calls)


def turn_part(messages: Sequence[BaseMessage]) -> tuple[str, int]:
    """The user text of the turn in flight and how many tool rounds it took so far."""
    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    text = message_text(messages[last_human].content)
    rounds = sum(1 for m in messages[last_human + 1 :] if asks_for_tools(m))
    return text, rounds


def shown_insight(messages: Sequence[BaseMessage]) -> str | None:
    """The insight the prompt's system message shows, if any."""
    if messages and isinstance(messages[0], SystemMessage):
        found = INSIGHT.search(message_text(messages[0].content))
        return found.group(0) if found else None
    return None


def respond(messages: list[BaseMessage]) -> AIMessage:
    """The scripted model's answer to any prompt of a turn (see the module docstring)."""
    text, rounds = turn_part(messages)
    insight = shown_insight(messages)
    saw = f" [saw:{insight}]" if insight else ""
    if rounds < planned_rounds(text):
        calls: list[dict[str, Any]] = [
            {"name": "lookup", "args": {"key": f"{text}#{rounds}"}, "id": f"lk-{text}-{rounds}"}
        ]
        if digest("fork", text, rounds) % 5 == 0:
            context = "inherit" if digest("ctx", text) % 2 else "none"
            calls.append(
                {
                    "name": "create_session",
                    "args": {"label": f"auto:{text}#{rounds}", "context": context},
                    "id": f"cs-{text}-{rounds}",
                }
            )
        return AIMessage(content=f"calling{saw}", tool_calls=calls)
    return AIMessage(content=f"re:{text}{saw}")


@tool
def lookup(key: str) -> str:
    """Look a key up (takes a few milliseconds, so kills land inside tool rounds)."""
    time.sleep(0.002 + (digest("lookup", key) % 5) / 1000)
    return f"value-of-{key}"


def tools() -> list[BaseTool]:
    return [lookup]


# -- memory functions ----------------------------------------------------------------------------
def l2_count(l2: str | None) -> int | None:
    """How many records an L2 written by `consolidate` says it covers (`None`: not ours)."""
    if l2 is None:
        return None
    found = _L2.match(l2)
    return int(found.group(1)) if found else None


def consolidate(current: str | None, records: list[BaseMessage]) -> str:
    """L2 = how many records it covers, and the last user text among them."""
    time.sleep(0.001 + (digest("consolidate", current, len(records)) % 8) / 1000)
    covered = (l2_count(current) or 0) + len(records)
    humans = [message_text(m.content) for m in records if isinstance(m, HumanMessage)]
    return f"L2 covers {covered}; last {humans[-1] if humans else '-'}"


class Integrator:
    """An `IntegrateFn` writing `syn-<run>-<k>` and insights `ins-<run>-<k>-<i>`.

    Each child gets an insight when a hash of `(run, k, child)` says so (about one in two).
    """

    def __init__(self, run: int) -> None:
        self.run = run
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def __call__(self, children: list[ChildL2], current: str | None) -> IntegrationResult:
        with self._lock:
            k = next(self._counter)
        time.sleep(0.003)
        insights = {
            child.session_id: f"ins-{self.run}-{k}-{i}"
            for i, child in enumerate(children)
            if digest("insight", self.run, k, child.session_id) % 2 == 0
        }
        return IntegrationResult(synthesis=f"syn-{self.run}-{k}", insights=insights)


def order_key(text: str) -> tuple[int, int]:
    """`(run, k)` of a synthesis or an insight: a later integration has a larger key."""
    parts = text.split("-")
    return int(parts[1]), int(parts[2])


def saw_tags(content: str) -> list[str]:
    """The insights a reply says its prompt showed."""
    return _SAW.findall(content)


# -- acknowledgements ----------------------------------------------------------------------------
class AckWriter:
    """Append-only JSON lines, each flushed and fsync'ed before the next operation starts."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def begin(self, what: str) -> None:
        """Note the operation starting (flushed, not fsync'ed: it only has to survive a kill)."""
        self._file.write(json.dumps({"op": "begin", "what": what}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_acks(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of an ack file (a line cut by a kill is ignored)."""
    if not os.path.exists(path):
        return []
    acks: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                acks.append(json.loads(line))
    return acks
