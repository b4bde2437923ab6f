"""The `stello-graph` command: a guided demo, a terminal chat, and views of a stored tree.

```text
stello-graph demo    [--db DB] [--model NAME]       the walkthrough (offline by default)
stello-graph chat    [--db DB] [--model NAME]       chat over a topology, with /commands
stello-graph tree    [--db DB] [--svg OUT]          print the tree; write its star map
stello-graph export  [--db DB] [--records]          the tree, sessions, L2 and synthesis as JSON
stello-graph inspect [--db DB] [--port N] [--write] the tree in a local web page
```

`DB` is a SQLite file or a `postgresql://` DSN (the `postgres` extra), for every command;
`--tree ID` (alias `--tree-id`) names the tree of it (default: `default`).

`main` is also callable from Python (`main(["tree", "--db", "ideas.db"])`): it returns the
exit code instead of exiting, and takes the streams, the environment and the chat model to
use, so a program can embed the command or drive it in its tests.
"""

from __future__ import annotations

from stello_graph.cli._main import main

__all__ = ["main"]
