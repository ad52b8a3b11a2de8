"""The course's prose against its recordings: every measured-looking number is accounted for.

A *place* is a notebook (by its stem; ``solutions/<stem>`` for a worked solution), the
``README`` or a page of ``docs/`` (``docs/<stem>``); its prose is the notebook's markdown
cells (or the page), without code (fenced blocks and inline code spans). The claims of a
place are ``notebooks/data/claims/<place>.toml``::

    [[claim]]                      # a number read from a recording
    quote = "0.89 of the ceiling"  # as it stands in the prose (whitespace may differ)
    quantities = ["bench.horovod-x2.vs_ceiling"]   # one ddlkit.recorded name per number
    # tolerance = 0.01             # optional; else the quote's own precision

    [[unrecorded]]                 # a number with a measurement unit from elsewhere
    quote = "25 Gbit/s"
    why = "published: Sergeev & Del Balso 2018, section 5"

Rules (tests/notebooks/test_claims.py): every quote stands in its place; a claim's numbers
equal their quantities at the precision they are written with (``0.89`` is 0.885 to 0.895,
``8,986`` is 8,985.5 to 8,986.5, ``89%`` is 0.885 to 0.895 of a ratio); every number the
prose writes with a unit of measurement (examples/s, ms, GB/s, %, ...), and every table cell
that is a bare number, stands inside a claim's or an unrecorded quote; and no lesson (a
notebook) names a date, a time or an issue number.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CLAIMS = NOTEBOOKS / "data" / "claims"

NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")
# a number followed by a unit of something measured (on this machine or elsewhere)
# ("28×28" and "3 × 3 × 32" are shapes, not factors; "within 10%" is how a lesson says a
# live result in words)
MEASURED = re.compile(
    r"(?<!within )(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s*"
    r"(examples/s|ex/s|images/s|steps/s|ms\b|µs|us\b|GB/s|MB/s|Gbit/s|Gb/s|TFLOP/s|%|x\b(?!\s*\d)|×(?!\s*\d))"
)
# a table cell that is a bare number (tables hold the figures prose would otherwise quote)
CELL = re.compile(r"(?<=\| )[-+]?\d[\d,]*(?:\.\d+)?(?: / [-+]?\d[\d,]*(?:\.\d+)?)*(?= \|)")
DATED = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d UTC\b|\bissue \d+\b|recording before|last stop"
    r"|\bearlier recording|\bprevious recording",
    re.I,
)


def prose_of(place: str) -> str:
    """The place's prose: markdown without fenced code or inline code spans."""
    if place == "README" or place.startswith("docs/"):
        text = (ROOT / f"{place}.md").read_text()
    else:
        nb = json.loads((NOTEBOOKS / f"{place}.ipynb").read_text())
        text = "\n\n".join(
            "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"
        )
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", " ", text)


def squash(text: str) -> str:
    """Whitespace runs as one space (prose wraps where a quote does not)."""
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class Claim:
    place: str
    quote: str
    quantities: tuple[str, ...]
    tolerance: float | None = None


@dataclass(frozen=True)
class Unrecorded:
    place: str
    quote: str
    why: str


def places() -> list[str]:
    """Every notebook by its stem (``solutions/<stem>`` for a worked solution), README and
    every page of ``docs/`` (``docs/<stem>``)."""
    stems = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    solutions = sorted(f"solutions/{p.stem}" for p in (NOTEBOOKS / "solutions").glob("*.ipynb"))
    pages = sorted(f"docs/{p.stem}" for p in (ROOT / "docs").glob("*.md"))
    return [*stems, *solutions, "README", *pages]


def is_lesson(place: str) -> bool:
    """Whether the place is a notebook (a lesson or a worked solution)."""
    return place != "README" and not place.startswith("docs/")


def load(place: str) -> tuple[list[Claim], list[Unrecorded]]:
    path = CLAIMS / f"{place}.toml"
    if not path.exists():
        return [], []
    doc = tomllib.loads(path.read_text())
    unknown = set(doc) - {"claim", "unrecorded"}
    if unknown:
        raise ValueError(
            f"{path}: unknown tables {sorted(unknown)}; use [[claim]] or [[unrecorded]]"
        )
    claims = [
        Claim(place, squash(c["quote"]), tuple(c["quantities"]), c.get("tolerance"))
        for c in doc.get("claim", [])
    ]
    other = [Unrecorded(place, squash(u["quote"]), u["why"]) for u in doc.get("unrecorded", [])]
    return claims, other


