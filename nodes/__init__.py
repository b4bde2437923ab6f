"""LangGraph nodes and routers of stello-graph (import as `stello_graph.nodes`)."""
