"""`ChatOpenAI` adjusted to llama-cpp-python's server, as LangChain's own OpenAI-compatible
integrations (`ChatDeepSeek`, ...) adjust it to theirs: by rewriting the request payload.

llama-cpp-python 0.3.x differs from OpenAI's API in two ways that matter here:

* it ignores `max_completion_tokens`, the name `ChatOpenAI` sends `max_tokens` under, so a
  generation would run on until the context is full;
* it rejects `"content": null` on an assistant message that carries tool calls, which is what
  `ChatOpenAI` sends back for such a message, so no tool round could ever continue.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_openai import ChatOpenAI

__all__ = ["LlamaCppChatOpenAI"]


class LlamaCppChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` for a llama-cpp-python server: `max_tokens` and tool-call history that work."""

    def _get_request_payload(
        self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "max_completion_tokens" in payload:
            payload["max_tokens"] = payload.pop("max_completion_tokens")
        for message in payload.get("messages", []):
            if message.get("role") == "assistant" and message.get("content") is None:
                message["content"] = ""
        return payload
