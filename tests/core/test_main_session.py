"""MainSession semantics (DESIGN.md §3 "Main Session") and the LLM-backed integrator."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from stello_graph import (
    ChildL2,
    FunctionNotConfiguredError,
    IntegrationError,
    IntegrationResult,
    MainSession,
    MainSessionExistsError,
    MainSessionForkError,
    MainSessionNotFoundError,
    NothingToIntegrateError,
    Session,
    llm_integrator,
)
from stello_graph.memory import parse_integration
from stello_graph.storage import MainStorage
from stello_graph.testing import ScriptedChatModel


def test_create_makes_root_node_once(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage, label="Root")
    assert main.meta.role == "main"
    node = main_storage.get_node(main.id)
    assert node is not None and node.parent_id is None and node.label == "Root"
    with pytest.raises(MainSessionExistsError, match=main.id):
        MainSession.create(main_storage)
    assert MainSession.load(main_storage).id == main.id


def test_load_without_main(main_storage: MainStorage) -> None:
    with pytest.raises(MainSessionNotFoundError, match="no main session"):
        MainSession.load(main_storage)


def test_context_has_synthesis_no_identity_no_insight(main_storage: MainStorage) -> None:
    model = ScriptedChatModel(["r"])
    main = MainSession.create(main_storage, model=model, system_prompt="SYS", label="Hub")
    main_storage.put_memory(main.id, "SYNTH")
    main_storage.put_insight(main.id, "NOT SHOWN")
    main.send("q")
    system = model.prompts[0][0]
    assert isinstance(system, SystemMessage)
    assert system.text.index("SYS") < system.text.index("SYNTH")
    assert "Hub" not in system.text
    assert "NOT SHOWN" not in system.text
    assert isinstance(model.prompts[0][-1], HumanMessage)


def make_children(storage: MainStorage) -> tuple[MainSession, Session, Session, Session]:
    main = MainSession.create(storage)
    a = Session.create(storage, label="A")
    b = Session.create(storage, label="B")
    archived = Session.create(storage, label="Old")
    Session.create(storage, label="No L2 yet")
    storage.append_records(a.id, [HumanMessage(content="L3 OF A")])
    storage.put_memory(a.id, "L2 of A")
    storage.put_memory(b.id, "L2 of B")
    storage.put_memory(archived.id, "L2 of Old")
    archived.archive()
    return main, a, b, archived


def test_integrate_reads_l2_only_and_filters_insights(main_storage: MainStorage) -> None:
    main, a, b, archived = make_children(main_storage)
    seen: list[list[ChildL2]] = []

    def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        seen.append(children)
        assert current is None
        return IntegrationResult(
            synthesis="A and B agree.",
            insights={a.id: "Talk to B.", archived.id: "dropped", "ghost": "dropped"},
        )

    result = main.integrate(integrate)
    assert [(c.session_id, c.label, c.l2) for c in seen[0]] == [
        (a.id, "A", "L2 of A"),
        (b.id, "B", "L2 of B"),
    ]
    assert result.insights == {a.id: "Talk to B."}
    assert main.synthesis() == "A and B agree."
    assert a.insight() == "Talk to B."
    assert b.insight() is None
    assert archived.insight() is None
    assert main_storage.get_session("ghost") is None


def test_integrate_passes_current_synthesis_and_accepts_mappings(
    main_storage: MainStorage,
) -> None:
    main, a, _, _ = make_children(main_storage)
    main.integrate(lambda children, current: IntegrationResult(synthesis="v1"))
    result = main.integrate(
        lambda children, current: {"synthesis": f"{current}+v2", "insights": {a.id: "x"}}  # type: ignore[arg-type]
    )
    assert result.synthesis == "v1+v2"
    assert main.synthesis() == "v1+v2"


def test_integrate_errors_write_nothing(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage)
    with pytest.raises(FunctionNotConfiguredError, match="integrate_fn"):
        main.integrate()
    with pytest.raises(NothingToIntegrateError):
        main.integrate(lambda c, s: IntegrationResult(synthesis="x"))
    child = Session.create(main_storage, label="c")
    main_storage.put_memory(child.id, "l2")

    def boom(children: list[ChildL2], current: str | None) -> IntegrationResult:
        raise KeyError("broken")

    with pytest.raises(IntegrationError, match="broken"):
        main.integrate(boom)
    with pytest.raises(IntegrationError, match="expected IntegrationResult"):
        main.integrate(lambda c, s: "just text")  # type: ignore[arg-type]
    with pytest.raises(IntegrationError, match="empty synthesis"):
        main.integrate(lambda c, s: IntegrationResult(synthesis=" "))
    assert main.synthesis() is None
    assert child.insight() is None


async def test_aintegrate_with_async_fn(main_storage: MainStorage) -> None:
    main = await MainSession.acreate(main_storage)
    child = await Session.acreate(main_storage, label="c")
    await main_storage.aput_memory(child.id, "l2")

    async def integrate(children: list[ChildL2], current: str | None) -> IntegrationResult:
        return IntegrationResult(synthesis="s", insights={children[0].session_id: "i"})

    result = await main.aintegrate(integrate)
    assert result.insights == {child.id: "i"}
    assert await main.asynthesis() == "s"
    assert await child.ainsight() == "i"
    assert (await MainSession.aload(main_storage)).id == main.id


def test_main_session_cannot_fork(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage)
    with pytest.raises(MainSessionForkError, match=r"StelloAgent\.fork"):
        main.fork("x")


CHILDREN = [
    ChildL2(session_id="s-1", label="Pricing", l2="..."),
    ChildL2(session_id="s-2", label="Design", l2="..."),
]


@pytest.mark.parametrize(
    "answer",
    [
        '{"synthesis": "S", "insights": {"s-1": "I1", "s-9": "gone"}}',
        'Sure! Here it is:\n```json\n{"synthesis": "S", "insights": {"s-1": "I1"}}\n```\nBye',
        '<think>{"synthesis": "wrong"}</think>{"synthesis": "S", "insights": {"s-1": "I1"}}',
        'Result: {"synthesis": "S", "insights": [{"session_id": "s-1", "insight": "I1"}]} ok',
        '{"synthesis": "S", "insights": {"pricing": "I1"}}',
    ],
)
def test_parse_integration_copes_with_wrappers(answer: str) -> None:
    result = parse_integration(answer, CHILDREN)
    assert result == IntegrationResult(synthesis="S", insights={"s-1": "I1"})


def test_parse_integration_without_json_keeps_text() -> None:
    result = parse_integration("<think>x</think> Branches agree on price.", CHILDREN)
    assert result == IntegrationResult(synthesis="Branches agree on price.", insights={})


def test_llm_integrator_end_to_end(main_storage: MainStorage) -> None:
    main = MainSession.create(main_storage)
    child = Session.create(main_storage, label="Pricing")
    main_storage.put_memory(child.id, "Free tier wanted.")
    model = ScriptedChatModel(
        [
            lambda msgs: json.dumps(
                {"synthesis": "All good.", "insights": {child.id: "Check costs."}}
            )
        ]
    )
    result = main.integrate(llm_integrator(model))
    assert result.insights == {child.id: "Check costs."}
    prompt_text = model.prompts[0][-1].text
    assert child.id in prompt_text and "Free tier wanted." in prompt_text
