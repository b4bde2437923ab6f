"""The topology slot: off by default; when on, exactly between the identity line and the
insight of a child's system message; ancestors, siblings and children by label, archived
ones marked; bounded in size; a hook decorates or replaces it."""

from __future__ import annotations

import re

import pytest
from langchain_core.messages import SystemMessage

from stello_graph import InvalidInputError, StelloAgent, StelloConfig, TopologySlot, TopologyView
from stello_graph._topology_slot import SLOT_TAG, SlotEntry, render_topology_slot
from stello_graph.errors import FunctionCallError
from stello_graph.testing import ScriptedChatModel
from tests.orchestration.conftest import AgentFactory


def _system(agent: StelloAgent, session_id: str) -> str:
    ctx = agent.session(session_id).turn_context()
    assert isinstance(ctx.system, SystemMessage)
    return str(ctx.system.content)


def _slot(text: str) -> str:
    found = re.search(rf"<{SLOT_TAG}>.*?</{SLOT_TAG}>", text, re.S)
    assert found is not None, text
    return found.group(0)


def _tree(agent: StelloAgent) -> dict[str, str]:
    main = agent.main_session_id
    ideas = agent.fork(main, "Ideas").id
    tea = agent.fork(ideas, "Tea").id
    coffee = agent.fork(ideas, "Coffee").id
    green = agent.fork(tea, "Green tea").id
    agent.fork(tea, "Oolong")
    agent.archive(coffee)
    return {"ideas": ideas, "tea": tea, "coffee": coffee, "green": green}


def test_off_by_default(make_agent: AgentFactory) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"))
    ids = _tree(agent)
    assert SLOT_TAG not in _system(agent, ids["tea"])


def test_the_slot_sits_between_the_identity_line_and_the_insight(
    make_agent: AgentFactory,
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), topology_slot=True,
                       system_prompt="Be brief.")  # fmt: skip
    ids = _tree(agent)
    agent.storage.put_system_prompt(ids["tea"], "Talk about tea.")
    agent.child(ids["tea"]).set_insight("Mention the water temperature.")
    agent.storage.put_subtree_synthesis(ids["tea"], "Green and oolong differ.")
    text = _system(agent, ids["tea"])
    sections = text.split("\n\n")
    assert sections[0] == "Talk about tea."
    assert sections[1].startswith("<session_identity>")
    assert sections[2] == _slot(text)
    assert sections[3].startswith("<insight>")
    assert sections[4].startswith("<branch_synthesis>")
    assert _slot(text) == "\n".join(
        [
            f"<{SLOT_TAG}>",
            "Where this session stands in the tree of sessions:",
            "- Main Session",
            "  - Ideas",
            "    - Tea  <- you are here",
            "      - Green tea",
            "      - Oolong",
            "    - Coffee [archived]",
            f"</{SLOT_TAG}>",
        ]
    )


def test_each_session_sees_itself_and_the_main_session_sees_no_slot(
    make_agent: AgentFactory,
) -> None:
    agent = make_agent(model=ScriptedChatModel(default="ok"), topology_slot=TopologySlot())
    ids = _tree(agent)
    assert "      - Green tea  <- you are here" in _slot(_system(agent, ids["green"]))
    assert "    - Tea\n" in _slot(_system(agent, ids["green"]))
    assert "  - Ideas  <- you are here\n    - Tea\n    - Coffee [archived]" in _slot(
        _system(agent, ids["ideas"])
    )
    assert agent.main.turn_context().system is None  # no prompt, no synthesis: no slot


def test_a_turn_shows_the_slot_to_the_model(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="ok")
    agent = make_agent(model=model, topology_slot=True)
    ids = _tree(agent)
    agent.turn(ids["tea"], "hello")
    system = model.prompts[-1][0]
    assert isinstance(system, SystemMessage) and "Tea  <- you are here" in str(system.content)
    # a new sibling shows at the next turn
    agent.fork(ids["ideas"], "Matcha")
    agent.turn(ids["tea"], "again")
    assert "    - Matcha" in str(model.prompts[-1][0].content)


