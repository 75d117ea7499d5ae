"""The ``flywheel bench`` subcommand: find a suite in ``flywheel.bench.suites``, run it, write its results."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import shlex
import sys
from pathlib import Path

from flywheel.bench import suites
from flywheel.bench.runner import BenchContext, BenchError, write_results
from flywheel.testing.errors import HarnessError


def suite_names() -> list[str]:
    """Every suite module under ``flywheel/bench/suites``."""
    return sorted(m.name for m in pkgutil.iter_modules(suites.__path__) if not m.name.startswith("_"))


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", help="suite to run, or 'list' to show them")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per case (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="discarded warm-up runs per case")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for JSON, Markdown, PNG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--opt", action="append", default=[], metavar="NAME=VALUE",
                        help="suite-specific option (repeatable)")


def run_bench(args: argparse.Namespace) -> int:
    names = suite_names()
    options: dict[str, str] = {}
    for item in args.opt:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"error: --opt expects NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        if name in options:  # a second value would silently replace the first (e.g. two --opt set=)
            print(f"error: --opt {name} given twice ({options[name]!r}, {value!r}); give it once "
                  "(set takes ';'-separated overrides)", file=sys.stderr)
            return 2
        options[name] = value
    if args.suite == "list":
        for name in names:
            module = importlib.import_module(f"flywheel.bench.suites.{name}")
            print(f"{name:12s} {getattr(module, 'DESCRIPTION', '')}")
            for opt, text in getattr(module, "OPTIONS", {}).items():
                print(f"{'':14s}--opt {opt}=...  {text}")
        return 0
    if args.suite not in names:
        print(f"error: unknown bench suite {args.suite!r}; suites: {', '.join(names) or 'none'}", file=sys.stderr)
        return 2
    if args.runs < 1 or args.warmup < 0:
        print("error: --runs must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    ctx = BenchContext(suite=args.suite, runs=args.runs, warmup=args.warmup, quick=args.quick,
                       out_dir=args.out, seed=args.seed, options=options)
    module = importlib.import_module(f"flywheel.bench.suites.{args.suite}")
    known: dict[str, str] | None = getattr(module, "OPTIONS", None)  # a suite that declares them refuses typos
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if known is not None and unknown:
        print(f"error: suite {args.suite!r} has no option {', '.join(unknown)}; "
              f"options: {', '.join(known) or 'none'}", file=sys.stderr)
        return 2
    try:
        result = module.run(ctx)
    except (BenchError, HarnessError) as exc:
        print(f"error: flywheel bench {args.suite}: {exc}", file=sys.stderr)
        return 2
    command = "flywheel bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else \
        f"flywheel bench {args.suite}"
    json_path, md_path = write_results(result, ctx, command)
    print(md_path.read_text())
    print(f"results: {json_path} {md_path}", file=sys.stderr)
    return 0
