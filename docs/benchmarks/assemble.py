"""Rebuild docs/BENCHMARKS.md from the per-suite sections: ``python docs/benchmarks/assemble.py``.

Every section (each ``##``/``###`` heading of a ``docs/benchmarks/*.md`` file, up to the next heading) must say
where its figures come from: it cites at least one committed raw result (``results/<file>``, which must exist),
or it carries a label line that starts with one of ``LABELS``. Otherwise nothing is written and the script exits
with status 1, one line per problem. ``--check`` writes nothing and also fails when docs/BENCHMARKS.md is not
what the sections build (it is never edited by hand).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["replay", "actor", "learner", "sb3", "origins", "scaling", "mario", "demos", "reliability"]
LABELS = ("Raw result not kept", "Hand measurement", "Not measured")
# results/<path> not preceded by a word character, '/', '.' or '-' (so not bench-results/ or docs/.../results/)
CITE = re.compile(r"(?<![\w./-])results/[\w./-]*\w")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HEADER = """# Benchmarks

Most figures here come from `flywheel bench <suite>` (`make bench SUITE=<suite>` installs the peers first:
stable-baselines3, cpprb, matplotlib; DeepMind Reverb runs from its own venv, see the replay section).
Each suite runs Flywheel and its peer side by side in one run, repeats, and reports medians and ratios
(Flywheel ÷ peer, above 1 meaning Flywheel is ahead); results land in `bench-results/<suite>.{json,md,png}`,
which is not committed.

**Where each figure comes from.** COMMITTED They are the files in
`docs/benchmarks/results/`, each written by the command its section names. Every other section says so in a
line of its own: **Raw result not kept** (a bench run from before raw results were committed; its figures were
copied from that run's report, and the line gives the command that reruns it), **Hand measurement** (no
command produces it; the line says how it was taken), or **Not measured**. `python docs/benchmarks/assemble.py`
refuses a section that does neither, or that cites a results file that does not exist. The table after this
header lists every section with its raw result or its labels.

Machine: this project's 2-core, 24 GiB, no-GPU kind. Unless a section says otherwise, the figures below were
taken while other jobs shared the machine, which depresses absolute rates; the side-by-side ratios are what
the goals are judged on.

**No GPU has been lent to this project yet.** Every GPU path of the learner (bf16 autocast, TF32, cuDNN
benchmark, `torch.compile` on a GPU, CUDA graphs, copy-stream staging into pinned buffers) is untested on a
GPU: only unit tests on a CPU exercise it, and there its CUDA-only parts do not run. `torch.compile` with
inductor on a CPU has run (the pixel preset, and a test that checks it against eager). The GPU learner goal is
ready to run with `flywheel bench learner --opt device=cuda` and has not been measured.

Sections are kept in `docs/benchmarks/<suite>.md`; this file is rebuilt from them by
`python docs/benchmarks/assemble.py` and must not be edited by hand.
"""


@dataclass
class Section:
    """One heading of a suite file and the lines up to the next heading."""

    file: Path
    title: str
    body: str

    @property
    def cites(self) -> list[str]:
        return list(dict.fromkeys(CITE.findall(self.body)))

    @property
    def labels(self) -> list[str]:
        lines = [line.strip() for line in self.body.splitlines()]
        return [label for label in LABELS if any(line.startswith(label) for line in lines)]


def suite_files(directory: Path) -> list[Path]:
    names = sorted(p.stem for p in directory.glob("*.md"))
    return [directory / f"{n}.md" for n in [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]]


def sections(path: Path) -> list[Section]:
    """Split a suite file at its headings (outside code fences); text before the first heading is its own."""
    found: list[Section] = []
    title, body, fenced = "(before the first heading)", [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            if title != "(before the first heading)" or "".join(body).strip():
                found.append(Section(path, title, "\n".join(body)))
            title, body = match.group(2), []
        else:
            body.append(line)
    if title != "(before the first heading)" or "".join(body).strip():
        found.append(Section(path, title, "\n".join(body)))
    return found


def check(directory: Path = HERE) -> list[str]:
    """One line per section that cites a missing results file or says nowhere where its figures come from."""
    problems = []
    for path in suite_files(directory):
        for s in sections(path):
            where = f"{path.parent.name}/{path.name}, section '{s.title}'"
            problems += [f"{where}: cites {c}, but there is no such file ({directory / c})"
                         for c in s.cites if not (directory / c).is_file()]
            if not s.cites and not s.labels:
                problems.append(f"{where}: cites no results/ file and has no label line (a line starting with "
                                + ", ".join(f"'{label}'" for label in LABELS[:-1]) + f" or '{LABELS[-1]}')")
    return problems


def committed(directory: Path) -> str:
    """The header's sentence naming the suites whose sections cite committed raw results."""
    suites = [p.stem for p in suite_files(directory) if any(s.cites for s in sections(p))]
    if not suites:
        return "No section has a committed raw result yet."
    names = [f"**{s}**" for s in suites]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return (f"Committed raw results back some sections of the {listed} suite{'s' if len(names) > 1 else ''}, "
            "and no section of any other suite.")


def provenance(directory: Path) -> str:
    """The table of where each section's figures come from, built from the sections themselves."""
    rows = ["| suite | section | committed raw result | labelled |", "|---|---|---|---|"]
    for path in suite_files(directory):
        for s in sections(path):
            cited = ", ".join(f"[{c}](benchmarks/{c})" for c in s.cites) or "–"
            title = s.title.replace("|", "\\|")
            rows.append(f"| {path.stem} | {title} | {cited} | {'; '.join(s.labels) or '–'} |")
    return "\n".join(rows) + "\n"


def build(directory: Path = HERE) -> str:
    """The text of docs/BENCHMARKS.md; writes nothing."""
    parts = [HEADER.replace("COMMITTED", committed(directory)), provenance(directory)]
    for path in suite_files(directory):
        parts.append(path.read_text().replace("](", "](benchmarks/").replace("](benchmarks/http", "](http"))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the sections' folder (default: this one)")
    parser.add_argument("--out", type=Path, help="the assembled file (default: BENCHMARKS.md beside --dir)")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if --out is out of date")
    args = parser.parse_args(argv)
    out = args.out or args.dir.parent / "BENCHMARKS.md"
    problems = check(args.dir)
    for problem in problems:
        print(f"assemble.py: {problem}", file=sys.stderr)
    if problems:
        return 1
    text = build(args.dir)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"assemble.py: {out} is not what the sections build: run python docs/benchmarks/assemble.py",
                  file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
