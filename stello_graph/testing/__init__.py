"""Test helpers for applications built on stello-graph (and for stello-graph's own tests).

* `ScriptedChatModel` - a real LangChain chat model that replies from a script: tool calls,
  token streaming, usage, callbacks, and a record of every prompt it received.
* `FakeOpenAI` (in `stello_graph.testing.openai_server`) - a scripted OpenAI-compatible HTTP
  server on 127.0.0.1, to drive `ChatOpenAI` (or any OpenAI client) over real HTTP offline.

Neither talks to a real provider.
"""

from stello_graph.testing._scripted import (
    Responder,
    ScriptedCall,
    ScriptedChatModel,
    ScriptedReply,
    ScriptExhaustedError,
)
from stello_graph.testing.openai_server import FakeOpenAI

__all__ = [
    # a scripted chat model
    "ScriptedChatModel",
    "ScriptedCall",
    "ScriptedReply",
    "Responder",
    "ScriptExhaustedError",
    # a scripted OpenAI-compatible server
    "FakeOpenAI",
]
