"""Test helpers: `ScriptedChatModel`, a chat model that replies from a script.

`ScriptedChatModel` is a real `BaseChatModel`: it binds tools, returns tool calls, streams
tokens (tool calls included), reports usage and fires callbacks like a provider model, so a
LangGraph graph under test cannot tell it from one. It records every prompt it received, so a
test can assert what the model was shown.

Example:
    >>> from stello_graph.testing import ScriptedChatModel
    >>> model = ScriptedChatModel(
    ...     [
    ...         ScriptedChatModel.tool_call("get_weather", {"city": "Paris"}),
    ...         "It is sunny in Paris.",
    ...     ]
    ... )
    >>> model.invoke("Weather in Paris?").tool_calls
    [{'name': 'get_weather', 'args': {'city': 'Paris'}, 'id': 'call_1', 'type': 'tool_call'}]
    >>> [chunk.text for chunk in model.stream("Thanks!")]
    ['It', ' is', ' sunny', ' in', ' Paris.', '']
    >>> model.prompts[1][0].text
    'Thanks!'
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import AliasChoices, BaseModel, Field, PrivateAttr

from stello_graph.errors import InvalidInputError, StelloUsageError
from stello_graph.testing._replies import (
    _BRANCH,
    _TOOL_CHOICES,
    Responder,
    ScriptedCall,
    ScriptedReply,
    _answer,
    _check_entry,
    _estimate_tokens,
    _from_spec,
    _is_responder,
    _last_user_text,
    _reply_ids,
    _reply_ids_lock,
    _to_chunks,
    _to_reply,
    _tool_names,
)

__all__ = [
    "Responder",
    "ScriptExhaustedError",
    "ScriptedCall",
    "ScriptedChatModel",
    "ScriptedReply",
]


class ScriptExhaustedError(StelloUsageError):
    """A `ScriptedChatModel` was called more times than it had replies for.

    Script more replies, or pass `respond=` or `default=` to answer every further call.
    """


class _Script:
    """State shared by a model and every `bind()` / `bind_tools()` / `model_copy()` of it."""

    def __init__(self) -> None:
        # Re-entrant: a responder may itself call the model.
        self.lock = threading.RLock()
        self.pending: deque[ScriptedReply] = deque()
        self.scripted = 0
        self.calls: list[ScriptedCall] = []
        self.taken = 0
        self.tool_call_ids = itertools.count(1)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Script:
        # Copies of a model, deep or not, answer from the same script.
        return self


def _field_names(model: type[BaseModel]) -> set[str]:
    """The keywords `model` takes: its fields' names and aliases (every alias choice)."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
        alias = info.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        names.update(choice for choice in choices if isinstance(choice, str))
    return names


