"""Argument checks at the public boundary: every bad value gets an `InvalidInputError` naming it."""

from __future__ import annotations

import json
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from stello_graph.errors import InvalidInputError, ModelNotConfiguredError

__all__ = [
    "MAX_DEPTH",
    "MAX_ID_CHARS",
    "MAX_INPUT_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_TAG_CHARS",
    "MAX_TREE_ID_CHARS",
    "MODEL_PROVIDERS",
    "check_chat_model",
    "check_depth",
    "check_encodable",
    "check_id",
    "check_label",
    "check_metadata",
    "check_model_timeout",
    "check_optional_text",
    "check_tags",
    "check_text",
    "check_tools",
    "check_tree_id",
    "model_provider",
    "new_id",
    "too_deep",
]

MAX_INPUT_CHARS = 1_000_000
"""Longest user message or system prompt accepted, in characters."""
MAX_LABEL_CHARS = 200
MAX_TAG_CHARS = 100
MAX_ID_CHARS = 128
MAX_TREE_ID_CHARS = 256
"""Longest tree id accepted, in characters."""
MAX_DEPTH = 64
"""Deepest nesting of dicts and lists accepted where structured input enters: metadata,
tags, profile variables, a `tool_choice`, and the arguments of a model's tool calls.
Real documents stay far below it; deeper ones fail in serializers (JSON at about 1,000
levels, LangGraph's checkpoint serializer at a few hundred), so they are refused up front."""
MODEL_PROVIDERS = (
    "anthropic", "anthropic_bedrock", "azure_ai", "azure_openai", "baseten", "bedrock",
    "bedrock_converse", "bedrock_mantle_anthropic", "bedrock_mantle_openai", "cohere",
    "deepseek", "fireworks", "google_anthropic_vertex", "google_genai", "google_vertexai",
    "groq", "huggingface", "ibm", "langsmith", "litellm", "meta", "mistralai", "nvidia",
    "ollama", "openai", "openrouter", "perplexity", "together", "upstage", "xai",
)  # fmt: skip
"""The providers of LangChain's `init_chat_model`, the `provider` of a `"provider:model"`
name (each needs its integration package: `langchain-anthropic`, ...)."""
_V = TypeVar("_V")


def new_id() -> str:
    """A fresh session id."""
    return str(uuid.uuid4())


def _type_name(value: object) -> str:
    return type(value).__name__


def check_encodable(value: str, what: str) -> str:
    """`value` unchanged, once it is known to encode as UTF-8 (no lone surrogates)."""
    if value.isascii():  # an ASCII text needs no look
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} contains a lone surrogate at position {exc.start}; it cannot be stored."
        ) from None
    return value


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests dicts, lists or tuples more than `limit` levels deep.

    Measured without recursion, so a value of any depth (a cycle too) is measured safely;
    a string or a number is level 0, `{"a": 1}` level 1.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_depth(value: _V, what: str) -> _V:
    """`value` itself, once known to nest at most `MAX_DEPTH` levels deep."""
    if too_deep(value):
        raise InvalidInputError(
            f"{what} nests dicts and lists more than {MAX_DEPTH} levels deep; flatten it "
            f"({MAX_DEPTH} levels at most)."
        )
    return value


def _check_str(
    value: object, what: str, limit: int, *, allow_blank: bool = False, multiline: bool = False
) -> str:
    """A string of at most `limit` characters that can be stored: not blank (unless
    `allow_blank`), and one line with no control character (unless `multiline`)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a str, got {_type_name(value)}.")
    if not allow_blank and not value.strip():
        raise InvalidInputError(f"{what} is empty or only whitespace.")
    if len(value) > limit:
        raise InvalidInputError(f"{what} has {len(value):,} characters; the limit is {limit:,}.")
    bad = None if multiline else next((ch for ch in value if ch < " "), None)
    if bad is not None:
        raise InvalidInputError(f"{what} {value!r} contains the control character {bad!r}.")
    return check_encodable(value, what)


def check_text(value: object, what: str = "content") -> str:
    """A user message: a non-blank string of at most `MAX_INPUT_CHARS` characters."""
    return _check_str(value, what, MAX_INPUT_CHARS, multiline=True)


def check_optional_text(value: object, what: str) -> str | None:
    """An optional text (a system prompt): `None`, or a string within `MAX_INPUT_CHARS`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a str or None, got {_type_name(value)}.")
    return _check_str(value, what, MAX_INPUT_CHARS, allow_blank=True, multiline=True)


def check_label(value: object) -> str:
    """A session label: a one-line string of at most `MAX_LABEL_CHARS` (may be empty)."""
    return _check_str(value, "label", MAX_LABEL_CHARS, allow_blank=True)


def check_id(value: object, what: str = "session id") -> str:
    """A session id: a non-blank one-line string of at most `MAX_ID_CHARS`."""
    return _check_str(value, what, MAX_ID_CHARS)


