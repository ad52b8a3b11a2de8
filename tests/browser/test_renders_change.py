"""``RendersChange`` decides what counts as a new render, on snapshots given as data."""

from __future__ import annotations

from labpage import RendersChange


class Snapshots:
    """Stands in for an output area's locator: each ``evaluate`` returns the next snapshot."""

    def __init__(self, *states: tuple[str, str]) -> None:
        self._states = iter(states)

    def evaluate(self, _script: str) -> dict:
        text, image = next(self._states)
        return {"text": text, "images": [image] if image else [], "widgets": 2}


def watch(check: RendersChange, *states: tuple[str, str]) -> list[str]:
    output = Snapshots(*states)
    for _ in states:
        check(output)
    return [s.text for s in check.seen]


# A thread sets the image, then the label: every second snapshot is read between the two.
IMAGE_THEN_LABEL = [
    ("updates: 0", ""),
    ("updates: 0", "a"),
    ("updates: 0", "b"),
    ("updates: 1", "b"),
    ("updates: 1", "c"),
    ("updates: 2", "c"),
]


def test_a_new_image_counts_even_beside_the_old_text_by_default():
    seen = watch(RendersChange(times=9), *IMAGE_THEN_LABEL)
    assert seen == ["updates: 0", "updates: 0", "updates: 1"]


def test_with_new_text_a_render_counts_only_once_image_and_text_both_changed():
    seen = watch(RendersChange(times=9, new_text=True), *IMAGE_THEN_LABEL)
    assert seen == ["updates: 0", "updates: 1", "updates: 2"]


def test_states_without_the_texts_or_an_image_never_count():
    check = RendersChange(times=2, texts=("updates:",))
    assert watch(check, ("loading", "a"), ("updates: 1", ""), ("updates: 1", "b")) == ["updates: 1"]
    assert not check(Snapshots(("updates: 2", "b")))
