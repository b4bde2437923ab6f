"""`stello-graph chat`, driven through stdin: commands, streaming, background work, Ctrl-C."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, SystemMessage

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli._chat import HELP
from stello_graph.memory import DEFAULT_CONSOLIDATE_PROMPT
from stello_graph.testing import ScriptedChatModel
from tests.cli.conftest import RunCli

SESSION = """\
hello main
/tree
/fork Pricing
free tier?
/history
/consolidate
/switch main
/fork Growth
where do users come from?
/consolidate
/integrate
/switch pricing
/insight
with the insight?
/insight
/history 2
/switch main
/insight
/consolidate
/archive
/switch Growth
/archive
/tree
/bogus
/switch
/switch nowhere
/fork
/history x
/history ²
//slash text
/wait
/help
/quit
never read
"""


def test_every_command_in_one_session(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    run = cli("chat", "--db", str(db), "--model", "scripted", "--manual", input=SESSION)
    assert run.code == 0, run.err
    out = run.out
    expected = [
        "Main Session › (scripted) You said: hello main",
        "⑂ forked 'Pricing'",
        "Pricing › (scripted) You said: free tier?",
        "you   › free tier?",
        "✓ consolidated 'Pricing' into its L2: Discussed: free tier?.",
        "Growth › (scripted) You said: where do users come from?",
        "✓ consolidated 'Growth' into its L2: Discussed: where do users come from?.",
        "✓ integrated the branches; 2 insight(s) sent",
        "synthesis: Pricing: Discussed: free tier?. | Growth: Discussed: where do users",
        "  insight → 'Pricing': Related branches: Growth",
        "  an insight is waiting: it goes with your next message",
        "insight: Related branches: Growth",
        "Pricing › (scripted) Noted, with the main session's insight in mind: with the insight?",
        "  (this reply used an insight from the main session)",
        "insight: (none waiting)",
        "synthesis: Pricing: Discussed",
        "error: the main session does not consolidate",
        "error: the main session cannot be archived",
        "archived 'Growth'; → 'Main Session'",
        "└── Growth [archived]  (",
        "error: unknown command '/bogus'; /help lists the commands.",
        "error: usage: /switch ID|LABEL",
        "error: no session 'nowhere'; /tree lists them",
        "error: usage: /fork LABEL",
        "error: usage: /history [N] with N a positive number",
        "Main Session › (scripted) You said: /slash text",
        "background work: done",
        HELP,
    ]
    assert out.count("error: usage: /history [N]") == 2  # `x`, and `²` (not an ASCII digit)
    assert "✓ background" not in out  # --manual: no background work, nothing reported as such
    position = 0
    for text in expected:  # in this order
        found = out.find(text, position)
        assert found >= 0, f"{text!r} missing after position {position} in:\n{out}"
        position = found + len(text)
    assert "never read" not in out
    history_2 = out.split("insight: (none waiting)\n")[1].splitlines()[:2]
    assert history_2 == [
        "you   › with the insight?",
        "model › (scripted) Noted, with the main session's insight in mind: with the insight?",
    ]
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        by_label = {m.label: m for m in storage.list_sessions()}
        assert by_label["Growth"].status == "archived"
        assert storage.get_turn_count(main.id) == 2
        assert storage.get_turn_count(by_label["Pricing"].id) == 2
        assert storage.get_insight(by_label["Pricing"].id) is None


def test_tokens_are_streamed_as_they_come(cli: RunCli, tmp_path: Path) -> None:
    writes: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return super().write(text)

    model = ScriptedChatModel(["one two three four"])
    run = cli("chat", "--db", str(tmp_path / "s.db"), "--manual", input="go\n",
              model=model, stdout=Recording())  # fmt: skip
    assert run.code == 0
    words = [w for w in writes if w.strip() in ("one", "two", "three", "four")]
    assert words == ["one", " two", " three", " four"]
    assert "".join(writes).count("Main Session › one two three four\n") == 1


def test_a_fork_made_by_the_model_is_shown(cli: RunCli, tmp_path: Path) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_call("create_session", {"label": "Side"}), "Opened it."],
        default="ok",
    )
    run = cli("chat", "--db", str(tmp_path / "f.db"), "--manual",
              input="branch off\n/switch Side\nhi\n", model=model)  # fmt: skip
    assert run.code == 0, run.err
    assert "  ↳ create_session(label='Side')\n" in run.out
    assert "  ⑂ new branch 'Side' (" in run.out
    assert "Main Session › Opened it.\n" in run.out
    assert "Side › ok\n" in run.out


class InterruptOnce(io.StringIO):
    """A terminal on which the user presses Ctrl-C when `trigger` is being printed; with
    `saved_in`, only once the turn being printed is stored in that database (the reply's
    tokens are shown while the step that called the model may still be committing it)."""

    def __init__(self, trigger: str, *, saved_in: Path | None = None) -> None:
        super().__init__()
        self.trigger: str | None = trigger
        self.saved_in = saved_in

    def write(self, text: str) -> int:
        if self.trigger is not None and self.trigger in text:
            self.trigger = None
            if self.saved_in is not None:
                _wait_for_a_turn(self.saved_in)
            raise KeyboardInterrupt
        return super().write(text)


def _wait_for_a_turn(db: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with SqliteMainStorage(db) as storage:
        while time.monotonic() < deadline:
            main = storage.get_main_session()
            if main is not None and storage.get_turn_count(main.id) >= 1:
                return
            time.sleep(0.01)
    raise AssertionError(f"no turn was stored in {db} within {timeout} s")


def test_ctrl_c_during_a_reply_says_what_was_saved_and_goes_on(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    # a turn without tools is committed in the step that called the model: Ctrl-C pressed
    # once it is stored, while its last tokens are still being shown, finds it saved
    model = ScriptedChatModel(["alpha beta gamma", "second answer"])
    out = InterruptOnce("beta", saved_in=db)
    run = cli("chat", "--db", str(db), "--manual", input="first\nsecond\n", model=model,
              stdout=out)  # fmt: skip
    text = out.getvalue()
    assert run.code == 0
    assert "Main Session › alpha\n^C: reply stopped; it had been saved just before." in text
    assert "Main Session › second answer" in text
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        texts = [m.text for m in storage.list_records(main.id)]
        assert texts == ["first", "alpha beta gamma", "second", "second answer"]
        assert storage.get_turn_count(main.id) == 2


class InterruptAfter(io.StringIO):
    """Standard input on which the user presses Ctrl-C at the prompt after some lines."""

    def readline(self, size: int = -1, /) -> str:  # type: ignore[override]
        line = super().readline(size)
        if not line:
            raise KeyboardInterrupt
        return line


def test_ctrl_c_at_the_prompt_leaves_cleanly(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    run = cli("chat", "--db", str(db), "--model", "scripted", "--manual",
              stdin=InterruptAfter("keep this\n"))  # fmt: skip
    assert run.code == 0
    with SqliteMainStorage(db) as storage:  # closed: no lock, no open transaction
        main = storage.get_main_session()
        assert main is not None
        assert storage.get_turn_count(main.id) == 1


def _slow_failing_consolidation(messages: list[BaseMessage]) -> str:
    system = " ".join(m.text for m in messages if isinstance(m, SystemMessage))
    if system.startswith(DEFAULT_CONSOLIDATE_PROMPT[:40]):
        time.sleep(0.8)
        raise RuntimeError("disk full")
    return "ok"


def test_background_work_is_shown_and_its_failures_reported(cli: RunCli, tmp_path: Path) -> None:
    model = ScriptedChatModel(respond=_slow_failing_consolidation)
    lines = "/fork A\none\n/switch main\ntwo\n/wait\n"  # the switch consolidates A: slowly
    run = cli("chat", "--db", str(tmp_path / "b.db"), input=lines, model=model)
    assert run.code == 0, run.err
    out = run.out
    busy = out.index("⋯ background work running (/wait waits for it)")
    failed = out.index("⚠ background consolidate of 'A' failed: ")
    assert out.index("Main Session › ok") < busy < failed < out.index("background work: done")
    assert "disk full" in out[failed:]


def test_background_work_left_at_exit_is_finished_and_reported(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    run = cli("chat", "--db", str(db), "--model", "scripted", input="/fork A\nidea\n/archive\n")
    assert run.code == 0, run.err
    # reported before the storage closed, whether it ended before or after the last line
    assert run.out.count("✓ background: consolidated 'A' into its L2\n") == 1
    with SqliteMainStorage(db) as storage:
        (archived,) = storage.list_sessions(status="archived")
        assert storage.get_memory(archived.id) == "Discussed: idea."


@pytest.mark.parametrize("mode", [["--manual"], []], ids=["manual", "scheduled"])
def test_own_consolidate_and_integrate_report_their_results_not_background_work(
    cli: RunCli, tmp_path: Path, mode: list[str]
) -> None:
    """The user's /consolidate and /integrate print their results, once; only the schedule's
    own jobs are reported as `background:` (here none runs: no switch, no fifth turn)."""
    lines = "/fork A\nidea\n/consolidate\n/integrate\n/wait\n"
    run = cli("chat", "--db", str(tmp_path / "own.db"), "--model", "scripted", *mode, input=lines)
    assert run.code == 0, run.err
    assert run.out.count("✓ consolidated 'A' into its L2: Discussed: idea.\n") == 1
    assert run.out.count("✓ integrated the branches; 0 insight(s) sent\n") == 1
    assert "synthesis: A: Discussed: idea.\n" in run.out
    assert "background:" not in run.out


def test_nothing_configured(cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = cli("chat")
    assert run.code == 2
    assert "no chat model configured" in run.err
    assert "OPENAI_BASE_URL=http://127.0.0.1:11434/v1 stello-graph chat --model" in run.err
    assert list(tmp_path.iterdir()) == []  # no database made
    run = cli("chat", env={"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"})
    assert run.code == 2 and "OPENAI_BASE_URL is set: name the model" in run.err


def test_the_scripted_model_from_the_environment(cli: RunCli, tmp_path: Path) -> None:
    run = cli("chat", "--db", str(tmp_path / "e.db"), "--manual", input="hi\n",
              env={"STELLO_MODEL": "scripted"})  # fmt: skip
    assert run.code == 0
    assert "model scripted (offline echo)" in run.out
    assert "Main Session › (scripted) You said: hi" in run.out


def test_chat_refuses_a_file_that_is_not_a_database(cli: RunCli, tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database")
    run = cli("chat", "--db", str(path), "--model", "scripted")
    assert run.code == 2 and "is not a SQLite database" in run.err
    assert path.read_text() == "not a database"
    run = cli("chat", "--db", str(tmp_path / "no" / "such.db"), "--model", "scripted")
    assert run.code == 2 and "no directory" in run.err


def test_a_failing_model_is_an_error_line_not_a_crash(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    model = ScriptedChatModel([RuntimeError("503 from provider"), "back again"])
    run = cli("chat", "--db", str(db), "--manual", input="one\ntwo\n", model=model)
    assert run.code == 0
    assert "error: " in run.out and "503 from provider" in run.out
    assert "Main Session › back again" in run.out
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        assert [m.text for m in storage.list_records(main.id)] == ["two", "back again"]
