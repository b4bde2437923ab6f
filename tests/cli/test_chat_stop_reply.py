"""Ctrl-C during a reply streamed by a real (slow) server: the chat gets control back at once.

The server streams a reply that would take 20 s; Ctrl-C used to wait for all of it (and the
server never saw the client go away). The bound is a generous behaviour bound, not a
benchmark: it includes starting and closing the chat.
"""

from __future__ import annotations

import time
from pathlib import Path

from langchain_openai import ChatOpenAI

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.testing.openai_server import FakeOpenAI, Reply
from tests.cli.conftest import RunCli
from tests.cli.test_chat import InterruptOnce


def test_ctrl_c_stops_a_slow_reply_at_once(cli: RunCli, tmp_path: Path) -> None:
    slow = Reply(content=" ".join(["word"] * 200), chunk_delay=0.1)
    with FakeOpenAI([slow], default=Reply(content="ok")) as server:
        model = ChatOpenAI(base_url=server.base_url, api_key="sk-test", model="fake",
                           max_retries=0, timeout=60.0)  # fmt: skip
        db = tmp_path / "c.db"
        out = InterruptOnce(" word")  # Ctrl-C as the reply is being printed
        started = time.monotonic()
        run = cli("chat", "--db", str(db), "--manual", input="tell me\n/quit\n", model=model,
                  stdout=out)  # fmt: skip
        assert time.monotonic() - started < 10.0  # the whole reply takes 20 s
        deadline = time.monotonic() + 10.0
        while server.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.aborted == 1  # the HTTP stream was closed
    assert run.code == 0
    assert "^C: reply stopped; nothing of it was saved." in out.getvalue()
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None and storage.list_records(main.id) == []
