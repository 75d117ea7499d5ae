"""Rebuild docs/BENCHMARKS.md from the per-suite sections: ``python docs/benchmarks/assemble.py``."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["replay", "actor", "learner", "sb3", "origins", "scaling", "mario", "demos", "reliability"]
HEADER = """# Benchmarks

Every figure here comes from `flywheel bench <suite>` (`make bench SUITE=<suite>` installs the peers first:
stable-baselines3, cpprb, matplotlib; DeepMind Reverb runs from its own venv, see the replay section).
Each suite runs Flywheel and its peer side by side in one run, repeats, and reports medians and ratios
(Flywheel ÷ peer, above 1 meaning Flywheel is ahead); results land in `bench-results/<suite>.{json,md,png}`.

Machine: this project's 2-core, 24 GiB, no-GPU kind. Unless a section says otherwise, the figures below were
taken while other jobs shared the machine, which depresses absolute rates; the side-by-side ratios are what
the goals are judged on. No GPU was lent to the session that ran them: the GPU learner goal is ready to run
with `flywheel bench learner --opt device=cuda` and has not been measured yet.

Sections are kept in `docs/benchmarks/<suite>.md`; this file is rebuilt from them by
`python docs/benchmarks/assemble.py`.
"""


def main() -> None:
    names = sorted(p.stem for p in HERE.glob("*.md"))
    ordered = [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]
    parts = [HEADER]
    for name in ordered:
        text = (HERE / f"{name}.md").read_text()
        parts.append(text.replace("](", "](benchmarks/").replace("](benchmarks/http", "](http"))
    (HERE.parent / "BENCHMARKS.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
