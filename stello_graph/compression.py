"""Automatic context compression: when a prompt would outgrow its budget or the model's window.

A prompt is planned against a number of tokens (`CompressionPolicy.limit`): the prompt budget
(`budget`) or the model's context window, whichever is smaller, and `DEFAULT_PROMPT_BUDGET`
when neither is known. When a session's prompt would exceed `threshold` of it, its oldest
records are replaced *in the prompt* (never in storage: L3 keeps every record) by a summary.
The summary is persisted with the number of records it covers (`Compression`), so a reloaded
session reuses it; when the prompt outgrows the limit again, the summary is extended with the
next stretch of records.

Where the cut falls: only at the start of a user turn (so never inside a tool-call group), and
never past the newest user turn of the history (the turn being sent is never part of it).

How big a prompt is: the provider's own figure when it reported one (the input and output
tokens of the last reply, plus an estimate of what came after it), else an estimate from the
characters (`chars_per_token`, no tokenizer download needed). A reply made before the summary
in use is not taken at its word: its figure counted the records the summary now stands for.
So a turn compresses once, and again only if the history it kept really outgrows the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from stello_graph._context import message_text
from stello_graph.errors import InvalidInputError
from stello_graph.memory import CompressFn
from stello_graph.models import Compression

__all__ = [
    "DEFAULT_PROMPT_BUDGET",
    "CompressionPolicy",
    "estimate_tokens",
    "plan_cut",
    "prompt_tokens",
]

_PER_MESSAGE = 4  # role and framing tokens of one message, roughly

DEFAULT_PROMPT_BUDGET = 4096
"""Tokens a prompt is planned against when neither `CompressionPolicy.budget` nor the model's
context window is known (a model without a profile, such as a local server's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressionPolicy:
    """When and how a session's prompt is compressed.

    Example:
        >>> policy = CompressionPolicy(budget=2048)  # every prompt within ~2,048 tokens
        >>> policy.limit(None)
        2048
        >>> CompressionPolicy().limit(None)  # no budget, no window known
        4096

    Attributes:
        context_window: the model's context window in tokens; `None` reads it from the
            model's profile (`model.profile["max_input_tokens"]`).
        budget: the most tokens a prompt should cost, whatever the window (like LangMem's
            `max_tokens`); `None`: the window alone. With both, the smaller one counts;
            with neither known, `DEFAULT_PROMPT_BUDGET`.
        threshold: the share of that limit (`limit`) a prompt may use before compression
            starts.
        keep_recent: the share of that budget kept verbatim as the most recent history
            (whole user turns: at least the newest one). A smaller share means smaller
            prompts on average and fewer, longer summarising calls.
        compress_fn: the summariser (`CompressFn`); `None` uses `llm_compressor` with the
            session's model.
        chars_per_token: the estimate used when the provider reported no usage.
    """

    context_window: int | None = None
    budget: int | None = None
    threshold: float = 0.8
    keep_recent: float = 0.35
    compress_fn: CompressFn | None = None
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        for name in ("context_window", "budget"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 16
            ):
                raise InvalidInputError(f"{name} must be an int >= 16 or None, got {value!r}.")
        for name in ("threshold", "keep_recent"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 1:
                raise InvalidInputError(f"{name} must be in (0, 1], got {value!r}.")
        if not isinstance(self.chars_per_token, int | float) or self.chars_per_token <= 0:
            raise InvalidInputError(f"chars_per_token must be > 0, got {self.chars_per_token!r}.")

    def window(self, model: Any) -> int | None:
        """The context window to plan for: the configured one, else the model's profile."""
        if self.context_window is not None:
            return self.context_window
        profile = getattr(model, "profile", None) or {}
        found = profile.get("max_input_tokens") if isinstance(profile, dict) else None
        return found if isinstance(found, int) and found > 0 else None

    def limit(self, model: Any) -> int:
        """The tokens a prompt is planned against: the smaller of `budget` and the window
        (`window`), or `DEFAULT_PROMPT_BUDGET` when neither is known."""
        known = [n for n in (self.budget, self.window(model)) if n is not None]
        return min(known) if known else DEFAULT_PROMPT_BUDGET


def estimate_tokens(messages: Sequence[BaseMessage], chars_per_token: float = 4.0) -> int:
    """A download-free estimate of the tokens of `messages`."""
    chars = 0
    for msg in messages:
        chars += len(message_text(msg.content))
        if isinstance(msg, AIMessage) and msg.tool_calls:
            chars += sum(len(str(call["args"])) + len(call["name"]) for call in msg.tool_calls)
    return int(chars / chars_per_token) + _PER_MESSAGE * len(messages)


def prompt_tokens(
    policy: CompressionPolicy,
    head: Sequence[BaseMessage],
    records: Sequence[BaseMessage],
    *,
    measured_from: int = 0,
) -> int:
    """Tokens of a prompt of `head` (system part) + `records`, from provider usage if any.

    The last reply that carries usage reported what its prompt cost; what was added after it
    is estimated. Without any usage, the whole prompt is estimated. Only replies from index
    `measured_from` on are asked: those before it measured a different prompt.
    """
    for i in range(len(records) - 1, max(measured_from, 0) - 1, -1):
        usage = getattr(records[i], "usage_metadata", None)
        if usage and usage.get("input_tokens"):
            after = estimate_tokens(records[i + 1 :], policy.chars_per_token)
            return int(usage["input_tokens"]) + int(usage.get("output_tokens", 0)) + after
    return estimate_tokens([*head, *records], policy.chars_per_token)


def plan_cut(
    policy: CompressionPolicy,
    window: int,
    head: Sequence[BaseMessage],
    records: Sequence[BaseMessage],
    current: Compression | None,
    *,
    measured_from: int = 0,
) -> int | None:
    """The new number of records a summary should cover, or `None` if the prompt fits.

    `records` is the whole L3; `current` the summary in use (covering `current.through`
    records). The returned cut is a user-turn boundary, beyond `current.through`, and keeps at
    least the newest user turn of the history verbatim. `measured_from`: how many records L3
    held when `current` was made; the usage figures of the replies among them measured the
    prompt before that cut, so the prompt is estimated instead.
    """
    through = current.through if current is not None else 0
    through = min(through, len(records))
    fresh = max(measured_from - through, 0)
    tokens = prompt_tokens(policy, head, records[through:], measured_from=fresh)
    if tokens <= policy.threshold * window:
        return None
    starts = [i for i in range(through + 1, len(records)) if isinstance(records[i], HumanMessage)]
    if not starts:
        return None
    budget = policy.keep_recent * policy.threshold * window
    for start in starts:  # the earliest boundary whose tail fits the budget
        if estimate_tokens(records[start:], policy.chars_per_token) <= budget:
            return start
    return starts[-1]  # only the newest user turn stays verbatim
