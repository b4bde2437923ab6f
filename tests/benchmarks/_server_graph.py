"""The peer of figure 12: LangChain's `create_agent` with no tools, served by the same
`langgraph dev` as stello and calling the same OpenAI-compatible model server
(`STELLO_MODEL`, `OPENAI_BASE_URL` and `OPENAI_API_KEY` of the server's environment)."""

from __future__ import annotations

import os

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI

graph = create_agent(ChatOpenAI(model=os.environ["STELLO_MODEL"]), tools=[])
