"""The command line: parse it, run the command, turn failures into messages and exit codes.

Exit codes: 0 done; 1 the command failed at run time (a model or storage error); 2 bad usage
or input (unknown option, a file that is not a stello-graph database or is damaged, no model
configured); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import TYPE_CHECKING, Any, TextIO

from stello_graph.cli._common import USAGE_ERROR, CliError, Console, open_storage
from stello_graph.cli._provider import ProviderSettings, build_chat_model
from stello_graph.errors import (
    DamagedDataError,
    ForeignDatabaseError,
    InvalidInputError,
    StelloError,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = ["build_parser", "main"]

DEMO_DB = "stello-demo.db"
CHAT_DB = "stello.db"

Runner = Callable[[argparse.Namespace, Console, Mapping[str, str], "BaseChatModel | None"], int]


def _version() -> str:
    from stello_graph import __version__

    return __version__


def _model_options(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="chat model (env STELLO_MODEL): a server's model name, 'provider:model' "
        f"(e.g. anthropic:claude-sonnet-4-5), or 'scripted' (offline). {default_help}",
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="OpenAI-compatible endpoint (env OPENAI_BASE_URL); key from OPENAI_API_KEY",
    )


def _db_options(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--db", metavar="DB", default=default,
        help=f"a SQLite file or a postgresql:// DSN (default: {default})",
    )  # fmt: skip
    parser.add_argument(
        "--tree", "--tree-id", dest="tree_id", metavar="ID", default="default",
        help="which tree of the database (default: default)",
    )  # fmt: skip


def _map_size(text: str) -> float:
    """`--size`: a number of pixels the star map can be drawn at."""
    from stello_graph.starmap import MAX_SIZE

    try:
        size = float(text)
    except ValueError:
        size = float("nan")
    if not 100 < size <= MAX_SIZE:  # NaN and infinities fail too
        raise argparse.ArgumentTypeError(
            f"must be a number of pixels above 100 and at most {MAX_SIZE}, got {text!r}"
        )
    return int(size) if size.is_integer() else size


def build_parser() -> argparse.ArgumentParser:
    """The `stello-graph` argument parser."""
    parser = argparse.ArgumentParser(
        prog="stello-graph",
        description="Session topology for LangGraph: a tree of focused conversations.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="a guided walkthrough (offline by default)")
    _db_options(demo, DEMO_DB)
    _model_options(demo, "Default: scripted.")
    demo.set_defaults(run=_run_demo)
    chat = commands.add_parser("chat", help="chat over a topology in the terminal")
    _db_options(chat, CHAT_DB)
    _model_options(chat, "Required.")
    chat.add_argument(
        "--manual", action="store_true", help="no background work: only /consolidate, /integrate"
    )
    chat.add_argument(
        "--allow-foreign-tables", action="store_true",
        help="add stello-graph's tables to a SQLite file that holds another application's",
    )  # fmt: skip
    chat.set_defaults(run=_run_chat)
    tree = commands.add_parser("tree", help="print a stored tree; write its star map (SVG)")
    _db_options(tree, CHAT_DB)
    tree.add_argument("--svg", metavar="OUT", help="write the star map to OUT ('-': stdout)")
    tree.add_argument(
        "--size", type=_map_size, default=640, help="star map size in pixels (101-20000)"
    )
    tree.set_defaults(run=_run_tree)
    export = commands.add_parser("export", help="print a stored tree as JSON")
    _db_options(export, CHAT_DB)
    export.add_argument("--records", action="store_true", help="include every L3 record")
    export.set_defaults(run=_run_export)
    _inspect_parser(commands)
    return parser


def _inspect_parser(commands: Any) -> None:
    from stello_graph.cli._serve import DEFAULT_PORT

    inspect = commands.add_parser(
        "inspect", help="browse a stored tree in a local web page (extra: inspector)"
    )
    _db_options(inspect, CHAT_DB)
    inspect.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    inspect.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: a free port"
    )
    inspect.add_argument(
        "--write", action="store_true",
        help="allow fork, consolidate, integrate, archive, insight and system prompt edits",
    )  # fmt: skip
    inspect.add_argument("--no-browser", action="store_true", help="do not open a browser")
    _model_options(inspect, "For --write; default: scripted.")
    inspect.set_defaults(run=_run_inspect)


# -- commands -------------------------------------------------------------------------------
def _run_tree(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    from stello_graph.cli._inspect import run_tree

    return run_tree(args, console)


def _run_export(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    from stello_graph.cli._inspect import run_export

    return run_export(args, console)


def _run_inspect(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    from stello_graph.cli._serve import run_inspect

    return run_inspect(args, console, env, model)


def _run_demo(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    settings = ProviderSettings.from_env(env, model=args.model, base_url=args.base_url)
    if model is None and settings.model is not None and not settings.offline:
        model = build_chat_model(settings)
    from stello_graph.cli import demo

    demo.run(console.stdout, args.db, model=model, tree_id=args.tree_id)
    return 0


def _run_chat(
    args: argparse.Namespace, console: Console, env: Mapping[str, str], model: BaseChatModel | None
) -> int:
    settings = ProviderSettings.from_env(env, model=args.model, base_url=args.base_url)
    consolidate_fn = integrate_fn = None
    if model is not None:
        name = str(getattr(model, "model_name", None) or getattr(model, "name", None) or "model")
    elif settings.offline:
        from stello_graph.cli._offline import echo_model, integrate, summarise

        model, name = echo_model(), "scripted (offline echo)"
        consolidate_fn, integrate_fn = summarise, integrate
    else:
        model = build_chat_model(settings)
        name = f"{settings.model} at {settings.endpoint}"
    storage, shown = open_storage(
        args.db, args.tree_id, create=True, allow_foreign_tables=args.allow_foreign_tables
    )
    from stello_graph.agent import StelloAgent
    from stello_graph.cli._chat import ChatRepl
    from stello_graph.schedule import Schedule

    schedule = None if args.manual else Schedule(
        consolidate_every_n_turns=5, consolidate_on_switch=True, integrate_after_consolidate=True
    )  # fmt: skip
    with storage:  # the agent does not close a storage it was given
        agent = StelloAgent(
            model=model,
            storage=storage,
            consolidate_fn=consolidate_fn,
            integrate_fn=integrate_fn,
            schedule=schedule,
        )
        console.say(console.dim(f"Database: {shown} (tree {args.tree_id!r})"))
        return ChatRepl(agent, console, model_name=name).run()


# -- entry point ----------------------------------------------------------------------------
def _parse(argv: Sequence[str] | None, console: Console) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code when argparse ended the run (help, errors)."""
    try:
        with redirect_stdout(console.stdout), redirect_stderr(console.stderr):
            return build_parser().parse_args(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else USAGE_ERROR


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    model: BaseChatModel | None = None,
) -> int:
    """Run `stello-graph` with `argv` (default: the process's arguments).

    Args:
        argv: the arguments, without the program name.
        stdin / stdout / stderr: the streams to use (default: the process's).
        env: the environment to read settings from (default: `os.environ`).
        model: the chat model for `chat` and `demo`, instead of the one the options and the
            environment name (for programs that embed the command, and for tests).

    Returns:
        The exit code.
    """
    env = os.environ if env is None else env
    console = Console.open(stdin, stdout, stderr, env)
    args = _parse(argv, console)
    if isinstance(args, int):
        return args
    run: Runner = args.run
    try:
        return run(args, console, env, model)
    except CliError as exc:
        console.error(str(exc))
        return exc.code
    except (InvalidInputError, ForeignDatabaseError, DamagedDataError) as exc:  # bad input
        console.error(str(exc))
        return USAGE_ERROR
    except StelloError as exc:
        console.error(f"{type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        console.error("interrupted.")
        return 130
