"""Bad fork options are refused before the fork writes anything, on every path to a fork."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.tools import tool

from stello_graph import InvalidInputError, Session, StelloAgent
from stello_graph.profiles import ForkProfile
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel
from tests.conftest import Api
from tests.orchestration.conftest import AgentFactory


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return query


BAD_OPTIONS = [
    ({"model": "notamodel"}, "model 'notamodel' names no provider"),
    ({"model": 42}, "model must be a LangChain chat model"),
    ({"tools": "abc"}, "tools must be a list or tuple of tools, got str"),
    ({"tools": [lookup, 42]}, "tools[1] must be a LangChain tool or a callable, got 42"),
    ({"tools": ["lookup"]}, "tools[0] must be a LangChain tool or a callable, got 'lookup'"),
    ({"inherit_system_prompt": "yes"}, "inherit_system_prompt must be a bool or None, got 'yes'"),
    ({"profile_vars": {"topic": "x"}}, "profile_vars were given without a profile"),
]
IDS = ["model-str", "model-int", "tools-str", "tools-int", "tools-name", "inherit", "vars"]


async def settle(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


def snapshot(storage: MainStorage) -> tuple[list[str], list[str], list[str]]:
    sessions = [m.id for m in storage.list_sessions()]
    nodes = [n.id for n in storage.get_tree()]
    return sessions, nodes, [str(storage.get_settings(s)) for s in sessions]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("options", "match"), BAD_OPTIONS, ids=IDS)
async def test_agent_fork_refuses_before_writing(
    make_agent: AgentFactory, mode: str, options: dict[str, Any], match: str
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), profiles=[ForkProfile(name="p")])
    before = snapshot(agent.storage)
    fork = agent.fork if mode == "sync" else agent.afork
    with pytest.raises(InvalidInputError, match=re.escape(match)):
        await settle(fork(agent.main_session_id, "Child", **options))
    assert snapshot(agent.storage) == before


async def test_good_options_still_fork(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), profiles=[ForkProfile(name="p")])
    child = agent.fork(
        agent.main_session_id,
        "Child",
        model=ScriptedChatModel(default="own model"),
        tools=[lookup],
        inherit_system_prompt=True,
        profile="p",
        profile_vars={"unused": "x"},
    )
    assert agent.turn(child.id, "hi").content == "own model"
    assert [t.name for t in agent.session(child.id).tools][:1] == ["lookup"]


@pytest.mark.parametrize(("options", "match"), BAD_OPTIONS[:5], ids=IDS[:5])
async def test_session_fork_refuses_before_writing(
    api: Api, options: dict[str, Any], match: str
) -> None:
    source = Session.create(api.storage, label="Source")
    before = snapshot(api.storage)
    fork = source.fork if api.mode == "sync" else source.afork
    with pytest.raises(InvalidInputError, match=re.escape(match)):
        await settle(fork("Child", **options))
    assert snapshot(api.storage) == before


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda f: f(tools="abc"), "tools must be a list or tuple of tools, got str"),
        (lambda f: f(tools=[None]), "tools[0] must be a LangChain tool or a callable, got None"),
        (lambda f: ForkProfile(name="p", tools="abc"), "tools must be a list or tuple"),
        (lambda f: ForkProfile(name="p", model="gpt"), "Profile 'p': model 'gpt' names no"),
        (lambda f: ForkProfile(name="p", model=42), "model must be a LangChain chat model"),
    ],
    ids=["agent-tools-str", "agent-tools-none", "profile-tools", "profile-name", "profile-model"],
)
def test_agent_and_profile_refuse_bad_tools_and_models(
    make_agent: AgentFactory, make: Callable[[AgentFactory], object], match: str
) -> None:
    def agent(**kwargs: Any) -> StelloAgent:
        return make_agent(model=ScriptedChatModel(default="ok"), **kwargs)

    with pytest.raises(InvalidInputError, match=re.escape(match)):
        make(agent)


def test_the_model_cannot_pass_profile_vars_without_a_profile(make_agent: AgentFactory) -> None:
    fork = ScriptedChatModel.tool_call("create_session", {"label": "X", "profile_vars": {"a": "b"}})
    agent: StelloAgent = make_agent(model=ScriptedChatModel([fork, "done"]))
    main = agent.main_session_id
    assert agent.turn(main, "fork please").content == "done"
    error = agent.session(main).messages()[-2]
    assert "profile_vars were given without a profile" in str(error.content)
    assert agent.children(main) == []
