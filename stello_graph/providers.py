"""Chat models for OpenAI-compatible servers (a local llama.cpp, Ollama, vLLM, ...).

`ChatOpenAI` speaks to any server with OpenAI's chat API, but local servers differ from
OpenAI's own in small ways that break a stello turn. `OpenAICompatibleChat` adjusts the request
payload the way LangChain's own OpenAI-compatible integrations do:

* it sends `max_tokens`, not `max_completion_tokens` (which llama-cpp-python ignores, so a
  generation would run on until the context is full);
* it sends `""`, not `null`, as the content of an assistant message that carries tool calls
  (which llama-cpp-python rejects, so no tool round could continue).

Both are accepted by OpenAI itself. This module imports `langchain-openai`; it is loaded only
when used.

Example:
    >>> model = local_chat_model("http://127.0.0.1:8080/v1", "smollm2")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

__all__ = ["LOCAL_API_KEY", "OpenAICompatibleChat", "local_chat_model"]

LOCAL_API_KEY = "not-needed"
"""The key sent to a local server that asks for none (the client requires one)."""


class OpenAICompatibleChat(ChatOpenAI):
    """`ChatOpenAI` whose requests also suit OpenAI-compatible servers that differ from OpenAI."""

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


def local_chat_model(
    base_url: str, model: str, *, api_key: str | None = None, **options: Any
) -> OpenAICompatibleChat:
    """A chat model for the OpenAI-compatible server at `base_url`.

    Token usage is reported while streaming (`stream_usage=True`); `options` go to
    `ChatOpenAI` (e.g. `temperature`, `max_tokens`, `timeout`).
    """
    settings: dict[str, Any] = {"stream_usage": True, **options}
    return OpenAICompatibleChat(
        model=model, base_url=base_url, api_key=SecretStr(api_key or LOCAL_API_KEY), **settings
    )
