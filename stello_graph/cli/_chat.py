"""`stello-graph chat`: a terminal conversation over a topology.

Plain lines are turns on the current session, streamed token by token; lines starting with
`/` are commands (`/help`). Background consolidation and integration run while you type: the
prompt shows `⋯` while they do, and their results and failures are reported before the next
prompt (`/consolidate` and `/integrate` report their own results at once). Ctrl-C during a
reply stops it: the turn is committed in one transaction at its end, so a stopped turn leaves
nothing behind. Ctrl-C at the prompt, `/quit` or Ctrl-D leave.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, cast

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from stello_graph._events_mux import EventMux
from stello_graph.cli._common import Console, clip
from stello_graph.errors import NothingToIntegrateError, StelloError
from stello_graph.events import StelloEvent

if TYPE_CHECKING:
    from stello_graph.agent import StelloAgent

__all__ = ["HELP", "ChatRepl"]

HELP = """\
Type a message to talk to the current session. Commands:
  /tree              the topology; ◀ marks where you are
  /switch ID|LABEL   go to another session (/switch main: the main session)
  /fork LABEL        open a branch under the current session and go to it
  /archive           archive the current session and go to its parent
  /consolidate       summarise the current session's history into its L2, now
  /integrate         read every branch's L2 into the main synthesis; push insights
  /insight           the insight waiting for this session (on main: the synthesis)
  /history [N]       the last N messages of this session (default 20)
  /wait              wait until background work is done
  /help              this help
  /quit              leave (Ctrl-D, or Ctrl-C at the prompt, too)
