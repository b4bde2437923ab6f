"""`python -m stello_graph.cli`: the same as the `stello-graph` command."""

from __future__ import annotations

from stello_graph.cli import main

raise SystemExit(main())