def _check_fields(model: type[BaseModel], kwargs: Mapping[str, Any]) -> None:
    """Refuse keywords that are no field of `model`: `BaseChatModel` drops them silently,
    so a misspelt `defualt=` would leave a test running without its default reply."""
    if not kwargs or model.model_config.get("extra") == "allow":
        return
    known = _field_names(model) | {"responses", "respond", "default"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        hints = [
            f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
            for name in unknown
            for close in [difflib.get_close_matches(name, sorted(known), n=1)]
        ]
        raise InvalidInputError(f"{model.__name__} got unknown arguments: {', '.join(hints)}.")


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a script, for tests.

    Each call consumes the next scripted reply. A reply may be a `str` (plain text), an
    `AIMessage` (which may carry `tool_calls`), a dict shorthand
    `{"content": ..., "tool_calls": [{"name": ..., "args": ..., "id": ...}]}` (`id` optional),
    an exception instance (raised by that call, to script failures), or a callable receiving
    the prompt's messages and returning one of those. Tool calls without an id get
    `call_1`, `call_2`, ... in the order they are answered; replies get ids `scripted-<n>`,
    unique in the process.

    When the script is exhausted the model calls `respond`, else answers `default`, else
    raises `ScriptExhaustedError`. Every call is recorded (`calls`, `prompts`); records and
    script are shared by bound copies and guarded by a lock, so one model can serve many
    threads and event loops at once.

    Args:
        responses: The replies, consumed one per call.
        respond: Computes the reply of every call once `responses` is exhausted.
        default: The reply of every call once `responses` is exhausted.
        latency: Seconds each call waits before answering (`asyncio.sleep` when async).
        chunk_size: Stream text in chunks of this many characters instead of word by word.
        usage: Attach estimated `usage_metadata` (about 4 characters per token).
        name: Reported as `response_metadata["model_name"]` and in traces.
        **kwargs: Other `BaseChatModel` fields (`callbacks`, `tags`, `disable_streaming`...).

    Example:
        >>> model = ScriptedChatModel(["Hi!"], default="I have nothing more to say.")
        >>> model.invoke("Hello").content
        'Hi!'
        >>> model.invoke("And?").content
        'I have nothing more to say.'
        >>> model.call_count
        2
    """

    name: str | None = "scripted"
    latency: float = Field(default=0.0, ge=0.0)
    """Seconds each call waits before answering."""
    chunk_size: int | None = Field(default=None, ge=1)
    """Characters per streamed text chunk; `None` streams word by word."""
    usage: bool = True
    """Whether replies carry estimated `usage_metadata`."""

    _script: _Script = PrivateAttr(default_factory=_Script)
    _respond: Responder | None = PrivateAttr(default=None)
    _default: ScriptedReply | None = PrivateAttr(default=None)

    def __init__(
        self,
        responses: Iterable[ScriptedReply] = (),
        *,
        respond: Responder | None = None,
        default: ScriptedReply | None = None,
        latency: float = 0.0,
        chunk_size: int | None = None,
        usage: bool = True,
        name: str | None = "scripted",
        **kwargs: Any,
    ) -> None:
        _check_fields(type(self), kwargs)
        super().__init__(latency=latency, chunk_size=chunk_size, usage=usage, name=name, **kwargs)
        if respond is not None and default is not None:
            raise InvalidInputError("Pass `respond=` or `default=`, not both.")
        if respond is not None and not callable(respond):
            raise InvalidInputError(f"`respond=` must be callable, got {respond!r}.")
        if default is not None:
            _check_entry(default, "default=")
        self._respond = respond
        self._default = default
        self.extend(responses)

    # -- building replies -------------------------------------------------------------------

    @staticmethod
    def tool_call(
        name: str, args: Mapping[str, Any], *, id: str | None = None, content: str = ""
    ) -> AIMessage:
        """Build a reply that calls one tool.

        Args:
            name: The tool's name.
            args: The arguments, as a JSON-serialisable mapping.
            id: The tool call id; by default the model assigns `call_<n>`.
            content: Text sent along with the call.

        Returns:
            An `AIMessage` with one tool call.
        """
        return ScriptedChatModel.tool_calls(
            [{"name": name, "args": args, "id": id}], content=content
        )

    @staticmethod
    def tool_calls(
        calls: Iterable[tuple[str, Mapping[str, Any]] | Mapping[str, Any]], *, content: str = ""
    ) -> AIMessage:
        """Build a reply that calls several tools in parallel.

        Args:
            calls: `(name, args)` pairs, or dicts `{"name": ..., "args": ..., "id": ...}`.
            content: Text sent along with the calls.

        Returns:
            An `AIMessage` with the tool calls, in order.

        Example:
            >>> reply = ScriptedChatModel.tool_calls([("search", {"q": "a"}), ("search", {"q": "b"})])
            >>> [call["args"] for call in reply.tool_calls]
            [{'q': 'a'}, {'q': 'b'}]
        """  # noqa: E501
        specs = [c if isinstance(c, Mapping) else {"name": c[0], "args": c[1]} for c in calls]
        return _from_spec({"content": content, "tool_calls": specs}, "tool_calls()")

    @staticmethod
    def integration(synthesis: str, insights: Mapping[str, str] | None = None) -> Responder:
        """Build the reply of an integration call made by `llm_integrator`.

        The default integration prompt (`stello_graph.memory.DEFAULT_INTEGRATE_PROMPT`) asks
        for `{"synthesis": ..., "insights": {session_id: text}}`. Session ids are often not
        known when a script is written, so `insights` may name branches by label: the reply
        reads the branches shown in the prompt and answers with their session ids, exactly
        as a model following the prompt would. (A consolidation reply, by contrast, is the
        new L2 itself: script it as plain text.)

        Args:
            synthesis: The synthesis to answer.
            insights: Insight texts by branch label or session id.

        Returns:
            A `Responder`, to put in the script where the integration call comes.

        Raises:
            InvalidInputError: (when the call comes) a key names no branch shown, or a
                label shared by several branches.

        Example:
            >>> from stello_graph import ChildL2
            >>> from stello_graph.memory import llm_integrator
            >>> model = ScriptedChatModel([ScriptedChatModel.integration("S", {"Pricing": "i"})])
            >>> result = llm_integrator(model)([ChildL2(session_id="s1", label="Pricing", l2="x")], None)
            >>> result.synthesis, result.insights
            ('S', {'s1': 'i'})
        """  # noqa: E501
        wanted = dict(insights or {})

        def reply(messages: list[BaseMessage]) -> str:
            shown = _BRANCH.findall(messages[-1].text if messages else "")
            by_id = {sid: sid for sid, _ in shown}
            by_label: dict[str, list[str]] = {}
            for sid, label in shown:
                by_label.setdefault(label, []).append(sid)
            addressed: dict[str, str] = {}
            for key, text in wanted.items():
                ids = [by_id[key]] if key in by_id else by_label.get(key, [])
                if len(ids) != 1:
                    labels = sorted(by_label)
                    raise InvalidInputError(
                        f"Scripted integration insight for {key!r}: the prompt shows "
                        f"{'no such branch' if not ids else 'several branches so labelled'}"
                        f" (labels {labels}); name the branch by its session id."
                    )
                addressed[ids[0]] = text
            return json.dumps({"synthesis": synthesis, "insights": addressed})

        return reply

    def extend(self, responses: Iterable[ScriptedReply]) -> None:
        """Append replies to the script, after those not consumed yet.

        Raises:
            InvalidInputError: A reply is of a type the model cannot answer with.
        """
        entries = list(responses)
        for position, entry in enumerate(entries):
            _check_entry(entry, f"responses[{position}]")
        with self._script.lock:
            self._script.pending.extend(entries)
            self._script.scripted += len(entries)

    # -- records ------------------------------------------------------------------------------

    @property
    def calls(self) -> list[ScriptedCall]:
        """Every call received so far, oldest first."""
        with self._script.lock:
            return list(self._script.calls)

    @property
    def prompts(self) -> list[list[BaseMessage]]:
        """The messages of every call received so far, oldest first."""
        return [list(call.messages) for call in self.calls]

    @property
    def call_count(self) -> int:
        """How many calls the model received."""
        with self._script.lock:
            return len(self._script.calls)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been consumed yet."""
        with self._script.lock:
            return len(self._script.pending)

    def reset(self) -> None:
        """Forget the recorded calls; the script itself is left as it is."""
        with self._script.lock:
            self._script.calls.clear()
            self._script.taken = 0

    # -- BaseChatModel ------------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "stello-scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.name,
            "latency": self.latency,
            "chunk_size": self.chunk_size,
            "usage": self.usage,
        }

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools as OpenAI tool schemas; each call records their names.

        Args:
            tools: `@tool` functions, `BaseTool`s, pydantic models, functions or schemas.
            tool_choice: `"auto"`, `"any"`, `"required"`, `"none"`, a bound tool's name,
                an OpenAI `tool_choice` dict, or `True`.
            **kwargs: Further keywords bound to every call.

        Returns:
            The model with `tools` (and `tool_choice`) bound.

        Raises:
            InvalidInputError: `tool_choice` names a tool that is not bound.
        """
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        if isinstance(tool_choice, str) and tool_choice not in _TOOL_CHOICES:
            names = _tool_names(schemas)
            if tool_choice not in names:
                raise InvalidInputError(
                    f"`tool_choice={tool_choice!r}` is not one of the bound tools {names!r} "
                    f"nor one of {sorted(_TOOL_CHOICES)!r}."
                )
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._take(messages, stop, kwargs, streamed=False)
        if self.latency:
            time.sleep(self.latency)
        return ChatResult(generations=[ChatGeneration(message=_answer(call))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._take(messages, stop, kwargs, streamed=False)
        if self.latency:
            await asyncio.sleep(self.latency)
        return ChatResult(generations=[ChatGeneration(message=_answer(call))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._take(messages, stop, kwargs, streamed=True)
        if self.latency:
            time.sleep(self.latency)
        for message in _to_chunks(_answer(call), self.chunk_size):
            chunk = ChatGenerationChunk(message=message)
            # langchain-core passes a run manager only on the paths where it does not
            # report tokens itself (the v2 event bridge), as provider models do.
            if run_manager is not None:
                run_manager.on_llm_new_token(message.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._take(messages, stop, kwargs, streamed=True)
        if self.latency:
            await asyncio.sleep(self.latency)
        for message in _to_chunks(_answer(call), self.chunk_size):
            chunk = ChatGenerationChunk(message=message)
            if run_manager is not None:
                await run_manager.on_llm_new_token(message.text, chunk=chunk)
            yield chunk

    def __repr__(self) -> str:
        with self._script.lock:
            scripted, left = self._script.scripted, len(self._script.pending)
            calls = len(self._script.calls)
        parts = [f"name={self.name!r}", f"scripted={scripted}", f"remaining={left}"]
        parts.append(f"calls={calls}")
        if self._respond is not None:
            parts.append(f"respond={self._respond!r}")
        if self._default is not None:
            parts.append(f"default={self._default!r}")
        if self.latency:
            parts.append(f"latency={self.latency!r}")
        return f"ScriptedChatModel({', '.join(parts)})"

    # -- internals ----------------------------------------------------------------------------

    def _take(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        *,
        streamed: bool,
    ) -> ScriptedCall:
        """Consume the next reply, compute it, and record the call.

        The script is consumed under the lock; a responder runs outside it, so concurrent
        calls (sessions running in parallel) really overlap.
        """
        script = self._script
        with script.lock:
            script.taken += 1
            index = script.taken
            try:
                entry: ScriptedReply | BaseException = self._next_entry(messages, index)
            except Exception as exc:  # exhausted: that call raises it
                entry = exc
        reply: AIMessage | None = None
        error: BaseException | None = None
        try:
            outcome = entry if isinstance(entry, BaseException) else self._resolve(entry, messages)
        except Exception as exc:  # a responder failed: that call raises it
            outcome = exc
        if isinstance(outcome, BaseException):
            error = outcome
        else:
            reply = self._finish(outcome, messages)
        call = ScriptedCall(
            index=index,
            messages=list(messages),
            tools=_tool_names(kwargs.get("tools") or []),
            tool_choice=kwargs.get("tool_choice"),
            kwargs=dict(kwargs),
            stop=stop,
            streamed=streamed,
            reply=reply,
            error=error,
        )
        with script.lock:
            script.calls.append(call)
            script.calls.sort(key=lambda c: c.index)
        return call

    def _next_entry(self, messages: list[BaseMessage], index: int) -> ScriptedReply:
        script = self._script
        if script.pending:
            return script.pending.popleft()
        if self._respond is not None:
            return self._respond
        if self._default is not None:
            return self._default
        raise ScriptExhaustedError(
            f"{self!r} received call #{index} but only {script.scripted} "
            f"response(s) were scripted. Last user message: {_last_user_text(messages)}. "
            "Script more responses, or pass `respond=` or `default=`."
        )

    @staticmethod
    def _resolve(entry: ScriptedReply, messages: list[BaseMessage]) -> AIMessage | BaseException:
        if _is_responder(entry):
            return _to_reply(entry(list(messages)), f"the reply computed by {entry!r}")
        return _to_reply(entry, "the scripted reply")

    def _finish(self, reply: AIMessage, messages: list[BaseMessage]) -> AIMessage:
        """Give the reply its ids, usage and response metadata."""
        for call in reply.tool_calls:
            if not call.get("id"):
                call["id"] = f"call_{next(self._script.tool_call_ids)}"
        if reply.id is None:
            with _reply_ids_lock:
                reply.id = f"scripted-{next(_reply_ids)}"
        if self.usage and reply.usage_metadata is None:
            prompt_tokens = _estimate_tokens(messages)
            reply_tokens = _estimate_tokens([reply])
            reply.usage_metadata = {
                "input_tokens": prompt_tokens,
                "output_tokens": reply_tokens,
                "total_tokens": prompt_tokens + reply_tokens,
            }
        reply.response_metadata = {
            "model_name": self.name or "scripted",
            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            **reply.response_metadata,
        }
        return reply