Ctrl-C during a reply stops it; the stopped turn is not saved. Start a message with // to
send text that begins with /."""

_BACKGROUND = ("consolidated", "integrated", "background_error")


class CommandError(Exception):
    """A command the REPL cannot run as typed; the message says what to type instead."""


class ChatRepl:
    """The read-eval-print loop of `stello-graph chat` over one agent.

    Args:
        agent: the topology to talk to (the REPL closes it when it ends).
        console: where to read lines and write replies.
        model_name: shown in the banner.
    """

    def __init__(self, agent: StelloAgent, console: Console, *, model_name: str) -> None:
        self.agent = agent
        self.io = console
        self.model_name = model_name
        self.current = agent.main_session_id
        self._events: queue.SimpleQueue[StelloEvent] = queue.SimpleQueue()
        self._busy_shown = False
        self._commands: dict[str, Callable[[str], None]] = {
            "/tree": self.cmd_tree, "/switch": self.cmd_switch, "/fork": self.cmd_fork,
            "/archive": self.cmd_archive, "/consolidate": self.cmd_consolidate,
            "/integrate": self.cmd_integrate, "/insight": self.cmd_insight,
            "/history": self.cmd_history, "/wait": self.cmd_wait, "/help": self.cmd_help,
        }  # fmt: skip
        agent.subscribe(self._on_event)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        """Read and run lines until the user leaves; close the agent; return the exit code."""
        try:
            self._banner()
            while self._step():
                pass
        finally:
            self._close()
        return 0

    def _step(self) -> bool:
        """Read and run one line; `False` when the user leaves."""
        self._report_background()
        try:
            line = self.io.read(self._prompt())
        except KeyboardInterrupt:
            self.io.say()
            return False
        if line is None or line.strip() in ("/quit", "/exit"):
            return False
        try:
            self.handle(line.strip())
        except KeyboardInterrupt:
            self.io.say(self.io.warn("\n^C: stopped."))
        except (CommandError, StelloError) as exc:
            self.io.say(self.io.warn(f"error: {exc}"))
        return True

    def handle(self, line: str) -> None:
        """Run one line: a command, or a turn on the current session."""
        if not line:
            return
        if line.startswith("/") and not line.startswith("//"):
            name, _, arg = line.partition(" ")
            command = self._commands.get(name.lower())
            if command is None:
                raise CommandError(f"unknown command {name!r}; /help lists the commands.")
            command(arg.strip())
            return
        self.turn(line[1:] if line.startswith("//") else line)

    def _banner(self) -> None:
        tree = self.agent.tree()
        self.io.say(
            self.io.bold("stello-graph chat")
            + f" · model {self.model_name} · {len(tree)} session(s) in this tree"
        )
        self.io.say(self.io.dim("Type a message, or /help for commands. /quit leaves."))
        self.io.say(f"You are in {self._name(self.current)}.")

    def _prompt(self) -> str:
        busy = " ⋯" if self._busy() else ""
        return f"{self.agent.session(self.current).meta.label}{busy} › "

    def _close(self) -> None:
        if self._busy():
            self.io.say(self.io.dim("⋯ finishing background work"))
        try:
            self.agent.drain()
            self._report_background()  # while the storage can still name the sessions
        except KeyboardInterrupt:  # Ctrl-C again: stop waiting; running jobs stay atomic
            self.io.say()
        finally:
            self.agent.close()

    # -- background work --------------------------------------------------------------------
    def _busy(self) -> bool:
        scheduler = self.agent._runtime.scheduler
        return scheduler is not None and scheduler.busy

    def _on_event(self, event: StelloEvent) -> None:
        # Runs on the worker that did the job: only queue; the REPL reports between prompts.
        # The events of the user's own /consolidate and /integrate (the agent's operations,
        # run quiet) are not background work: those commands print their results.
        if not event.streamed and event.type in _BACKGROUND and not EventMux.is_quiet():
            self._events.put(event)

    def _report_background(self) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            self.io.say(self._describe(event))
        busy = self._busy()
        if busy and not self._busy_shown:
            self.io.say(self.io.dim("⋯ background work running (/wait waits for it)"))
        self._busy_shown = busy

    def _describe(self, event: StelloEvent) -> str:
        data, whose = event.data, self._label(event.session_id)
        if event.type == "consolidated":
            return self.io.dim(f"✓ background: consolidated {whose} into its L2")
        if event.type == "integrated":
            count = data.get("insights", 0)
            return self.io.dim(f"✓ background: integrated the branches; {count} insight(s) sent")
        target = f" of {whose}" if event.session_id else ""
        return self.io.warn(
            f"⚠ background {data.get('kind', 'job')}{target} failed: "
            f"{data.get('error_type')}: {data.get('message')}"
        )

    # -- turns ------------------------------------------------------------------------------
    def turn(self, text: str) -> None:
        """One turn on the current session, its reply streamed as it comes."""
        sid = self.current
        before = self.agent.storage.get_turn_count(sid)
        printer = _ReplyPrinter(self.io, self.agent.session(sid).meta.label, self._name)
        stream = cast(  # a generator: closing it ends the turn's run at once
            "Generator[Any, None, None]",
            self.agent.stream(sid, text, stream_mode=["messages", "custom"]),
        )
        if self.io.interactive:
            printer.begin()  # at once: the reply may take a while to start
        try:
            for mode, data in stream:
                printer.feed(mode, data)
        except KeyboardInterrupt:
            stream.close()  # releases the session; an unfinished turn was never committed
            printer.end()
            saved = self.agent.storage.get_turn_count(sid) > before
            note = "it had been saved just before" if saved else "nothing of it was saved"
            self.io.say(self.io.warn(f"^C: reply stopped; {note}."))
        finally:
            stream.close()
            printer.end()

    # -- commands ---------------------------------------------------------------------------
    def cmd_help(self, arg: str) -> None:
        self.io.say(HELP)

    def cmd_tree(self, arg: str) -> None:
        marker = f"({self.current})"
        for line in self.agent.tree().render_text().splitlines():
            self.io.say(f"{line}  ◀" if line.endswith(marker) else line)

    def cmd_switch(self, arg: str) -> None:
        if not arg:
            raise CommandError("usage: /switch ID|LABEL (/tree lists the sessions)")
        self.current = self._resolve(arg)
        meta = self.agent.session(self.current).meta
        self.io.say(f"→ {self._name(self.current)}")
        if meta.status == "archived":
            self.io.say(self.io.dim("  archived: you can read it (/history) but not talk to it"))
        if meta.role == "standard" and self.agent.storage.get_insight(self.current):
            self.io.say(self.io.dim("  an insight is waiting: it goes with your next message"))

    def cmd_fork(self, arg: str) -> None:
        if not arg:
            raise CommandError("usage: /fork LABEL")
        node = self.agent.fork(self.current, arg)
        self.io.say(f"⑂ forked {self._name(node.id)} from {self._label(self.current)}")
        self.current = node.id

    def cmd_archive(self, arg: str) -> None:
        if self.current == self.agent.main_session_id:
            raise CommandError("the main session cannot be archived; /switch to a branch first")
        node = self.agent.storage.get_node(self.current)
        archived = self.current
        self.agent.archive(archived)
        self.current = (node.parent_id if node else None) or self.agent.main_session_id
        self.io.say(f"archived {self._label(archived)}; → {self._name(self.current)}")

    def cmd_consolidate(self, arg: str) -> None:
        if self.current == self.agent.main_session_id:
            raise CommandError("the main session does not consolidate; /integrate reads the L2s")
        l2 = self.agent.consolidate(self.current)
        whose = self._label(self.current)
        if l2 is None:
            self.io.say(f"nothing to consolidate in {whose} yet: talk first")
        else:
            self.io.say(f"✓ consolidated {whose} into its L2: {l2}")

    def cmd_integrate(self, arg: str) -> None:
        try:
            result = self.agent.integrate()
        except NothingToIntegrateError:
            raise CommandError("nothing to integrate yet: /consolidate a branch first") from None
        count = len(result.insights)
        self.io.say(f"✓ integrated the branches; {count} insight(s) sent")
        self.io.say(f"synthesis: {result.synthesis}")
        for session_id, insight in result.insights.items():
            self.io.say(f"  insight → {self._label(session_id)}: {insight}")

    def cmd_insight(self, arg: str) -> None:
        storage = self.agent.storage
        if self.current == self.agent.main_session_id:
            synthesis = storage.get_memory(self.current)
            self.io.say(f"synthesis: {synthesis or '(none yet: /integrate)'}")
            return
        insight = storage.get_insight(self.current)
        self.io.say(f"insight: {insight or '(none waiting)'}")

    def cmd_history(self, arg: str) -> None:
        if arg and (not (arg.isascii() and arg.isdigit()) or int(arg) == 0):
            raise CommandError("usage: /history [N] with N a positive number")
        limit = int(arg) if arg else 20
        storage = self.agent.storage
        total = storage.count_records(self.current)
        records = storage.list_records(self.current, offset=max(0, total - limit))
        if not records:
            self.io.say(self.io.dim("(no messages yet)"))
        for message in records:
            self.io.say(_history_line(message))

    def cmd_wait(self, arg: str) -> None:
        if self._busy():
            self.io.say(self.io.dim("⋯ waiting for background work"))
        self.agent.drain()
        self._report_background()
        self.io.say("background work: done")

    # -- names ------------------------------------------------------------------------------
    def _label(self, session_id: str | None) -> str:
        meta = self.agent.storage.get_session(session_id) if session_id else None
        return repr(meta.label) if meta is not None else repr(session_id)

    def _name(self, session_id: str | None) -> str:
        return f"{self._label(session_id)} ({session_id})"

    def _resolve(self, target: str) -> str:
        """A session id from an id, a label (any case), `main`, or a unique id prefix."""
        storage = self.agent.storage
        if storage.get_session(target) is not None:
            return target
        if target.lower() == "main":
            return self.agent.main_session_id
        sessions = storage.list_sessions()
        for same in (str.__eq__, lambda a, b: a.casefold() == b.casefold()):
            found = [m.id for m in sessions if same(m.label, target)]
            if len(found) == 1:
                return found[0]
            if found:
                ids = ", ".join(found)
                raise CommandError(f"several sessions are labelled {target!r} ({ids}); use an id")
        prefixed = [m.id for m in sessions if len(target) >= 4 and m.id.startswith(target)]
        if len(prefixed) == 1:
            return prefixed[0]
        raise CommandError(f"no session {target!r}; /tree lists them")


def _history_line(message: BaseMessage) -> str:
    if isinstance(message, HumanMessage):
        return f"you   › {message.text}"
    if isinstance(message, AIMessage):
        calls = ", ".join(f"{c['name']}({_args(c['args'])})" for c in message.tool_calls)
        text = message.text + (f" ↳ {calls}" if calls else "")
        return f"model › {text.strip()}"
    if isinstance(message, ToolMessage):
        return f"tool  › {message.name or 'tool'}: {clip(message.text, 300)}"
    return f"{message.type} › {clip(message.text, 300)}"


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in args.items())


class _ReplyPrinter:
    """Writes a streamed reply: tokens as they come, tool calls and forks on lines of their own."""

    def __init__(self, io: Console, label: str, name: Callable[[str | None], str]) -> None:
        self.io, self.label, self.name = io, label, name
        self.open = False  # a reply line is being written

    def begin(self) -> None:
        if not self.open:
            self.io.write(self.io.bold(f"{self.label} › "))
            self.open = True

    def feed(self, mode: str, data: Any) -> None:
        if mode == "messages":
            text = data[0].text
            if text:
                self.begin()
                self.io.write(text)
        elif mode == "custom":
            self._event(data)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "tool_call":
            self._line(f"  ↳ {event.get('name')}({_args(event.get('args') or {})})")
        elif kind == "session_forked":
            self._line(f"  ⑂ new branch {self.name(event.get('session_id'))}")
        elif kind == "insight_delivered":
            self._line("  (this reply used an insight from the main session)")

    def _line(self, text: str) -> None:
        self.end()
        self.io.say(self.io.dim(text))

    def end(self) -> None:
        if self.open:
            self.io.say()
            self.open = False
