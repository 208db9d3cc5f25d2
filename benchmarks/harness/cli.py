"""The benchmark scripts' command line: one subcommand per benchmark, each with its own options."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from .timing import SETTLE_MS


@dataclass(frozen=True)
class Benchmark:
    """A subcommand. ``run(args)`` runs the benchmark; its docstring says what it measures (the subcommand's
    --help). ``options(parser)`` adds its options. ``writes``: the ``benchmark`` field of the results it writes, which
    picks their plot (``plotting.CHARTS``); ``run`` finds it in ``args.benchmark``."""

    run: Callable[[argparse.Namespace], None]
    options: Callable[[argparse.ArgumentParser], None] | None = None
    writes: str | None = None


class UsageError(ValueError):
    """Options that do not go together: reported as argparse reports a bad option (usage, exit status 2)."""


def main(doc: str, benchmarks: dict[str, Benchmark], argv: list[str] | None = None) -> None:
    """Parses ``argv`` (the script's arguments) as ``<benchmark> [options]`` and runs that benchmark."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    parsers = {}
    for name, bench in benchmarks.items():
        text = inspect.getdoc(bench.run) or ""
        summary = textwrap.shorten(" ".join(text.split("\n\n")[0].split()).split(". ")[0], 110, placeholder=" ...")
        parsers[name] = sub.add_parser(name, help=summary, description=text,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        if bench.options is not None:
            bench.options(parsers[name])
        parsers[name].set_defaults(benchmark=bench.writes)
    args = ap.parse_args(argv)
    try:
        benchmarks[args.command].run(args)
    except UsageError as e:
        parsers[args.command].error(str(e))


def add_cute_options(ap: argparse.ArgumentParser, activation: str) -> None:
    """The options the CuTe benchmarks share: batch, heads, activation (default ``activation``), settle time and output
    prefix."""
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--activation", default=activation)
    ap.add_argument("--settle-ms", type=float, default=SETTLE_MS, help="untimed run of each provider before its timing")
    ap.add_argument("--out", default=None, help="path prefix for the .json results and their .png plot")


def command_line() -> str:
    """This run's command, as the results record it: ``python3 benchmarks/<script> <arguments>``."""
    return " ".join(["python3", "benchmarks/" + os.path.basename(sys.argv[0]), *sys.argv[1:]])
