"""Which chat model a command uses, chosen without code: options and environment variables.

* `--model scripted` (or no model at all, for the demo): offline, no provider.
* `--model NAME` (or `STELLO_MODEL=NAME`) with `OPENAI_BASE_URL` (or `--base-url`): any
  OpenAI-compatible server — a local Ollama, vLLM or llama.cpp server, or a hosted one.
  `OPENAI_API_KEY` is sent when set (local servers accept any key).
* `--model NAME` with only `OPENAI_API_KEY`: OpenAI itself.
* `--model PROVIDER:MODEL` (`anthropic:claude-sonnet-4-5`, `openai:gpt-4o-mini`, ...): built
  by LangChain's `init_chat_model`, which reads the provider's own key from the environment
  (a provider LangChain does not know stays a server's model name, such as `llama3.2:1b`).

`langchain-openai` is imported only when a provider model is built, so commands that need no
model start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stello_graph.cli._common import CliError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = ["NOT_CONFIGURED", "SCRIPTED", "ProviderSettings", "build_chat_model"]

SCRIPTED = "scripted"
"""The model name of the offline, scripted model."""

LOCAL_API_KEY = "not-needed"
"""The key sent to a server at `OPENAI_BASE_URL` when `OPENAI_API_KEY` is not set (the same
as `stello_graph.providers.LOCAL_API_KEY`, kept here so the CLI starts without that module)."""

NOT_CONFIGURED = """\
no chat model configured. Choose one:
  a local OpenAI-compatible server (Ollama, vLLM, llama.cpp, ...):
    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 stello-graph chat --model llama3.2
  OpenAI:
    OPENAI_API_KEY=sk-... stello-graph chat --model gpt-4o-mini
  any provider LangChain knows, by name (its key in its own variable):
    ANTHROPIC_API_KEY=... stello-graph chat --model anthropic:claude-sonnet-4-5
  offline, with a scripted model that echoes you:
    stello-graph chat --model scripted
(`STELLO_MODEL=NAME` works like `--model NAME`.)"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProviderSettings:
    """What the command line and the environment say about the model.

    Attributes:
        model: the model name (`--model`, else `STELLO_MODEL`); `None` when not given.
        base_url: the server's OpenAI-compatible base URL (`--base-url`, else
            `OPENAI_BASE_URL`).
        api_key: `OPENAI_API_KEY`, if set.
    """

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, model: str | None = None, base_url: str | None = None
    ) -> ProviderSettings:
        """Options first, then the environment; empty values count as unset."""
        return cls(
            model=(model or env.get("STELLO_MODEL") or "").strip() or None,
            base_url=(base_url or env.get("OPENAI_BASE_URL") or "").strip() or None,
            api_key=env.get("OPENAI_API_KEY") or None,
        )

    @property
    def offline(self) -> bool:
        """Whether the scripted model was asked for by name."""
        return self.model == SCRIPTED

    @property
    def provider(self) -> str | None:
        """The provider a `provider:model` name names, when LangChain knows it."""
        from stello_graph._validate import model_provider

        return None if self.model is None else model_provider(self.model)

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages (never the key)."""
        if self.provider is not None:
            return f"{self.provider} (LangChain's init_chat_model)"
        return self.base_url or "OpenAI (api.openai.com)"


def build_chat_model(settings: ProviderSettings) -> BaseChatModel:
    """The chat model `settings` name: a `provider:model` name through LangChain's
    `init_chat_model`, any other through an OpenAI-compatible client.

    Raises:
        CliError: no model name, no endpoint to send it to, or a `provider:model` name that
            cannot be built (its integration package or key is missing).
    """
    if settings.model is None and (settings.base_url or settings.api_key):
        variable = "OPENAI_BASE_URL" if settings.base_url else "OPENAI_API_KEY"
        raise CliError(f"{variable} is set: name the model with --model NAME (or STELLO_MODEL).")
    if settings.model is None or settings.offline:
        raise CliError(NOT_CONFIGURED)
    if settings.provider is not None:
        from stello_graph._validate import check_chat_model
        from stello_graph.errors import StelloError

        try:
            built: BaseChatModel = check_chat_model(settings.model, "--model")
        except StelloError as exc:
            raise CliError(str(exc)) from None
        return built
    if settings.base_url is None and settings.api_key is None:
        raise CliError(
            f"--model {settings.model} needs a server: set OPENAI_BASE_URL (or --base-url) "
            "to an OpenAI-compatible endpoint, or OPENAI_API_KEY for OpenAI."
        )
    try:
        from stello_graph.providers import OpenAICompatibleChat
    except ImportError as exc:  # pragma: no cover - a dependency of stello-graph
        raise CliError(f"langchain-openai is needed for --model: {exc}") from exc
    from pydantic import SecretStr

    return OpenAICompatibleChat(
        model=settings.model,
        base_url=settings.base_url,
        api_key=SecretStr(settings.api_key or LOCAL_API_KEY),
        stream_usage=True,
        timeout=120,
        max_retries=1,
    )
