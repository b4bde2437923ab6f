"""Choosing a provider without code, and chatting with an OpenAI-compatible server.

The server here is a small fake on 127.0.0.1 speaking the chat-completions protocol (with
server-sent events for streams), so the real `ChatOpenAI` client is exercised end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from stello_graph.checkpoints import SqliteMainStorage
from stello_graph.cli._common import CliError
from stello_graph.cli._provider import (
    LOCAL_API_KEY,
    NOT_CONFIGURED,
    ProviderSettings,
    build_chat_model,
)
from stello_graph.testing.openai_server import FakeOpenAI, Reply
from tests.cli.conftest import RunCli

WORDS = ["Hello", " from", " the", " local", " server."]


def test_settings_take_options_first_then_the_environment() -> None:
    env = {"STELLO_MODEL": "env-model", "OPENAI_BASE_URL": "http://env/v1", "OPENAI_API_KEY": "k"}
    assert ProviderSettings.from_env(env) == ProviderSettings(
        model="env-model", base_url="http://env/v1", api_key="k"
    )
    chosen = ProviderSettings.from_env(env, model="opt", base_url="http://opt/v1")
    assert (chosen.model, chosen.base_url) == ("opt", "http://opt/v1")
    blank = ProviderSettings.from_env({"STELLO_MODEL": " ", "OPENAI_BASE_URL": ""})
    assert blank == ProviderSettings()
    assert ProviderSettings(model="scripted").offline


def test_a_local_server_needs_no_key() -> None:
    model = build_chat_model(ProviderSettings(model="qwen", base_url="http://127.0.0.1:8080/v1"))
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "qwen"
    assert model.openai_api_base == "http://127.0.0.1:8080/v1"
    assert isinstance(model.openai_api_key, SecretStr)
    assert model.openai_api_key.get_secret_value() == LOCAL_API_KEY
    assert model.stream_usage is True


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ProviderSettings(), NOT_CONFIGURED),
        (ProviderSettings(model="scripted"), NOT_CONFIGURED),
        (ProviderSettings(model="gpt"), "needs a server"),
        (ProviderSettings(api_key="sk-x"), "OPENAI_API_KEY is set: name the model"),
    ],
)
def test_what_is_missing_is_named(settings: ProviderSettings, message: str) -> None:
    with pytest.raises(CliError, match=message[:30]) as caught:
        build_chat_model(settings)
    assert caught.value.code == 2


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """A scripted OpenAI-compatible server on 127.0.0.1; stopped after the test."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    reply = Reply(content="".join(WORDS), usage=(7, 5))
    with FakeOpenAI(default=reply) as fake:
        yield fake


def test_chat_with_an_openai_compatible_server(
    cli: RunCli, server: FakeOpenAI, tmp_path: Path
) -> None:
    db = tmp_path / "local.db"
    url = server.base_url
    run = cli("chat", "--db", str(db), "--model", "tiny-llm", "--manual",
              input="hello?\n/consolidate\n/fork B\n", env={"OPENAI_BASE_URL": url})  # fmt: skip
    assert run.code == 0, run.err
    assert f"model tiny-llm at {url}" in run.out
    assert "Main Session › Hello from the local server." in run.out
    assert not server.errors
    body, auth = server.requests[0].body, server.requests[0].headers.get("authorization")
    assert body["model"] == "tiny-llm" and body["stream"] is True
    assert auth == f"Bearer {LOCAL_API_KEY}"
    assert [t["function"]["name"] for t in body["tools"]] == ["create_session"]
    assert body["messages"][-1] == {"role": "user", "content": "hello?"}
    with SqliteMainStorage(db) as storage:
        main = storage.get_main_session()
        assert main is not None
        records = storage.list_records(main.id)
        assert [m.text for m in records] == ["hello?", "Hello from the local server."]
        assert records[1].usage_metadata is not None  # type: ignore[attr-defined]
        assert records[1].usage_metadata["total_tokens"] == 12  # type: ignore[attr-defined]


def test_an_unreachable_server_is_an_error_line(cli: RunCli, tmp_path: Path) -> None:
    db = tmp_path / "down.db"
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "x"}
    run = cli("chat", "--db", str(db), "--model", "m", "--manual", input="hi\n", env=env)
    assert run.code == 0
    assert "error: " in run.out and "Connection" in run.out


def test_a_provider_model_name_is_built_by_init_chat_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--model anthropic:...` went to OpenAI as a model name (with OPENAI_API_KEY set) or was
    refused as needing a server; it is LangChain's provider model, built offline here."""
    from langchain_anthropic import ChatAnthropic

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")  # built, never called
    settings = ProviderSettings.from_env(
        {"OPENAI_API_KEY": "k"}, model="anthropic:claude-sonnet-4-5"
    )
    assert settings.endpoint.startswith("anthropic")
    model = build_chat_model(settings)
    assert isinstance(model, ChatAnthropic) and model.model == "claude-sonnet-4-5"
    local = ProviderSettings(model="llama3.2:1b", base_url="http://127.0.0.1:9/v1")
    assert isinstance(build_chat_model(local), ChatOpenAI)  # a server's tagged name


def test_a_provider_model_that_cannot_be_built_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "langchain_upstage", None)  # not installed
    with pytest.raises(CliError, match="langchain-upstage"):
        build_chat_model(ProviderSettings(model="upstage:solar-pro"))


def test_inspect_with_write_refuses_a_model_it_cannot_build_at_start(
    cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "langchain_upstage", None)
    db = tmp_path / "t.db"
    SqliteMainStorage(db).close()
    from stello_graph import StelloAgent
    from stello_graph.testing import ScriptedChatModel

    StelloAgent(model=ScriptedChatModel(default="-"), storage=db).close()
    run = cli("inspect", "--db", str(db), "--write", "--no-browser", "--port", "0",
              "--model", "upstage:solar-pro")  # fmt: skip
    assert run.code == 2 and "langchain-upstage" in run.err
