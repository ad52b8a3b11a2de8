"""Fixtures for browser tests: a throwaway JupyterLab, headless Chromium, and a page on both.

Needs Debian's ``chromium`` at /usr/bin/chromium and the ``playwright`` package
(Playwright's own browser download is not used). Without them the tests skip
and say which is missing; with ``CI`` set they fail instead, so CI can't pass
by skipping them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from labpage import LabPage
from labserver import LabServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"


def _missing_browser_stack() -> str | None:
    if not CHROMIUM.exists():
        return (
            f"{CHROMIUM} not found: install Debian's chromium package "
            "(listed in system-packages.txt; scripts/system-packages.sh installs it)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed: pip install -e '.[dev]'"
    return None


@pytest.fixture(scope="session")
def browser_stack() -> None:
    """Skips (fails under CI) when Chromium or Playwright is missing."""
    missing = _missing_browser_stack()
    if missing and os.environ.get("CI"):
        pytest.fail(f"browser test can't run in CI: {missing}")
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="session")
def lab_server(browser_stack: None) -> Iterator[LabServer]:
    with LabServer() as server:
        yield server


@pytest.fixture(scope="session")
def chromium(browser_stack: None):
    """Headless Chromium; its crash database and caches go to a temp dir, not ~/.config."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="ddlkit-chromium-") as home:
        env = {**os.environ, "XDG_CONFIG_HOME": f"{home}/config", "XDG_CACHE_HOME": f"{home}/cache"}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, env=env
            )
            try:
                yield browser
            finally:
                browser.close()


@pytest.fixture
def lab(request: pytest.FixtureRequest, chromium, lab_server: LabServer) -> Iterator[LabPage]:
    """A fresh browser context on the session's JupyterLab; kernels end with the test."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    try:
        yield LabPage(context.new_page(), lab_server, request.node.name, ARTIFACTS)
    finally:
        context.close()
        lab_server.shutdown_kernels()