def numbers(quote: str) -> list[tuple[float, float, bool]]:
    """Each number in a quote: (value, half a unit of its last digit, written as a percent)."""
    out = []
    for m in NUMBER.finditer(quote):
        raw = m.group().replace(",", "")
        decimals = len(raw.split(".")[1]) if "." in raw else 0
        percent = quote[m.end() : m.end() + 2].lstrip().startswith("%")
        out.append((float(raw), 0.5 * 10.0**-decimals, percent))
    return out


def mismatch(claim: Claim, values: dict[str, float]) -> str | None:
    """Why the claim's numbers are not its quantities' values, or None when they are."""
    found = numbers(claim.quote)
    if len(found) != len(claim.quantities):
        return (
            f"{claim.place}: {claim.quote!r} has {len(found)} numbers for "
            f"{len(claim.quantities)} quantities {list(claim.quantities)}"
        )
    for (number, half, percent), name in zip(found, claim.quantities, strict=True):
        if name not in values:
            return f"{claim.place}: {claim.quote!r} names {name!r}, which no recorded file holds"
        value = values[name] * (100.0 if percent else 1.0)
        tol = claim.tolerance * (100.0 if percent else 1.0) if claim.tolerance else half
        if abs(value - number) > tol * (1 + 1e-9):
            return (
                f"{claim.place}: {claim.quote!r} says {number:g} for {name}, "
                f"but its file holds {value:.6g} (allowed: +-{tol:g})"
            )
    return None


def unaccounted(place: str, quotes: list[str]) -> list[str]:
    """Measured-looking numbers of the place's prose outside every quote."""
    text = squash(prose_of(place))
    covered = [False] * len(text)
    for quote in quotes:
        start = text.find(quote)
        while start != -1:
            for i in range(start, start + len(quote)):
                covered[i] = True
            start = text.find(quote, start + 1)
    out = []
    hits = sorted([*MEASURED.finditer(text), *CELL.finditer(text)], key=lambda m: m.start())
    for m in hits:
        if not all(covered[m.start() : m.end()]):
            lo, hi = max(0, m.start() - 40), min(len(text), m.end() + 20)
            out.append(f"{place}: {m.group()!r} in '...{text[lo:hi]}...'")
    return out


# a citation of a source line: a link anchor (#L120), file:line (ops.cc:88) or "line 120"
LINE_CITED = re.compile(
    r"#L\d+|\.(?:py|pyx|cc|h|cpp|c|rst|md|txt|toml|go|java|scala):\d+|\blines? \d+", re.I
)


def line_citations(place: str) -> list[str]:
    """Source line numbers the place cites: the next release moves them (cite a file and a
    function, a docstring or a page instead). Markdown and code cells alike."""
    if not is_lesson(place):
        text = prose_of(place)
    else:
        nb = json.loads((NOTEBOOKS / f"{place}.ipynb").read_text())
        text = "\n".join("".join(c["source"]) for c in nb["cells"])
    return [
        f"{place}: {m.group()!r} in '...{text[max(0, m.start() - 50) : m.end() + 20]}...'"
        for m in LINE_CITED.finditer(text)
    ]


# How a lesson's first cell says its run time at default sizes, on 2 cores.
RUNTIME_FORM = "About N minutes on 2 cores (or: Under a minute on 2 cores)"
RUNTIME = re.compile(r"\b(Under a minute|About \d+ minutes?) on 2 cores\b")


def runtime_words(minutes: float) -> str:
    """How a run of ``minutes`` is said: "Under a minute", else "About N minute(s)" (rounded)."""
    if minutes < 1:
        return "Under a minute"
    whole = round(minutes)
    return f"About {whole} minute{'s' if whole != 1 else ''}"


def runtime_said(place: str) -> str | None:
    """What the lesson's first cell says of its run time, without "on 2 cores"; None if nothing."""
    nb = json.loads((NOTEBOOKS / f"{place}.ipynb").read_text())
    found = RUNTIME.search(squash("".join(nb["cells"][0]["source"])))
    return found.group(1) if found else None


def dated(place: str) -> list[str]:
    """Dates, times, issue numbers and history words in a notebook's prose."""
    text = squash(prose_of(place))
    return [
        f"{place}: {m.group()!r} in '...{text[max(0, m.start() - 40) : m.end() + 20]}...'"
        for m in DATED.finditer(text)
    ]
