"""`StelloConfig`: the settings defined once, frozen, checked, taken by the agent and the graph."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from stello_graph import StelloAgent, StelloConfig, build_stello_graph
from stello_graph.checkpoints import InMemoryMainStorage
from stello_graph.config import StelloSettings
from stello_graph.errors import InvalidInputError
from stello_graph.nodes import StelloDeps, StelloRuntime
from stello_graph.testing import ScriptedChatModel


def test_the_keyword_settings_are_the_config_fields() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(StelloConfig)}
    keywords = typing.get_type_hints(StelloSettings)
    assert list(keywords) == list(fields)
    hints = typing.get_type_hints(StelloConfig)
    assert {name: hints[name] for name in fields} == keywords


def test_a_config_is_frozen_and_keyword_only() -> None:
    config = StelloConfig(max_tool_rounds=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_tool_rounds = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        StelloConfig(None)  # type: ignore[call-arg]
    assert config.replace(max_tool_rounds=4).max_tool_rounds == 4
    assert config.max_tool_rounds == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_tool_rounds": -1}, "max_tool_rounds"),
        ({"model_timeout": 0}, "model_timeout"),
        ({"model_retry": "often"}, "RetryPolicy"),
        ({"builtin_tools": ["teleport"]}, "Unknown built-in"),
        ({"tools": "not a list"}, "tools"),
        ({"model": object()}, "chat model"),
    ],
)
def test_bad_settings_are_refused_when_the_config_is_made(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        StelloConfig(**settings)  # type: ignore[arg-type]


def test_agent_and_graph_take_one_config_and_keywords_override_it() -> None:
    config = StelloConfig(model=ScriptedChatModel(default="from config"), max_tool_rounds=3)
    with StelloAgent(storage=InMemoryMainStorage(), config=config, main_label="Root") as agent:
        assert agent.settings.max_tool_rounds == 3
        assert agent.settings.main_label == "Root"
        assert agent.main.meta.label == "Root"
        assert agent.turn(agent.main_session_id, "hi").content == "from config"
    storage = InMemoryMainStorage()
    graph = build_stello_graph(None, storage, config=config, max_tool_rounds=1)
    assert graph.compile() is not None
    with pytest.raises(TypeError, match="teleport"):
        StelloAgent(storage=InMemoryMainStorage(), config=config, teleport=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="config must be a StelloConfig"):
        StelloAgent(storage=InMemoryMainStorage(), config={"model": None})  # type: ignore[arg-type]


def test_the_runtime_holds_the_config_and_reads_its_fields() -> None:
    model = ScriptedChatModel(default="r")
    runtime = StelloRuntime(InMemoryMainStorage(), StelloConfig(model=model), max_tool_rounds=5)
    assert StelloDeps is StelloRuntime
    assert runtime.config.max_tool_rounds == runtime.max_tool_rounds == 5
    assert runtime.model is model
    assert runtime.consolidate_fn is not None and runtime.integrate_fn is not None
    with pytest.raises(AttributeError):
        runtime.model = model  # type: ignore[misc]
