"""A real JupyterLab in headless Chromium shows a widget that a background thread keeps redrawing.

This proves the harness (server, browser, running a cell, watching its output)
on a cell of our own: a matplotlib figure drawn into an ``ipywidgets.Image``
and a counter ``Label``, both updated 5 times a second from a thread. The
dashboard test swaps in the cell that launches two workers, and a check such
as ``RendersChange(times=3, texts=("worker-0", "worker-1"))`` (the status table
names each worker).
"""

from __future__ import annotations

import re

import pytest
from labpage import LabPage, RendersChange

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(180)]

LIVE_WIDGET_CELL = """\
import io, threading, time
import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

image = widgets.Image(format="png", layout=widgets.Layout(width="600px"))
counter = widgets.Label("updates: 0")
display(widgets.VBox([counter, image]))

def draw(step):
    fig = Figure(figsize=(6, 3), dpi=100)
    ax = fig.add_subplot()
    for worker in range(2):
        losses = [1 / (1 + 0.3 * (worker + 1) * x) for x in range(step + 1)]
        ax.plot(losses, label=f"worker {worker}")
    ax.set_xlim(0, 30)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()

def update():
    for step in range(1, 31):
        image.value = draw(step)
        counter.value = f"updates: {step}"
        time.sleep(0.2)

threading.Thread(target=update, daemon=True).start()
"""


def test_widget_redrawn_from_a_thread_updates_in_the_browser(lab: LabPage):
    # The thread sets the image, then the label: a read between the two shows a
    # new image beside the previous count, so a render counts only once both changed.
    check = RendersChange(times=5, texts=("updates:",), new_text=True)

    shot = lab.run_cell_until(LIVE_WIDGET_CELL, check, timeout=30)

    counts = [int(re.search(r"updates: (\d+)", s.text).group(1)) for s in check.seen]
    assert counts == sorted(counts), counts  # the browser never shows an older update
    assert all(s.images[0].startswith("600x300:") for s in check.seen), check.seen
    assert shot.stat().st_size > 10_000


def test_a_cell_that_raises_fails_fast_with_its_traceback_and_a_screenshot(lab: LabPage):
    never = RendersChange(times=2)

    with pytest.raises(AssertionError) as failure:
        lab.run_cell_until("def f():\n    raise ValueError('boom 42')\nf()", never, timeout=30)

    message = str(failure.value)
    assert "ValueError: boom 42" in message and "in f()" in message
    assert str(lab.screenshot_path) in message
    assert "ValueError: boom 42" in lab.report_path.read_text()
    assert lab.screenshot_path.stat().st_size > 10_000
