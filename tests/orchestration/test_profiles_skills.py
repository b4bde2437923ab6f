"""Fork profiles, compress-mode forks, skills with allow-lists, and the split guard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool

from stello_graph import InvalidInputError
from stello_graph.compression import CompressionPolicy
from stello_graph.profiles import ForkProfile, SplitGuard
from stello_graph.skills import Skill, SkillLoadError, load_skills
from stello_graph.testing import ScriptedCall, ScriptedChatModel
from tests.orchestration.conftest import AgentFactory

PROFILES = [
    ForkProfile(name="preset", system_prompt="PROFILE", system_prompt_mode="preset"),
    ForkProfile(name="prepend", system_prompt="PROFILE", system_prompt_mode="prepend"),
    ForkProfile(name="append", system_prompt="PROFILE", system_prompt_mode="append"),
    ForkProfile(
        name="reviewer",
        description="Reviews one topic critically",
        system_prompt=lambda v: f"Review {v['topic']} critically.",
        context="inherit",
        prompt="Ready to review.",
    ),
]
SKILLS = [
    Skill(name="haiku", description="Write haiku", content="HAIKU RULES: 5-7-5."),
    Skill(name="sql", description="Write SQL", content="SQL RULES: use CTEs."),
]


def tool_results(agent: Any, session_id: str) -> list[ToolMessage]:
    return [m for m in agent.session(session_id).messages() if isinstance(m, ToolMessage)]


def tool_schema(call: ScriptedCall, name: str) -> dict[str, Any]:
    tools = call.kwargs.get("tools") or []
    found = next(t["function"] for t in tools if t["function"]["name"] == name)
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("preset", "PROFILE"),
        ("prepend", "PROFILE\n\nSUPPLIED"),
        ("append", "SUPPLIED\n\nPROFILE"),
    ],
)
def test_profile_prompt_modes(make_agent: AgentFactory, profile: str, expected: str) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"), profiles=PROFILES)
    child = agent.fork(agent.main_session_id, "C", profile=profile, system_prompt="SUPPLIED")
    assert agent.storage.get_system_prompt(child.id) == expected
    bare = agent.fork(agent.main_session_id, "D", profile=profile)
    assert agent.storage.get_system_prompt(bare.id) == "PROFILE"


def test_profile_function_context_and_opening(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="r"), profiles=PROFILES)
    parent = agent.fork(agent.main_session_id, "P")
    agent.turn(parent.id, "the plan is X")
    child = agent.fork(parent.id, "R", profile="reviewer", profile_vars={"topic": "plan X"})
    assert agent.storage.get_system_prompt(child.id) == "Review plan X critically."
    texts = [m.text for m in agent.session(child.id).messages()]
    assert texts == ["the plan is X", "r", "Ready to review."]
    with pytest.raises(InvalidInputError, match="topic"):
        agent.fork(parent.id, "R2", profile="reviewer")
    assert len(agent.children(parent.id)) == 1


def test_profile_tools_and_model(make_agent: AgentFactory) -> None:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    own = ScriptedChatModel(default="from the profile's model")
    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        profiles=[ForkProfile(name="researcher", tools=[lookup], model=own)],
    )
    child = agent.fork(agent.main_session_id, "R", profile="researcher")
    assert agent.turn(child.id, "go").content == "from the profile's model"
    assert own.calls[-1].tools == ["lookup", "create_session"]


def test_model_picks_a_profile(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [
            ScriptedChatModel.tool_call(
                "create_session",
                {"label": "Critique", "profile": "reviewer", "profile_vars": {"topic": "pricing"}},
            ),
            "Opened a review.",
            ScriptedChatModel.tool_call("create_session", {"label": "X", "profile": "nope"}),
            "That profile does not exist.",
        ]
    )
    agent = make_agent(model=model, profiles=PROFILES)
    main = agent.main_session_id
    agent.turn(main, "review the pricing")
    description = tool_schema(model.calls[0], "create_session")["description"]
    assert "reviewer: Reviews one topic critically" in description
    (child,) = agent.children(main)
    assert agent.storage.get_system_prompt(child.id) == "Review pricing critically."
    result = agent.turn(main, "and another")
    assert result.content == "That profile does not exist."
    error = tool_results(agent, main)[-1]
    assert error.status == "error"
    assert "Unknown fork profile 'nope'" in str(error.content)
    assert len(agent.children(main)) == 1


def test_register_profile_later(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="r")
    agent = make_agent(model=model)
    agent.register_profile(ForkProfile(name="late", description="Added later"))
    agent.turn(agent.main_session_id, "hi")
    assert "late: Added later" in tool_schema(model.calls[-1], "create_session")["description"]


def test_compress_mode_fork_through_the_agent(make_agent: AgentFactory) -> None:
    seen: list[list[str]] = []

    def compress(previous: str | None, records: list[BaseMessage]) -> str:
        seen.append([m.text for m in records])
        return "MEMO"

    agent = make_agent(
        model=ScriptedChatModel(default="r"),
        compression=CompressionPolicy(compress_fn=compress),
    )
    parent = agent.fork(agent.main_session_id, "P")
    agent.turn(parent.id, "long discussion")
    child = agent.fork(parent.id, "C", context="compress")
    assert seen == [["long discussion", "r"]]
    compression = agent.storage.get_compression(child.id)
    assert compression is not None and compression.summary == "MEMO"
    assert agent.session(child.id).messages() == []


def write_skill(folder: Path, name: str, text: str) -> None:
    (folder / name).mkdir()
    (folder / name / "SKILL.md").write_text(text, encoding="utf-8")


def test_load_skills(tmp_path: Path) -> None:
    write_skill(tmp_path, "haiku", "---\ndescription: Write haiku\n---\n5-7-5.\n")
    write_skill(tmp_path, "sql", "---\nname: sql\ndescription: 'Write SQL: well'\n---\nCTEs.")
    skills = load_skills(tmp_path)
    assert [(s.name, s.description, s.content) for s in skills] == [
        ("haiku", "Write haiku", "5-7-5."),
        ("sql", "Write SQL: well", "CTEs."),
    ]
    write_skill(tmp_path, "broken", "no front matter here")
    with pytest.raises(SkillLoadError, match="broken"):
        load_skills(tmp_path)
    with pytest.raises(InvalidInputError, match="not a directory"):
        load_skills(tmp_path / "missing")


def activate(name: str) -> AIMessage:
    return ScriptedChatModel.tool_call("activate_skill", {"name": name})


def test_skills_allow_lists_are_enforced(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [activate("sql"), "used sql", activate("sql"), "could not", activate("haiku"), "ok"],
        default="r",
    )
    agent = make_agent(model=model, skills=SKILLS)
    main = agent.main_session_id
    agent.turn(main, "write a query")
    schema = tool_schema(model.calls[0], "activate_skill")
    assert "haiku: Write haiku" in schema["description"]
    assert "sql: Write SQL" in schema["description"]
    assert tool_results(agent, main)[-1].content == "SQL RULES: use CTEs."

    poet = agent.fork(main, "Poet", skills=["haiku"])
    agent.turn(poet.id, "try sql")
    shown = tool_schema(model.calls[-1], "activate_skill")
    assert "sql" not in shown["description"]
    prop = shown["parameters"]["properties"]["name"]
    assert prop.get("enum", [prop.get("const")]) == ["haiku"]  # one choice renders as const
    refused = tool_results(agent, poet.id)[-1]
    assert refused.status == "error"
    assert "Input should be 'haiku'" in str(refused.content)  # refused before it runs
    agent.turn(poet.id, "a haiku")
    assert tool_results(agent, poet.id)[-1].content == "HAIKU RULES: 5-7-5."

    grandchild = agent.fork(poet.id, "Inherits")  # allow-list inherited
    assert agent.skills_of(grandchild.id) == ["haiku"]
    silent = agent.fork(main, "None", skills=[])
    agent.turn(silent.id, "hello")
    names = [t["function"]["name"] for t in model.calls[-1].kwargs["tools"]]
    assert "activate_skill" not in names
    with pytest.raises(InvalidInputError, match="Unknown skill"):
        agent.fork(main, "Bad", skills=["nope"])


def test_profile_skills_and_set_skills(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="r")
    agent = make_agent(
        model=model, skills=SKILLS, profiles=[ForkProfile(name="dba", skills=["sql"])]
    )
    dba = agent.fork(agent.main_session_id, "DBA", profile="dba")
    assert agent.skills_of(dba.id) == ["sql"]
    agent.set_skills(dba.id, ["haiku", "sql"])
    agent.turn(dba.id, "hi")
    enum = tool_schema(model.calls[-1], "activate_skill")["parameters"]["properties"]["name"]
    assert enum["enum"] == ["haiku", "sql"]


def fork_call(label: str) -> AIMessage:
    return ScriptedChatModel.tool_call("create_session", {"label": label})


def test_split_guard_counts_turns(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [fork_call("a"), "t1", fork_call("b"), "t2", fork_call("c"), "t3", fork_call("d"), "t4"]
    )
    agent = make_agent(model=model, split_guard=SplitGuard(min_turns=2, cooldown_turns=2))
    main = agent.main_session_id
    outcomes = []
    for n in range(1, 5):
        agent.turn(main, f"turn {n}")
        result = tool_results(agent, main)[-1]
        outcomes.append(result.status)
        if result.status == "error":
            assert "Fork refused" in str(result.content)
    assert outcomes == ["error", "success", "error", "success"]
    assert [c.label for c in agent.children(main)] == ["b", "d"]
    first_refusal = tool_results(agent, main)[0].content
    assert "at least 2" in str(first_refusal)


def test_split_guard_one_fork_per_round(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(
        [ScriptedChatModel.tool_calls([("create_session", {"label": x}) for x in "abc"]), "done"]
    )
    agent = make_agent(model=model, split_guard=SplitGuard(cooldown_turns=1))
    agent.turn(agent.main_session_id, "branch out")
    statuses = sorted(r.status for r in tool_results(agent, agent.main_session_id))
    assert statuses == ["error", "error", "success"]
    assert len(agent.children(agent.main_session_id)) == 1
    payload = next(r for r in tool_results(agent, agent.main_session_id) if r.status == "success")
    assert set(json.loads(str(payload.content))) == {"session_id", "label"}
