"""The benchmark suite: stello-graph against a plain LangGraph agent, side by side.

Run it with `make bench` (or `python -m tests.benchmarks`); it is not part of `make test`,
which only runs it once at a tiny scale (`test_quick.py`) so the code does not rot. See
`BENCHMARKS.md` at the repository root for the figures, their targets and the method.
"""
