"""Memory functions: consolidate (L3 -> L2) and integrate (children's L2 -> synthesis + insights).

Both are `Protocol`s: any callable with the right signature works, sync or async. The
LLM-backed defaults `llm_consolidator` and `llm_integrator` turn any LangChain chat model into
one. Their model calls are tagged `nostream`, so they never leak into the tokens a LangGraph
`messages` stream shows the user.

Example:
    >>> from stello_graph.testing import ScriptedChatModel
    >>> summarise = llm_consolidator(ScriptedChatModel(["The user prefers tea."]))
    >>> summarise(None, [])
    'The user prefers tea.'
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig

from stello_graph._context import message_text, transcript
from stello_graph._validate import check_chat_model
from stello_graph.models import ChildL2, IntegrationResult

__all__ = [
    "DEFAULT_COMPRESS_PROMPT",
    "DEFAULT_CONSOLIDATE_PROMPT",
    "DEFAULT_INTEGRATE_PROMPT",
    "CompressFn",
    "ConsolidateFn",
    "IntegrateFn",
    "LLMCompressor",
    "LLMConsolidator",
    "LLMIntegrator",
    "llm_compressor",
    "llm_consolidator",
    "llm_integrator",
    "parse_integration",
]


class ConsolidateFn(Protocol):
    """Distils L3 into L2: `(current_l2, records) -> new_l2`.

    `records` are the L3 records not yet covered by `current_l2` (all of them on the first
    consolidation), so a long session is never re-read in full. Return the new L2, which
    replaces the old one. May be `async`.
    """

    def __call__(
        self, current_l2: str | None, records: list[BaseMessage], /
    ) -> str | Awaitable[str]: ...


class CompressFn(Protocol):
    """Summarises a stretch of history: `(previous_summary, records) -> summary`.

    Used by automatic context compression (the summary stands for the oldest records in the
    prompt; `previous_summary` is the summary it extends, if any) and by forks with
    `context="compress"` (the parent's history, summarised once). May be `async`.
    """

    def __call__(
        self, previous_summary: str | None, records: list[BaseMessage], /
    ) -> str | Awaitable[str]: ...


class IntegrateFn(Protocol):
    """Integrates children's L2: `(children, current_synthesis) -> IntegrationResult`.

    Sees only L2 (never L3). Returns the new synthesis and insights addressed by session id;
    insights for ids that were not among `children` are dropped by the caller. May be `async`.
    """

    def __call__(
        self, children: list[ChildL2], current_synthesis: str | None, /
    ) -> IntegrationResult | Awaitable[IntegrationResult]: ...


DEFAULT_CONSOLIDATE_PROMPT = """\
You maintain the outward summary of one branch of a larger, branching conversation. \
Other parts of the system read only this summary, never the conversation itself.
Update the current summary with the new records: keep decisions, facts, conclusions, open \
questions and the user's preferences; drop small talk and repetition. \
Write plain prose of at most 200 words. Output only the summary."""

DEFAULT_INTEGRATE_PROMPT = """\
You are a hub of a branching conversation: the main session, or a session that other \
sessions branch from. Each branch below is an independent line of thought directly under \
you, shown only through its summary.
1. Write a synthesis: what the branches add up to, where they agree, conflict or depend on \
each other, and what is still open.
2. Where one branch would benefit from something another branch found, write a short, \
concrete insight for that branch.
Answer with one JSON object and nothing else:
{"synthesis": "<text>", "insights": {"<session_id>": "<insight for that branch>"}}
Use only the session ids listed below as keys of "insights"; leave out branches that need \
no insight."""

DEFAULT_COMPRESS_PROMPT = """\
You compress the early part of a conversation so it can continue in a limited context. \
Merge the earlier summary (if any) with the records into one compact memo: keep the topic, \
decisions, facts, numbers, names, open questions and what the user asked for; drop \
pleasantries. Plain prose, at most 250 words. Output only the memo."""

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_A = TypeVar("_A")
_B = TypeVar("_B")
_R = TypeVar("_R")


def _clean(text: str) -> str:
    """Remove reasoning blocks (`<think>...</think>`, or an unclosed one) and outer space."""
    text = _THINK.sub("", text)
    opened = text.lower().find("<think>")
    if opened != -1:
        text = text[:opened]
    return text.strip()


def _config(kind: str) -> RunnableConfig:
    return {"tags": ["nostream", f"stello:{kind}"], "run_name": f"stello.{kind}"}


class _LLMFunction(Generic[_A, _B, _R]):
    """A memory function backed by a chat model: its system prompt, one model call (`invoke`
    when called, `ainvoke` through `acall`, tagged `nostream`) and the answer read."""

    kind: ClassVar[str]
    default_prompt: ClassVar[str]

    def __init__(self, model: BaseChatModel | str, prompt: str | None = None) -> None:
        self.model: BaseChatModel = check_chat_model(model)
        self.prompt = prompt or self.default_prompt

    def messages(self, first: _A, second: _B, /) -> list[BaseMessage]:
        raise NotImplementedError

    def _read(self, text: str, first: _A, second: _B) -> _R:
        raise NotImplementedError

    def __call__(self, first: _A, second: _B, /) -> _R:
        reply = self.model.invoke(self.messages(first, second), config=_config(self.kind))
        return self._read(message_text(reply.content), first, second)

    async def acall(self, first: _A, second: _B, /) -> _R:
        reply = await self.model.ainvoke(self.messages(first, second), config=_config(self.kind))
        return self._read(message_text(reply.content), first, second)


class LLMConsolidator(_LLMFunction[str | None, list[BaseMessage], str]):
    """A `ConsolidateFn` backed by a chat model (made by `llm_consolidator`)."""

    kind: ClassVar[str] = "consolidate"
    default_prompt: ClassVar[str] = DEFAULT_CONSOLIDATE_PROMPT
    _BODY: ClassVar[str] = (
        "Current summary:\n{summary}\n\nNew records:\n{records}\n\nWrite the updated summary."
    )
    _NO_SUMMARY: ClassVar[str] = "(none yet)"

    def messages(self, current_l2: str | None, records: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The prompt sent to the model."""
        summary, text = current_l2 or self._NO_SUMMARY, transcript(records) or "(none)"
        body = self._BODY.format(summary=summary, records=text)
        return [SystemMessage(content=self.prompt), HumanMessage(content=body)]

    def _read(self, text: str, first: str | None, second: list[BaseMessage]) -> str:
        return _clean(text)


class LLMCompressor(LLMConsolidator):
    """A `CompressFn` backed by a chat model (made by `llm_compressor`)."""

    kind: ClassVar[str] = "compress"
    default_prompt: ClassVar[str] = DEFAULT_COMPRESS_PROMPT
    _BODY: ClassVar[str] = "Earlier summary:\n{summary}\n\nRecords:\n{records}\n\nWrite the memo."
    _NO_SUMMARY: ClassVar[str] = "(none)"


def llm_compressor(model: BaseChatModel | str, prompt: str | None = None) -> LLMCompressor:
    """A `CompressFn` that asks `model` for a compact memo of the earlier conversation.

    Args:
        model: any LangChain chat model, or its name (`"openai:gpt-4o-mini"`, built by
            LangChain's `init_chat_model`).
        prompt: the system prompt of the compressing call (default `DEFAULT_COMPRESS_PROMPT`).
    """
    return LLMCompressor(model, prompt)


def llm_consolidator(model: BaseChatModel | str, prompt: str | None = None) -> LLMConsolidator:
    """A `ConsolidateFn` that asks `model` to update the L2 summary with the new records.

    Args:
        model: any LangChain chat model, or its name (`"openai:gpt-4o-mini"`, built by
            LangChain's `init_chat_model`).
        prompt: the system prompt of the summarising call (default `DEFAULT_CONSOLIDATE_PROMPT`).
    """
    return LLMConsolidator(model, prompt)


def _json_objects(text: str) -> Iterator[Any]:
    """Every JSON value found in `text`: fenced blocks first, then each balanced `{...}`."""
    for block in _FENCE.findall(text):
        with contextlib.suppress(ValueError):
            yield json.loads(block)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        with contextlib.suppress(ValueError):
            yield decoder.raw_decode(text, match.start())[0]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


_KEY_FIELDS = ("session_id", "sessionId", "id", "label")
_TEXT_FIELDS = ("insight", "content", "text")


def _insight_pairs(raw: Any) -> Iterator[tuple[str, str]]:
    if isinstance(raw, Mapping):
        yield from ((str(k), _as_text(v)) for k, v in raw.items())
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, Mapping):
            key = next((item[k] for k in _KEY_FIELDS if k in item), None)
            text = next((item[k] for k in _TEXT_FIELDS if k in item), None)
            if key is not None and text is not None:
                yield str(key), _as_text(text)


def _resolve_ids(pairs: Iterable[tuple[str, str]], children: Sequence[ChildL2]) -> dict[str, str]:
    """Keep insights addressed to given children, by id or (if unambiguous) by label."""
    ids = {c.session_id for c in children}
    folded = [(c.label.strip().casefold(), c.session_id) for c in children]
    labels = Counter(label for label, _ in folded)
    by_label = {label: sid for label, sid in folded if labels[label] == 1}
    insights: dict[str, str] = {}
    for key, text in pairs:
        key = key.strip()
        target = key if key in ids else by_label.get(key.casefold())
        if target is not None and text.strip():
            insights[target] = text.strip()
    return insights


def parse_integration(text: str, children: Sequence[ChildL2]) -> IntegrationResult:
    """Read an integrator model's answer, however it wrapped the JSON.

    Copes with `<think>` blocks, code fences and prose around the object. Insights are kept
    only for the given children (addressed by id, or by an unambiguous label). An answer with
    no usable JSON becomes the synthesis as a whole, with no insights.
    """
    cleaned = _clean(text)
    for value in _json_objects(cleaned):
        if isinstance(value, Mapping) and "synthesis" in value:
            synthesis = _as_text(value["synthesis"]).strip()
            insights = _resolve_ids(_insight_pairs(value.get("insights", {})), children)
            return IntegrationResult(synthesis=synthesis, insights=insights)
    return IntegrationResult(synthesis=cleaned, insights={})


class LLMIntegrator(_LLMFunction[list[ChildL2], str | None, IntegrationResult]):
    """An `IntegrateFn` backed by a chat model (made by `llm_integrator`)."""

    kind: ClassVar[str] = "integrate"
    default_prompt: ClassVar[str] = DEFAULT_INTEGRATE_PROMPT

    def messages(
        self, children: Sequence[ChildL2], current_synthesis: str | None
    ) -> list[BaseMessage]:
        """The prompt sent to the model."""
        branches = "\n\n".join(
            f'<branch session_id="{c.session_id}" label="{c.label}">\n{c.l2}\n</branch>'
            for c in children
        )
        body = (
            f"Current synthesis:\n{current_synthesis or '(none yet)'}\n\n"
            f"Branches:\n{branches}\n\nAnswer with the JSON object."
        )
        return [SystemMessage(content=self.prompt), HumanMessage(content=body)]

    def _read(self, text: str, children: list[ChildL2], current: str | None) -> IntegrationResult:
        return parse_integration(text, children)


def llm_integrator(model: BaseChatModel | str, prompt: str | None = None) -> LLMIntegrator:
    """An `IntegrateFn` that asks `model` for a synthesis and per-branch insights as JSON.

    Args:
        model: any LangChain chat model, or its name (`"openai:gpt-4o-mini"`, built by
            LangChain's `init_chat_model`).
        prompt: the system prompt of the integrating call (default `DEFAULT_INTEGRATE_PROMPT`).
    """
    return LLMIntegrator(model, prompt)
