"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium, driven by Playwright.

Playwright's sync API blocks, so the browser lives in a thread of its own and each step runs
there (`Browser.run`), while the test's reactor runs the broker and the Python clients. Without
Chromium or Playwright the tests are skipped on a developer's machine and fail under CI, where
`make test` installs both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from tests.support import need_module, need_peer, wait_for

CHROMIUM = os.environ.get("WIREPROTO_CHROMIUM", "/usr/bin/chromium")
# What `make test` writes for people to look at: the status page's screenshot.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "browser"
# Chromium on a machine without a network or a display, as root.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--disable-dev-shm-usage"]

need_module("playwright", "pip install playwright (make test installs it)")


class Browser:
    """One Chromium for the module, and the thread that talks to it."""

    def __init__(self) -> None:
        self.pool = ThreadPool(1, 1, "playwright")
        self.pool.start()
        self.playwright: Any = None
        self.chromium: Any = None

    async def run(self, step: Callable[..., Any], *args: Any, timeout: float = 60.0) -> Any:
        """`step(*args)` in the browser's thread; what it returns."""
        return await wait_for(deferToThreadPool(reactor, self.pool, step, *args), timeout)

    def _launch(self) -> None:
        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        self.chromium = self.playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)

    def _close(self) -> None:
        if self.chromium is not None:
            self.chromium.close()
        if self.playwright is not None:
            self.playwright.stop()

    async def page(self, **context: Any) -> Any:
        """A new page in a context of its own (its own storage), 10 s timeouts."""
        def new_page() -> Any:
            page = self.chromium.new_context(**context).new_page()
            page.set_default_timeout(10_000)
            return page

        return await self.run(new_page)


@pytest_twisted.async_yield_fixture(scope="module")
async def browser():
    need_peer(None if shutil.which(CHROMIUM) or os.path.exists(CHROMIUM)
              else f"{CHROMIUM} is missing: apt-get install chromium chromium-driver",
              "the browser tests")
    running = Browser()
    try:
        await running.run(running._launch)
        yield running
    finally:
        await running.run(running._close)
        running.pool.stop()


# The access tests' broker credentials, for the page behind [auth]; the cluster's nats-server.
from tests.access.conftest import auth_files  # noqa: E402, F401
from tests.cluster.conftest import nats  # noqa: E402, F401
