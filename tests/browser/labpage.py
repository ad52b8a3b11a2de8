"""Drive a notebook in JupyterLab through a real browser page (Playwright, sync API).

``LabPage.run_cell_until(source, check, timeout)`` is the whole workflow: write
a one-cell notebook, open it in JupyterLab, wait until its kernel is connected
and idle, run the cell with Ctrl+Enter as a person would, then poll ``check``
on the cell's rendered output until it holds. A screenshot is saved either way;
on failure a text file next to it holds the output, the traceback if the cell
raised, the browser console and the server log.

A check is any callable taking the Playwright ``Locator`` of the cell's output
area (``locator.page`` is the whole page) and returning a bool; give it a
readable ``__str__`` for the failure message. ``RendersChange`` is the one for
live widgets: it holds once the output's decoded images were seen in N
different pixel states.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from labserver import LabServer

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

Check = Callable[["Locator"], bool]

POLL_MS = 250
READY_TIMEOUT_MS = 60_000  # page load plus kernel start, on a busy 2-core machine
START_TIMEOUT_S = 10.0  # from Ctrl+Enter until the prompt shows [*] or a count

# The rendered output area -> its text and a hash of every decoded image's pixels.
# Images shown by widgets are same-origin blob: URLs, so the canvas is readable.
_SNAPSHOT_JS = """(area) => {
  const images = [];
  for (const img of area.querySelectorAll('img')) {
    if (!img.complete || img.naturalWidth === 0) continue;
    const canvas = document.createElement('canvas');
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    let h = 0x811c9dc5;
    for (let i = 0; i < data.length; i++) h = Math.imul(h ^ data[i], 0x01000193);
    images.push(`${canvas.width}x${canvas.height}:${(h >>> 0).toString(16)}`);
  }
  return {text: area.innerText, images, widgets: area.querySelectorAll('.jupyter-widgets').length};
}"""

# These read JupyterLab's own models through window.jupyterapp (exposed by the server flag).
_PANEL_JS = """(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.content.widgets.length) return w.id;
  }
  return null;
}"""

_PANEL = "[...window.jupyterapp.shell.widgets('main')].find(w => w.id === id)"

_KERNEL_JS = f"""(id) => {{
  const k = {_PANEL}?.sessionContext?.session?.kernel;
  return k ? `${{k.connectionStatus}}/${{k.status}}` : 'no kernel';
}}"""

_ERRORS_JS = f"""([id, index]) => {{
  const cell = {_PANEL}.content.widgets[index];
  return cell.model.outputs.toJSON()
    .filter(o => o.output_type === 'error')
    .map(o => (o.traceback || [o.ename + ': ' + o.evalue]).join('\\n'));
}}"""

_SCROLL_JS = """(area) => {
  const fits = area.offsetHeight < 0.8 * window.innerHeight;
  area.scrollIntoView({block: fits ? 'end' : 'start'});
}"""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class OutputState:
    """What the output area showed at one moment."""

    text: str
    images: tuple[str, ...]  # "WxH:pixelhash" per decoded image
    widgets: int


def read_output(output: Locator) -> OutputState:
    raw = output.evaluate(_SNAPSHOT_JS)
    return OutputState(raw["text"], tuple(raw["images"]), raw["widgets"])


@dataclass
class RendersChange:
    """Holds once the output's images were seen in ``times`` different pixel states,
    each with at least ``images`` decoded images and every string of ``texts`` shown.

    With ``new_text`` a state counts only when its text differs from every state
    seen as well: a cell that sets an image and then a label is read between the
    two now and then, and that in-between state must not count as a render.
    """

    times: int = 4
    texts: tuple[str, ...] = ()
    images: int = 1
    new_text: bool = False
    seen: list[OutputState] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.times < 2 or self.images < 1:
            raise ValueError(
                f"RendersChange(times={self.times}, images={self.images}) can't show a change: "
                "use times >= 2 and images >= 1"
            )

    def __call__(self, output: Locator) -> bool:
        state = read_output(output)
        complete = len(state.images) >= self.images and all(t in state.text for t in self.texts)
        new = all(
            state.images != s.images and (not self.new_text or state.text != s.text)
            for s in self.seen
        )
        if complete and new:
            self.seen.append(state)
        return len(self.seen) >= self.times

    def __str__(self) -> str:
        want = f"{self.times} different renders with >= {self.images} image(s)"
        if self.texts:
            want += f" and the texts {list(self.texts)}"
        return f"{want}; saw {len(self.seen)}: {[s.images for s in self.seen]}"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


class LabPage:
    """One browser page on one ``LabServer``; screenshots go to ``artifacts/<name>.png``."""

    def __init__(self, page: Page, server: LabServer, name: str, artifacts: Path) -> None:
        self.page = page
        self.server = server
        self.name = _slug(name)
        self.artifacts = artifacts
        self.console: deque[str] = deque(maxlen=200)
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self._panel = ""

    @property
    def screenshot_path(self) -> Path:
        return self.artifacts / f"{self.name}.png"

    @property
    def report_path(self) -> Path:
        """The failure report: what was awaited, the output, browser console, server log."""
        return self.artifacts / f"{self.name}.txt"

    def open_notebook(self, cells: list[str]) -> None:
        """Write ``cells`` as a notebook, open it, and wait until its kernel is idle."""
        path = self.server.put_notebook(f"{self.name}.ipynb", cells)
        # ?reset: start from an empty workspace, not the previous test's open tabs.
        self.page.goto(f"{self.server.url}lab/tree/{path}?reset&token={self.server.token}")
        handle = self.page.wait_for_function(
            _PANEL_JS, arg=path, timeout=READY_TIMEOUT_MS, polling=POLL_MS
        )
        self._panel = handle.json_value()
        self.page.evaluate("() => window.jupyterapp.shell.collapseLeft()")  # room for outputs
        self.page.wait_for_function(
            f"(id) => ({_KERNEL_JS})(id) === 'connected/idle'",
            arg=self._panel,
            timeout=READY_TIMEOUT_MS,
            polling=POLL_MS,
        )

    def cell(self, index: int) -> Locator:
        return self.page.locator(f"#{self._panel} .jp-Notebook .jp-Cell").nth(index)

    def run_cell(self, index: int = 0) -> Locator:
        """Select cell ``index``, press Ctrl+Enter, and return its output area."""
        cell = self.cell(index)
        prompt = cell.locator(".jp-InputArea-prompt")
        prompt.click()
        self.page.keyboard.press("Control+Enter")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not re.search(r"[*0-9]", prompt.inner_text()):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Ctrl+Enter did not start cell {index} within {START_TIMEOUT_S:.0f} s: "
                    f"its prompt still reads {prompt.inner_text()!r}"
                )
            self.page.wait_for_timeout(50)
        return cell.locator(".jp-Cell-outputArea")

    def cell_errors(self, index: int) -> list[str]:
        """Tracebacks (ANSI stripped) of error outputs in cell ``index``."""
        raw = self.page.evaluate(_ERRORS_JS, [self._panel, index])
        return [_ANSI.sub("", tb) for tb in raw]

    def wait_for(self, output: Locator, check: Check, timeout: float, index: int = 0) -> None:
        """Poll ``check(output)`` till it holds; stop early if the cell raised or kernel died."""
        deadline = time.monotonic() + timeout
        while not check(output):
            errors = self.cell_errors(index)
            if errors:
                raise AssertionError(f"cell {index} raised:\n{errors[-1]}")
            kernel = self.page.evaluate(_KERNEL_JS, self._panel)
            if kernel.endswith(("/dead", "/unknown")) or kernel == "no kernel":
                raise AssertionError(f"the kernel is gone ({kernel}) while waiting for: {check}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen within {timeout:.0f} s: {check}")
            self.page.wait_for_timeout(POLL_MS)

    def screenshot(self, index: int = 0) -> Path:
        """Save the page as ``<name>.png`` with cell ``index``'s output in view.

        An output that fits is aligned to the bottom, so the code above it shows too.
        """
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.cell(index).locator(".jp-Cell-outputArea").evaluate(_SCROLL_JS, timeout=5_000)
        self.page.screenshot(path=self.screenshot_path)
        return self.screenshot_path

    def run_cell_until(self, source: str, check: Check, timeout: float) -> Path:
        """Run ``source`` as a notebook cell and wait until ``check`` holds on its output.

        Returns the screenshot's path. On failure the screenshot and a
        ``<name>.txt`` report are saved, and the AssertionError names both.
        """
        for stale in (self.screenshot_path, self.report_path):
            stale.unlink(missing_ok=True)
        output = None
        try:
            self.open_notebook([source])
            output = self.run_cell(0)
            self.wait_for(output, check, timeout)
        except Exception as exc:
            raise AssertionError(self._report_failure(exc, output)) from exc
        return self.screenshot(0)

    def _report_failure(self, exc: Exception, output: Locator | None) -> str:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        notes = []
        try:
            self.screenshot(0)
        except Exception as shot_error:  # a page that never loaded has no output to scroll to
            notes.append(f"(screenshot taken without scrolling: {shot_error})")
            self.page.screenshot(path=self.screenshot_path)
        text = "(no output area)"
        if output is not None:
            text = output.inner_text(timeout=5_000)
        self.report_path.write_text(
            f"{exc}\n\n== cell output ==\n{text}\n\n== browser console ==\n"
            + "\n".join(self.console)
            + f"\n\n== server log ==\n{self.server.log_tail()}\n"
            + "\n".join(notes)
        )
        return f"{exc}\n(screenshot: {self.screenshot_path}; details: {self.report_path})"