def test_the_slot_is_bounded_and_truncation_is_marked(make_agent: AgentFactory) -> None:
    slot = TopologySlot(max_chars=400, max_siblings=5, max_children=3)
    agent = make_agent(model=ScriptedChatModel(default="ok"), topology_slot=slot)
    parent = agent.fork(agent.main_session_id, "Parent").id
    me = agent.fork(parent, "Me").id
    for n in range(20):
        agent.fork(parent, f"Sibling {n}")
        agent.fork(me, f"Child {n}")
    text = _slot(_system(agent, me))
    assert "- ... and 15 more sibling(s)" in text and "- ... and 17 more" in text
    assert "Sibling 4" in text and "Sibling 5" not in text
    assert "Child 2" in text and "Child 3" not in text
    long = TopologySlot(max_chars=200)
    view = TopologyView(
        SlotEntry("me", "Me"), (SlotEntry("root", "Root"),),
        tuple(SlotEntry(str(n), "A rather long sibling label " * 2) for n in range(9)),
    )  # fmt: skip
    bounded = long.render(view)
    assert bounded is not None and len(bounded) <= 200
    assert bounded.endswith(f"[truncated]\n</{SLOT_TAG}>")
    assert len(render_topology_slot(view)) > 200


def test_deep_trees_show_the_root_and_the_nearest_ancestors() -> None:
    ancestors = tuple(SlotEntry(f"a{n}", f"Level {n}") for n in range(10))
    view = TopologyView(SlotEntry("me", "Me"), ancestors, (SlotEntry("me", "Me"),))
    text = render_topology_slot(view, TopologySlot(max_ancestors=3))
    lines = text.splitlines()[2:-1]
    assert lines == [
        "- Level 0",
        "  - ... 7 more above",
        "    - Level 8",
        "      - Level 9",
        "        - Me  <- you are here",
    ]


def test_a_hook_decorates_replaces_or_removes_the_slot(make_agent: AgentFactory) -> None:
    def hook(view: TopologyView, text: str) -> str | None:
        if view.session.label == "Tea":
            return text + "\nDo not open a branch that exists already."
        if view.session.label == "Coffee":
            return None
        return f"You are {view.session.label}, child of {view.ancestors[-1].label}."

    agent = make_agent(model=ScriptedChatModel(default="ok"),
                       topology_slot=TopologySlot(hook=hook))  # fmt: skip
    ids = _tree(agent)
    assert "</session_topology>\nDo not open a branch" in _system(agent, ids["tea"])
    assert "You are Green tea, child of Tea." in _system(agent, ids["green"])
    agent.storage.put_session(
        agent.storage.get_session(ids["coffee"]).model_copy(update={"status": "active"})  # type: ignore[union-attr]
    )
    assert SLOT_TAG not in _system(agent, ids["coffee"])


def test_a_failing_hook_fails_the_context_with_a_typed_error(make_agent: AgentFactory) -> None:
    def hook(view: TopologyView, text: str) -> str:
        raise RuntimeError("nope")

    agent = make_agent(model=ScriptedChatModel(default="ok"),
                       topology_slot=TopologySlot(hook=hook))  # fmt: skip
    ids = _tree(agent)
    with pytest.raises(FunctionCallError, match="topology slot hook failed: RuntimeError"):
        _system(agent, ids["tea"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "topology_slot must be a TopologySlot"),
        (TopologySlot, "topology_slot must be a TopologySlot"),
    ],
)
def test_bad_settings_are_refused(value: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        StelloConfig(topology_slot=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_chars": 100}, "max_chars must be at least 120"),
        ({"max_siblings": 0}, "max_siblings must be an int >= 1"),
        ({"max_ancestors": True}, "max_ancestors must be an int >= 1"),
        ({"hook": "text"}, "hook must be callable"),
    ],
)
def test_bad_slot_limits_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        TopologySlot(**kwargs)  # type: ignore[arg-type]


def test_unique_labels_must_be_a_bool() -> None:
    with pytest.raises(InvalidInputError, match="unique_labels must be a bool"):
        StelloConfig(unique_labels="yes")  # type: ignore[arg-type]


async def test_an_async_turn_shows_the_slot_too(make_agent: AgentFactory) -> None:
    model = ScriptedChatModel(default="ok")
    agent = make_agent(model=model, topology_slot=True)
    ids = _tree(agent)
    await agent.aturn(ids["green"], "hello")
    system = str(model.prompts[-1][0].content)
    assert "      - Green tea  <- you are here" in system
    assert system.index("<session_identity>") < system.index(f"<{SLOT_TAG}>")
