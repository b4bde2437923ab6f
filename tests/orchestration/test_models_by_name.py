"""Models by name: wherever a chat model enters, `"provider:model"` (as LangChain's
`init_chat_model` and `create_agent` take it) is built once, when the agent, config,
profile or session is made; a name that cannot be built fails there, typed and naming the
fix. Models are built offline and never called."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

from stello_graph import (
    ForkProfile,
    InvalidInputError,
    MainSession,
    ModelNotConfiguredError,
    Session,
    StelloAgent,
    StelloConfig,
    build_stello_graph,
    llm_consolidator,
    llm_integrator,
)
from stello_graph._validate import MODEL_PROVIDERS, model_provider
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.memory import llm_compressor
from stello_graph.testing import ScriptedChatModel

OPENAI = "openai:gpt-4o-mini"
ANTHROPIC = "anthropic:claude-sonnet-4-5"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy keys: the clients are built, never called."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


@pytest.fixture
def no_upstage(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `upstage` provider's package, `langchain-upstage`, cannot be imported."""
    monkeypatch.setitem(sys.modules, "langchain_upstage", None)


def _model_name(model: object) -> object:
    return getattr(model, "model_name", None) or getattr(model, "model", None)


def test_the_agent_takes_a_model_name_and_builds_it_once() -> None:
    with StelloAgent(model=OPENAI, storage=InMemoryMainStorage()) as agent:
        model = agent.settings.model
        assert isinstance(model, ChatOpenAI) and _model_name(model) == "gpt-4o-mini"
        assert agent.main.model is model
        branch = agent.fork(agent.main_session_id, "B")
        assert agent.session(branch.id).model is model
        consolidate = agent._runtime.consolidate_fn
        assert getattr(consolidate, "model", None) is model  # the default memory's, too


def test_the_config_and_the_graph_take_model_names() -> None:
    config = StelloConfig(model=ANTHROPIC)
    assert isinstance(config.model, ChatAnthropic)
    assert _model_name(config.model) == "claude-sonnet-4-5"
    assert config.replace(max_tool_rounds=2).model is config.model  # built once
    inferred = StelloConfig(model="gpt-4o-mini")  # a provider init_chat_model infers
    assert isinstance(inferred.model, ChatOpenAI)
    graph = build_stello_graph(OPENAI, InMemoryMainStorage()).compile()
    assert graph is not None


def test_per_session_models_take_names() -> None:
    profile = ForkProfile(name="critic", model=ANTHROPIC)
    assert isinstance(profile.model, ChatAnthropic)
    with StelloAgent(
        model=ScriptedChatModel(default="r"), storage=InMemoryMainStorage(), profiles=[profile]
    ) as agent:
        own = agent.fork(agent.main_session_id, "Own", model=OPENAI)
        assert isinstance(agent.session(own.id).model, ChatOpenAI)
        critic = agent.fork(agent.main_session_id, "Critic", profile="critic")
        assert agent.session(critic.id).model is profile.model
    main = MainSession.create(InMemoryMainStorage(), model=OPENAI)
    assert isinstance(main.model, ChatOpenAI)
    child = Session.create(InMemoryMainStorage(), model=ANTHROPIC)  # standalone
    assert isinstance(child.model, ChatAnthropic)
    assert isinstance(child.fork("F", model=OPENAI).model, ChatOpenAI)
    for make in (llm_consolidator, llm_integrator, llm_compressor):
        assert isinstance(make(OPENAI).model, ChatOpenAI)


@pytest.mark.parametrize("name", ["nosuch:model-1", "llama3.2:1b", "my-model"])
def test_a_name_of_no_known_provider_is_refused_before_anything_is_made(
    tmp_path: Path, name: str
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(InvalidInputError) as caught:
        StelloAgent(model=name, storage=db)
    message = str(caught.value)
    assert f"model {name!r} names no provider" in message
    assert "'provider:model'" in message and "anthropic, anthropic_bedrock" in message
    assert not db.exists()
    with pytest.raises(InvalidInputError, match="empty name"):
        StelloConfig(model=" ")


def test_a_missing_integration_package_is_named_with_its_install(
    tmp_path: Path, no_upstage: None
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(ModelNotConfiguredError) as caught:
        StelloAgent(model="upstage:solar-pro", storage=db)
    assert "model 'upstage:solar-pro'" in str(caught.value)
    assert "pip install langchain-upstage" in str(caught.value)
    assert not db.exists()
    with pytest.raises(ModelNotConfiguredError, match="Profile 'p': model 'upstage:solar-pro'"):
        ForkProfile(name="p", model="upstage:solar-pro")


def test_a_name_whose_client_cannot_be_built_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ModelNotConfiguredError, match="OPENAI_API_KEY") as caught:
        StelloConfig(model=OPENAI)
    assert str(caught.value).startswith(f"model {OPENAI!r} could not be built")


def test_a_session_made_with_a_bad_name_stores_nothing(no_upstage: None) -> None:
    storage = InMemoryMainStorage()
    with pytest.raises(ModelNotConfiguredError):
        MainSession.create(storage, model="upstage:solar-pro")
    with pytest.raises(InvalidInputError):
        Session.create(storage, label="S", model="nosuch:model-1")
    assert storage.get_main_session() is None
    assert storage.list_sessions() == []


def test_the_provider_names_are_init_chat_models() -> None:
    from langchain.chat_models import base

    known = getattr(base, "_BUILTIN_PROVIDERS", None) or base._SUPPORTED_PROVIDERS  # type: ignore[attr-defined]
    assert set(MODEL_PROVIDERS) <= set(known)
    assert model_provider(ANTHROPIC) == "anthropic"
    assert model_provider("llama3.2:1b") is None and model_provider("gpt-4o-mini") is None
