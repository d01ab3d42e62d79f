"""The ``minengine`` command: one argparse subcommand per job (generate, serve, bench, kv, simulate).

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

from minengine.bench.cli import add_bench_parser
from minengine.generate_cli import add_generate_parser
from minengine.server.cli import add_serve_parser
from minengine.sim.cli import add_simulate_parser


class CLIError(Exception):
    """An argument error, already worded for the user."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and is raised so main() can return 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(f"{self.prog}: error: {message} (see --help)")


def add_kv_parser(subparsers: argparse._SubParsersAction) -> None:
    from minengine import kvcalc_cli  # light: no torch

    parser = subparsers.add_parser(
        "kv", help="KV-cache size and capacity calculator",
        description="How much memory the KV cache takes, and how many sequences fit on a GPU. Example: "
                    "minengine kv --model llama-3.1-8b --context 8192 --batch 16 --gpu h100",
    )
    kvcalc_cli.add_arguments(parser)
    parser.set_defaults(func=kvcalc_cli.run)


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
