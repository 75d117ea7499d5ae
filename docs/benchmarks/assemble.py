"""Rebuild docs/BENCHMARKS.md from the per-suite sections, and check every figure the docs claim.

``python docs/benchmarks/assemble.py`` checks, then writes docs/BENCHMARKS.md; ``--check`` writes nothing and
also fails when docs/BENCHMARKS.md is not what the sections build (it is never edited by hand). On any problem
nothing is written and the script exits with status 1, one line per problem. Two checks:

**Sections.** Every section (each ``##``/``###`` heading of a ``docs/benchmarks/*.md`` file, up to the next
heading) cites at least one committed raw result (``results/<file>``, which must exist), or it carries a label
line that starts with one of ``LABELS``.

**Research log.** docs/research/*.md (the tuning trials, not assembled into docs/BENCHMARKS.md) is held to the
same rule: every section cites a committed raw result (``../benchmarks/results/<file>``, which must exist) or
carries a label line.

**No internal issue numbers.** README.md and every docs/**/*.md outside docs/research/ are for users, who cannot
see the project's issue tracker: no ``issue 24`` or ``issue #24`` in them (``internal_issue_refs``).

**Figures.** In README.md, docs/*.md (not docs/BENCHMARKS.md, which is built from the sections),
docs/benchmarks/*.md and docs/research/*.md (``doc_files``), every figure that claims a measurement is found in a
results file cited beside it, or carries a label. Code fences, inline code spans, link targets, HTML comments and
headings are never read for figures.

- *A figure* is a number (``1,028``, ``9.9``, ``0.44M``; a range ``9.0-11.9`` is two figures) followed by
  a ratio mark (``2.26x``, ``~5x``, ``0.50×``; not ``42x42`` nor ``40 × 16``), a rate (``/s`` after up to three
  words: ``255.8/s``, ``30 updates/s``, ``454 MB/s``), a time (``ns µs us ms s sec seconds min minutes h
  hours``), a size (``B bytes KiB MiB GiB TiB kB KB MB GB TB``) or ``%``. In a table that claims measurements
  (its header row says measured, median, mean or CI, or the paragraph right before it carries a label or cites
  a results file), every cell but the first column's is read, and a cell that is nothing but numbers
  (``1,028``, ``951-1,108``, ``432,911 / 452,176``) is a figure too; other tables (settings, options, limits)
  are not read.
- *Not a figure* (a setting, a limit, a test's input or arithmetic, not a measurement): ``95% CI``; a
  number right after ``x``, ``×``, ``=`` or ``/`` or right before ``x``/``=`` and a space; a time, size or
  % right after ``every``, ``after``, ``set``/``sets``, ``within``, ``up to``, ``at most``, ``at least``,
  ``no more than``, ``default``, ``timeout``, ``limit``, ``limited``, ``interval``, ``budget``, ``capped``,
  ``cap``, ``backoff`` (optionally followed by is/of/to/at and ``(``), or right after an inline code span and
  ``(`` (```max_message_mb` (256 MiB)``); a whole-number time right after ``for`` (``for 20 s``); a size
  right after ``a``/``an`` and at most one word (``a 4 GiB frame``, ``a real 10 MB body``); a whole power
  of two in binary units (``64 KiB``, ``16 MiB``). Numbers with no unit in prose are not read.
- *Cited beside it*: a path that ends in ``results/<file>`` (``results/x.json``, ``benchmarks/results/x.json``,
  ``docs/benchmarks/results/x.json``, in a link, a code span or plain text), anywhere in the figure's
  paragraph, list item or table (a table's caption paragraph included); when that block cites none, anywhere
  in its section (heading to next heading). Every cited file must exist.
- *Found in the file*: some number in one of the cited files (any number in the text: JSON values, numbers in
  strings, a log line) rounds to the figure at the figure's shown decimals: it lies within half a unit of the
  figure's last digit, so ``9.9 s`` takes 9.85 to 9.95 (``9.90957``), ``1,028`` takes 1027.5 to 1028.5,
  ``0.44M`` takes 435,000 to 445,000. Thousands separators are ignored. A time may also be held in seconds
  (``12 ms`` as 0.012), a % as a fraction (``37%`` as 0.37), a size in bytes (``7.5 GiB`` as 8.05e9; ``MB``
  as 10^6 or 2^20 bytes), and a ratio as its reciprocal (``1.64x fewer`` as 0.61). Small whole numbers are
  found in almost any file: the check is that a figure is there, not which key holds it.
- *A label* (case-insensitive) is one of ``LABEL``'s phrases: hand measurement(s)/hand-measured/measured by
  hand, raw result (was) not kept, not measured, not a measurement, estimate(s)/estimated, projection(s)/
  projected, computed (arithmetic from settings), and for a figure quoted from a paper or another project,
  public source, quoted from or published by. A label speaks for its own sentence; in a paragraph or list item's
  first sentence, for the whole block; in a table's row, for that row; in a table's caption, for the whole
  table; and a section's label line (a paragraph line starting with one of ``LABELS``), for its whole section.

A problem reads ``FILE:LINE: figure 'TEXT' cites no results file and carries no label`` (or ``is not in
results/x.json (the results file cited)``, or ``cites results/x.json, which does not exist,``).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from flywheel.generated import write_or_check

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
refuses a section that does neither, or that cites a results file that does not exist. It also reads README.md,
docs/*.md and every section: each figure that claims a measurement must be found in a results file cited beside
it, or carry a label (hand measurement, raw result not kept, estimate, projection, computed, public source).
The table after this header lists every section with its raw result or its labels.

Machine: this project's 2-core, 24 GiB, no-GPU kind. Unless a section says otherwise, the figures below were
taken while other jobs shared the machine, which depresses absolute rates; the side-by-side ratios are what
the goals are judged on.

**Two GPU sessions so far.** On 2026-11-25 an H200 and on 2026-11-27 an H100 were lent for 15 minutes each: the
learner's GPU path (bf16 autocast, TF32, cuDNN benchmark, `torch.compile`, CUDA graphs, copy-stream staging)
ran in `flywheel bench learner --opt device=cuda`, and the learner section's two GPU subsections give what they
measured. The rest of Flywheel (actors, replay, whole runs) has not run on a GPU machine.

Sections are kept in `docs/benchmarks/<suite>.md`; this file is rebuilt from them by
`python docs/benchmarks/assemble.py` and must not be edited by hand. Each suite opens with its current result;
the trials that chose the Mario recipe, in the order they ran, are in the research log
[research/mario-tuning.md](research/mario-tuning.md), held to the same checks.
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


# ---------------------------------------------------------------------------------------------------------------
# Figures in README.md and every doc (the rule is in the module docstring)
# ---------------------------------------------------------------------------------------------------------------

_NUMBER = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
TIMES = {"ns", "µs", "us", "ms", "s", "sec", "secs", "second", "seconds", "min", "mins", "minute", "minutes", "h",
         "hr", "hrs", "hour", "hours"}
SIZES = {"B", "bytes", "KiB", "MiB", "GiB", "TiB", "kB", "KB", "MB", "GB", "TB"}
BINARY = {"KiB", "MiB", "GiB", "TiB"}
# a figure: a number (thousands commas allowed, an optional k/M/G multiplier) and what makes it a measurement
FIGURE = re.compile(
    r"(?<![\w.,/#-])(?P<approx>[~≈]\s?)?(?P<num>" + _NUMBER + r")(?P<mult>[kMG](?![A-Za-z]))?"
    r"(?:(?P<ratio>[x×](?![\w.]))"                                      # 2.26x, ~5x, 0.50× (not 42x42, 0x6d, 40 × 16)
    r"|(?P<rate>(?:\s[A-Za-z][\w-]*){0,3}\s?/\s?s(?:ec)?\b)"            # 255.8/s, 30 updates/s, 125 agent steps/s
    r"|\s?(?P<unit>" + "|".join(sorted(TIMES | SIZES | {"%"}, key=len, reverse=True)) + r")(?![\w%]))"
    r"(?P<range>(?:\s?[-–]\s?" + _NUMBER + r")?)")                      # 9.0-11.9 s: both ends are figures
# what makes a time, size or % figure a setting rather than a measurement: the words right before it
SETTING_BEFORE = re.compile(
    r"(?:(?:\bevery|\bafter|\bsets?|\bwithin|\bup\s+to|\bat\s+most|\bat\s+least|\bno\s+more\s+than|\bdefaults?"
    r"|\btimeout|\blimit|\blimited|\binterval|\bbudget|\bcapped|\bcaps?|\bbackoff)(?:\s+(?:is|of|to|at))?:?\s*[(~≈]?"
    r"|`\s*\(\s*[~≈]?)\s*$", re.IGNORECASE)
FOR_BEFORE = re.compile(r"\bfor\s*$", re.IGNORECASE)
ARTICLE_BEFORE = re.compile(r"\ban?(?:\s+[a-z]+)?\s*$", re.IGNORECASE)
ARITHMETIC_BEFORE = re.compile(r"[x×=/]\s*[~≈]?\s*$")
NOT_FIGURE_AFTER = re.compile(r"\s*(?:CI\b|confidence\b|[x×=]\s)", re.IGNORECASE)
# a table cell that is nothing but figures: 1,028 | 951-1,108 | 0.84 | 432,911 / 452,176 | 2,000 each | 0.44M
NUMERIC_CELL = re.compile(r"^[~≈]?\s?" + _NUMBER + r"(?:\s?(?:[-–/]|to)\s?[~≈]?" + _NUMBER + r")*(?:\s?\w{0,6})?$")
MEASURED_TABLE = re.compile(r"measur|median|\bmeans?\b|\bCI\b", re.IGNORECASE)
LABEL = re.compile(
    r"hand[- ]measure(?:ment|ments|d)|measured by hand|raw results? (?:(?:was|were) )?not kept|not measured"
    r"|not a measurement|\bestimates?\b|\bestimated\b|\bprojections?\b|\bprojected\b|\bcomputed\b"
    r"|public source|quoted from|\bpublished by\b", re.IGNORECASE)
# a committed raw result named anywhere: results/..., benchmarks/results/..., docs/benchmarks/results/...
CITE_ANY = re.compile(r"(?<![\w./-])(?:\.\./)*(?:docs/)?(?:benchmarks/)?results/[\w./-]*\w")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
HTML_COMMENT = re.compile(r"<!--.*?-->")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bcf)[.!?;](?=\s+[A-Z(*\[])")
NUMBER_IN_FILE = re.compile(r"(?:(?<![\w.])-)?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")  # "8.3-13.4" is 8.3 and 13.4
SCALES = {"ns": (1e-9,), "µs": (1e-6,), "us": (1e-6,), "ms": (1e-3,), "min": (60.0,), "mins": (60.0,),
          "minute": (60.0,), "minutes": (60.0,), "h": (3600.0,), "hr": (3600.0,), "hrs": (3600.0,),
          "hour": (3600.0,), "hours": (3600.0,), "%": (0.01,), "KiB": (2.0**10,), "MiB": (2.0**20,),
          "GiB": (2.0**30,), "TiB": (2.0**40,), "kB": (1e3,), "KB": (1e3, 2.0**10), "MB": (1e6, 2.0**20),
          "GB": (1e9, 2.0**30), "TB": (1e12, 2.0**40)}
MULTIPLIERS = {"k": 1e3, "M": 1e6, "G": 1e9}
RECIPROCAL = -1.0  # a scale that stands for 1 / x: a ratio may be kept either way round


@dataclass
class Figure:
    """One figure of a doc that claims a measurement: where it is, and what vouches for it."""

    path: Path
    line: int
    text: str
    values: list[tuple[float, float]]  # (value, half a unit of its last shown digit), one per number shown
    scales: tuple[float, ...]           # what a raw result may hold instead: the value times each of these
    labelled: bool
    cites: list[str]


def doc_files(root: Path) -> list[Path]:
    """The files whose figures are checked: README.md, docs/*.md, the sections in docs/benchmarks/*.md and the
    research log, docs/research/*.md.

    docs/BENCHMARKS.md is left out: it is built from the sections, which are checked themselves."""
    docs = root / "docs"
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    found += sorted(p for p in docs.glob("*.md") if p.name != "BENCHMARKS.md")
    return found + suite_files(docs / "benchmarks") + research_files(root)


def research_files(root: Path) -> list[Path]:
    """The research log: docs/research/*.md."""
    return sorted((root / "docs" / "research").glob("*.md"))


def check_research(root: Path) -> list[str]:
    """check() for the research log: each section cites a raw result that exists (any path ending in
    results/<file>, resolved in docs/benchmarks/results) or carries a label line."""
    results = root / "docs" / "benchmarks"
    problems = []
    for path in research_files(root):
        for s in sections(path):
            where = f"{path.parent.name}/{path.name}, section '{s.title}'"
            cites = _cites(s.body)
            problems += [f"{where}: cites {c}, but there is no such file ({results / c})"
                         for c in cites if not (results / c).is_file()]
            if not cites and not s.labels:
                problems.append(f"{where}: cites no results/ file and has no label line")
    return problems


# "issue 24", "Issue #24", "issues 8": the project's own tracker, which a user cannot see
ISSUE_REF = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def user_doc_files(root: Path) -> list[Path]:
    """README.md and every markdown file under docs/ but docs/research/ (raw results are data, not docs)."""
    docs = root / "docs"
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted(p for p in docs.rglob("*.md")
                          if p.relative_to(docs).parts[0] != "research" and "results" not in p.relative_to(docs).parts)


def internal_issue_refs(root: Path) -> list[str]:
    """One line per mention of an internal issue number in a user-facing doc (the research log may name them)."""
    problems = []
    for path in user_doc_files(root):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            problems += [f"{path.relative_to(root)}:{number}: '{m.group(0)}' names an internal issue; say what "
                         "it asked instead (docs/research/ may name issues)" for m in ISSUE_REF.finditer(line)]
    return problems


def _values(text: str, mult: str | None = None) -> list[tuple[float, float]]:
    found = []
    for number, own in re.findall("(" + _NUMBER + r")([kMG](?![A-Za-z]))?", text):
        digits = number.replace(",", "")
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        factor = MULTIPLIERS.get(own or mult or "", 1.0)
        found.append((float(digits) * factor, 0.5 * 10.0**-decimals * factor))
    return found


def _power_of_two(number: str) -> bool:
    return number.isdigit() and int(number) > 0 and int(number) & (int(number) - 1) == 0


def _blank_code(line: str) -> str:
    """The line with code spans (kept as `___`), link targets and HTML comments blanked; columns stay put."""
    line = CODE_SPAN.sub(lambda m: "`" + "_" * (len(m.group(0)) - 2) + "`", line)
    for pattern in (LINK_TARGET, HTML_COMMENT):
        line = pattern.sub(lambda m: " " * len(m.group(0)), line)
    return line


def _cites(text: str) -> list[str]:
    return list(dict.fromkeys("results/" + c.split("results/", 1)[1] for c in CITE_ANY.findall(text)))


def _blocks(lines: list[str]) -> list[tuple[str, list[int]]]:
    """(kind, line numbers) of each heading, paragraph, list item and table, outside code fences."""
    blocks: list[tuple[str, list[int]]] = []
    current: list[int] = []
    kind, fenced = "", False

    def close() -> None:
        if current:
            blocks.append((kind, current.copy()))
        current.clear()

    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif not line.strip():
            close()
        elif HEADING.match(line):
            close()
            blocks.append(("heading", [number]))
        elif line.strip().startswith("|"):
            if kind != "table":
                close()
            kind = "table"
            current.append(number)
        elif LIST_ITEM.match(line) or kind == "table":
            close()
            kind = "item" if LIST_ITEM.match(line) else "paragraph"
            current.append(number)
        else:
            kind = kind if current else "paragraph"
            current.append(number)
    close()
    return blocks


def _figures_in(path: Path, line: int, text: str, labelled: bool, cites: list[str]) -> list[Figure]:
    out = []
    for match in FIGURE.finditer(text):
        before, unit, number = text[:match.start()], match.group("unit") or "", match.group("num")
        if (ARITHMETIC_BEFORE.search(before) or NOT_FIGURE_AFTER.match(text, match.end())
                or (unit and SETTING_BEFORE.search(before))
                or (unit in SIZES and ARTICLE_BEFORE.search(before))
                or (unit in BINARY and _power_of_two(number))
                or (unit in TIMES and number.replace(",", "").isdigit() and FOR_BEFORE.search(before))):
            continue
        scales = (1.0, RECIPROCAL) if match.group("ratio") else (1.0,) + SCALES.get(unit, ())
        out.append(Figure(path, line + before.count("\n"), " ".join(match.group(0).split()),
                          _values(number + match.group("range"), match.group("mult")), scales, labelled, cites))
    return out


def figures(path: Path) -> list[Figure]:
    """Every figure of one markdown file that claims a measurement, with the labels and citations around it."""
    lines = path.read_text().splitlines()
    found: list[Figure] = []
    section: list[Figure] = []
    section_cites: list[str] = []
    section_labelled = False
    caption = ""  # the block right before this one: a table's caption

    def end_section() -> None:
        for figure in section:
            figure.cites = figure.cites or list(dict.fromkeys(section_cites))  # its block's, else its section's
            figure.labelled = figure.labelled or section_labelled
        found.extend(section)
        section.clear()

    for kind, numbers in _blocks(lines):
        raw = "\n".join(lines[n - 1] for n in numbers)
        if kind == "heading":
            end_section()
            section_cites, section_labelled, caption = [], False, ""
            continue
        section_cites += _cites(raw)
        section_labelled = section_labelled or (kind == "paragraph" and any(
            lines[n - 1].strip().startswith(LABELS) for n in numbers))
        if kind == "table":
            cites = _cites(raw) + _cites(caption)
            caption_labelled = bool(LABEL.search(caption))
            if MEASURED_TABLE.search(_blank_code(lines[numbers[0] - 1])) or caption_labelled or _cites(caption):
                header = True
                for n in numbers:
                    cells = [c.strip() for c in _blank_code(lines[n - 1]).strip().strip("|").split("|")]
                    if all(re.fullmatch(r":?-+:?|", c) for c in cells):
                        header = False
                        continue
                    labelled = caption_labelled or bool(LABEL.search(lines[n - 1]))
                    for cell in [] if header else cells[1:]:
                        if NUMERIC_CELL.match(cell) and not FIGURE.search(cell):
                            section.append(Figure(path, n, cell, _values(cell), (1.0,), labelled, cites))
                        section += _figures_in(path, n, cell, labelled, cites)
        else:
            text = "\n".join(_blank_code(lines[n - 1]) for n in numbers)
            starts = [0] + [m.end() for m in SENTENCE_END.finditer(text)]
            ends = starts[1:] + [len(text)]
            lead = bool(LABEL.search(text[:ends[0]]))  # a label in the first sentence speaks for the block
            for start, end in zip(starts, ends, strict=True):
                section += _figures_in(path, numbers[0] + text[:start].count("\n"), text[start:end],
                                       lead or bool(LABEL.search(text[start:end])), _cites(raw))
        caption = raw
    end_section()
    return found


def _held(value: float, half: float, scales: tuple[float, ...], numbers: list[float]) -> bool:
    """Whether a number of a raw result rounds to the shown value (times one of the scales)."""
    for scale in scales:
        if scale == RECIPROCAL:
            if any(x > 0 and value - half <= 1.0 / x <= value + half for x in numbers):
                return True
        elif any((value - half) * scale * (1 - 1e-12) <= x <= (value + half) * scale * (1 + 1e-12) for x in numbers):
            return True
    return False


def check_figures(paths: list[Path], results: Path, root: Path | None = None) -> list[str]:
    """One line per figure that carries no label and is not found in a results file cited beside it.

    results is the folder that holds the raw results (docs/benchmarks/results); root, if given, is what the
    file names in the messages are relative to."""
    problems = []
    cache: dict[str, list[float] | None] = {}
    for path in paths:
        shown = path.relative_to(root) if root else path
        for figure in figures(path):
            if figure.labelled:
                continue
            for cite in figure.cites:
                if cite not in cache:
                    file = results.parent / cite
                    cache[cite] = ([float(x) for x in NUMBER_IN_FILE.findall(file.read_text(errors="replace"))]
                                   if file.is_file() else None)
            missing = [c for c in figure.cites if cache[c] is None]
            numbers = [x for c in figure.cites for x in cache[c] or []]
            if figure.cites and all(_held(v, h, figure.scales, numbers) for v, h in figure.values):
                continue
            if missing:
                why = f"cites {', '.join(missing)}, which does not exist,"
            elif figure.cites:
                why = f"is not in {', '.join(figure.cites)} (the results file{'s' * (len(figure.cites) > 1)} cited)"
            else:
                why = "cites no results file"
            problems.append(f"{shown}:{figure.line}: figure '{figure.text}' {why} and carries no label")
    return problems


def check_docs(root: Path = HERE.parent.parent) -> list[str]:
    """check_figures over doc_files(root), against root/docs/benchmarks/results."""
    return check_figures(doc_files(root), root / "docs" / "benchmarks" / "results", root)


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
    if args.dir.resolve() == HERE.resolve():  # this repository: README.md, docs/*.md, the sections, the log
        root = HERE.parent.parent
        problems += check_research(root) + internal_issue_refs(root)
        problems += check_figures(doc_files(root), args.dir / "results", root)
    else:  # another folder of sections: those alone
        problems += check_figures(suite_files(args.dir), args.dir / "results", args.dir.parent)
    for problem in problems:
        print(f"assemble.py: {problem}", file=sys.stderr)
    if problems:
        return 1
    return write_or_check(out, build(args.dir), check=args.check, regenerate="python docs/benchmarks/assemble.py")


if __name__ == "__main__":
    sys.exit(main())