def _shown(value: str, limit: int = 60) -> str:
    """`repr(value)`, cut to about `limit` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 4]}...{text[-1]}"


def check_tree_id(value: object) -> str:
    """A tree id: a non-empty string of at most `MAX_TREE_ID_CHARS` characters with no
    control character (NUL, a line break, a tab, ...): it names the tree in every row, lock
    key, checkpoint thread and store namespace of the tree."""
    if not isinstance(value, str):
        raise InvalidInputError(f"tree_id must be a str, got {_type_name(value)}.")
    if not value:
        raise InvalidInputError("tree_id must not be empty: name the tree (one per user).")
    if len(value) > MAX_TREE_ID_CHARS:
        raise InvalidInputError(
            f"tree_id {_shown(value)} has {len(value):,} characters; the limit is "
            f"{MAX_TREE_ID_CHARS}: use a shorter id (a user id, or a hash of a longer one)."
        )
    bad = next((ch for ch in value if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise InvalidInputError(
            f"tree_id {_shown(value)} contains the control character {bad!r}: a tree id is "
            "one line of printable text."
        )
    return check_encodable(value, "tree_id")


def check_tags(value: object) -> tuple[str, ...]:
    """Tags: a list or tuple of non-blank one-line strings; duplicates are dropped."""
    check_depth(value, "tags")
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidInputError(
            f"tags must be a list or tuple of strings, got {_type_name(value)}."
        )
    return tuple(dict.fromkeys(_check_str(tag, "tag", MAX_TAG_CHARS) for tag in value))


def check_metadata(value: object) -> dict[str, Any]:
    """Metadata: a JSON-serialisable mapping with string keys (`None` means empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {_type_name(value)}.")
    check_depth(value, "metadata")
    bad_key = next((k for k in value if not isinstance(k, str)), None)
    if bad_key is not None:
        raise InvalidInputError(f"metadata keys must be strings, got {bad_key!r}.")
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata must be JSON-serialisable: {exc}.") from None
    if len(encoded) > MAX_INPUT_CHARS:
        raise InvalidInputError(
            f"metadata is {len(encoded):,} characters as JSON; the limit is {MAX_INPUT_CHARS:,}."
        )
    return dict(json.loads(check_encodable(encoded, "metadata")))


def check_chat_model(value: object, what: str = "model") -> Any:
    """A LangChain chat model: anything with `invoke` and `stream`, or the name of one as
    LangChain's `init_chat_model` (and `create_agent`) take it: `"provider:model"`
    (`"openai:gpt-4o-mini"`, `"anthropic:claude-sonnet-4-5"`) or a name whose provider it
    infers (`"gpt-4o-mini"`). A name is built into its chat model here, once.

    Checked (and built) before it is used, so a wrong value fails where it is given, not at
    the session's next turn.

    Raises:
        InvalidInputError: not a chat model, or a name of no provider `init_chat_model` knows.
        ModelNotConfiguredError: the provider's integration package is not installed, or
            its client refused to be built (no API key, ...).
    """
    if isinstance(value, str):
        return _chat_model_named(value, what)
    if not callable(getattr(value, "invoke", None)) or not callable(getattr(value, "stream", None)):
        raise InvalidInputError(
            f"{what} must be a LangChain chat model (e.g. ChatOpenAI(...)) or its name "
            f"('openai:gpt-4o-mini'), got {value!r:.80}."
        )
    return value


def model_provider(name: str) -> str | None:
    """The provider a `"provider:model"` name starts with, when `init_chat_model` knows it
    (`"anthropic"` for `"anthropic:claude-sonnet-4-5"`); `None` for any other name (a bare
    one, or a server's `"llama3.2:1b"`)."""
    provider, colon, _ = name.partition(":")
    return provider if colon and provider in MODEL_PROVIDERS else None


def _chat_model_named(name: str, what: str) -> Any:
    if not name.strip():
        raise InvalidInputError(f"{what} is an empty name; name a model ('openai:gpt-4o-mini').")
    from langchain.chat_models import init_chat_model
    from pydantic import ValidationError

    try:
        return init_chat_model(name)
    except ImportError as exc:  # the provider's integration package is missing
        raise ModelNotConfiguredError(f"{what} {_shown(name)}: {exc}.") from exc
    except ValidationError as exc:
        raise ModelNotConfiguredError(
            f"{what} {_shown(name)} could not be built: {exc.errors()[0]['msg']}."
        ) from exc
    except ValueError as exc:  # the provider is unknown, or cannot be inferred
        raise InvalidInputError(
            f"{what} {_shown(name)} names no provider LangChain's init_chat_model knows: "
            "write it as 'provider:model' (e.g. 'openai:gpt-4o-mini'), the provider one of "
            f"{', '.join(MODEL_PROVIDERS)}; or pass a chat model object (for an "
            "OpenAI-compatible server: stello_graph.providers.local_chat_model(base_url, name))."
        ) from exc
    except Exception as exc:  # the provider's client refused its settings (no API key, ...)
        raise ModelNotConfiguredError(
            f"{what} {_shown(name)} could not be built: {type(exc).__name__}: {exc}"
        ) from exc


def check_tools(value: object, what: str = "tools", *, schemas: bool = False) -> list[Any]:
    """Tools: a list or tuple of LangChain tools or callables (and, with `schemas`, of the
    dicts `bind_tools` also takes, for a session whose caller runs its tools)."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidInputError(
            f"{what} must be a list or tuple of tools, got {_type_name(value)}; "
            "wrap a single tool in a list."
        )
    for index, item in enumerate(value):
        is_tool = callable(getattr(item, "invoke", None)) and isinstance(
            getattr(item, "name", None), str
        )
        if not (is_tool or callable(item) or (schemas and isinstance(item, Mapping))):
            raise InvalidInputError(
                f"{what}[{index}] must be a LangChain tool or a callable, got {item!r:.80}."
            )
    return list(value)


def check_model_timeout(value: object) -> float | None:
    """`None`, or a positive number of seconds (`model_timeout`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidInputError(f"model_timeout must be a number of seconds > 0, got {value!r}.")
    return float(value)
