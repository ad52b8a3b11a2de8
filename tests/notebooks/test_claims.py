"""The course's prose against its recordings (tests/harness/claims.py says the rules)."""

from __future__ import annotations

import pytest
from harness import claims as cl

from ddlkit import recorded

PLACES = cl.places()


@pytest.fixture(scope="module")
def values() -> dict[str, float]:
    return {name: q.value for name, q in recorded.quantities().items()}


def test_every_claims_file_is_for_a_place():
    stems = {str(p.relative_to(cl.CLAIMS).with_suffix("")) for p in cl.CLAIMS.rglob("*.toml")}
    assert stems <= set(PLACES), f"claims for no notebook: {sorted(stems - set(PLACES))}"


@pytest.mark.parametrize("place", PLACES)
def test_recorded_numbers_in_prose_are_their_files(place, values):
    claims, other = cl.load(place)
    prose = cl.squash(cl.prose_of(place))
    missing = [q.quote for q in [*claims, *other] if q.quote not in prose]
    assert not missing, f"{place}: quotes not in its prose (edit the claim or the prose): {missing}"
    wrong = [m for c in claims if (m := cl.mismatch(c, values))]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("place", PLACES)
def test_every_measured_number_in_prose_is_accounted_for(place):
    claims, other = cl.load(place)
    loose = cl.unaccounted(place, [q.quote for q in [*claims, *other]])
    assert not loose, (
        "numbers with a unit of measurement that no claim covers: print them from a cell, "
        f"say them in words, or add a [[claim]] / [[unrecorded]] to {cl.CLAIMS}/{place}.toml:\n"
        + "\n".join(loose)
    )


@pytest.mark.parametrize("place", [p for p in PLACES if cl.is_lesson(p)])
def test_lessons_name_no_dates_times_or_issues(place):
    found = cl.dated(place)
    assert not found, "a lesson says what is true now:\n" + "\n".join(found)


LESSONS = [p for p in PLACES if cl.is_lesson(p) and not p.startswith("solutions/")]


@pytest.mark.parametrize("place", LESSONS)
def test_every_lesson_says_how_long_it_takes_as_recorded(place, values):
    """The first cell says how long the lesson takes at its default sizes, rounded to whole
    minutes, as benchmarks/time_notebooks.py recorded it (notebooks/data/notebook-times.json)."""
    said = cl.runtime_said(place)
    assert said is not None, f"{place}: the first cell does not say {cl.RUNTIME_FORM!r}"
    name = f"runtime.{place}.minutes"
    assert name in values, f"{place}: no recorded time. Fix: benchmarks/time_notebooks.py {place}"
    assert said == cl.runtime_words(values[name]), (
        f"{place} says {said!r}; the recording says {cl.runtime_words(values[name])!r}"
    )


@pytest.mark.parametrize("place", PLACES)
def test_sources_are_cited_by_file_and_function_not_line(place):
    found = cl.line_citations(place)
    assert not found, "cite a file and a function (or a page), never a line:\n" + "\n".join(found)


# -- the rules themselves, on made-up prose ------------------------------------------------


def test_run_times_are_said_in_whole_minutes():
    assert cl.runtime_words(0.4) == "Under a minute"
    assert cl.runtime_words(1.4) == "About 1 minute"
    assert cl.runtime_words(4.6) == "About 5 minutes"


def test_a_quote_matches_at_its_own_precision():
    claim = cl.Claim("x", "0.89 of the ceiling", ("q",))
    assert cl.mismatch(claim, {"q": 0.8934}) is None
    assert "holds 0.896" in cl.mismatch(claim, {"q": 0.896})
    big = cl.Claim("x", "8,986 examples/s", ("q",))
    assert cl.mismatch(big, {"q": 8986.4}) is None
    assert cl.mismatch(big, {"q": 8987.0}) is not None


def test_a_percent_is_a_ratio_and_a_tolerance_overrides_the_precision():
    assert cl.mismatch(cl.Claim("x", "89%", ("q",)), {"q": 0.8934}) is None
    assert cl.mismatch(cl.Claim("x", "89%", ("q",)), {"q": 0.8961}) is not None
    loose = cl.Claim("x", "about 9,000 examples/s", ("q",), tolerance=100)
    assert cl.mismatch(loose, {"q": 8986.0}) is None


def test_a_range_quotes_two_quantities_and_counts_must_agree():
    claim = cl.Claim("x", "8,659-9,990", ("lo", "hi"))
    assert cl.mismatch(claim, {"lo": 8659.2, "hi": 9990.4}) is None
    assert "2 numbers for 1" in cl.mismatch(cl.Claim("x", "8,659-9,990", ("lo",)), {"lo": 1})
    assert "no recorded file" in cl.mismatch(cl.Claim("x", "1.5 ms", ("nope",)), {})


def test_measured_numbers_outside_quotes_are_found(monkeypatch):
    prose = (
        "Horovod reached 0.89 of it, 8,986 examples/s, and `1.2 ms` in code is not prose; "
        "28×28 images, 3 × 3 × 32 kernels, within 10% of the other."
    )
    monkeypatch.setattr(cl, "prose_of", lambda place: cl.re.sub(r"`[^`]*`", " ", prose))
    assert [s.split("'")[1] for s in cl.unaccounted("x", [])] == ["8,986 examples/s"]
    assert cl.unaccounted("x", ["8,986 examples/s"]) == []
    table = "| case | examples/s |\n|---|---|\n| horovod-x2 | 8,986 |"
    monkeypatch.setattr(cl, "prose_of", lambda place: table)
    assert [s.split("'")[1] for s in cl.unaccounted("x", [])] == ["8,986"]
    assert cl.unaccounted("x", ["horovod-x2 | 8,986"]) == []


def test_dates_times_and_issue_numbers_are_found(monkeypatch):
    monkeypatch.setattr(
        cl, "prose_of", lambda place: "Recorded 2026-11-25 at 15:26 UTC (issue 14)."
    )
    assert [s.split("'")[1] for s in cl.dated("x")] == ["2026-11-25", "15:26 UTC", "issue 14"]
