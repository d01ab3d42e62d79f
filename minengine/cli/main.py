"""The ``minengine`` command: one argparse subcommand per job (generate, serve, bench, kv, simulate),
each in its own module of ``minengine.cli``.

To add a subcommand, write ``add_<name>_parser(subparsers)`` that registers its flags and sets
``func`` (a function taking the parsed args and returning an exit code), then append it to SUBCOMMANDS.
Import heavy modules (torch, the engine) inside ``func``, not here, so ``minengine kv`` and
``minengine --help`` stay instant.

Bad arguments print one readable line and exit with code 2 (argparse's convention), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from minengine.cli.bench import add_bench_parser
from minengine.cli.generate import add_generate_parser
from minengine.cli.kv import add_kv_parser
from minengine.cli.serve import add_serve_parser
from minengine.cli.simulate import add_simulate_parser


class CLIError(Exception):
    """An argument error, already worded for the user."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and is raised so main() can return 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(f"{self.prog}: error: {message} (see --help)")


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_generate_parser, add_serve_parser, add_bench_parser, add_kv_parser, add_simulate_parser
]


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="minengine", description="minengine: a small, instrumented LLM inference "
                            "engine for learning how serving works.")
    from minengine import __version__

    parser.add_argument("--version", action="version", version=f"minengine {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as exc:
        print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
