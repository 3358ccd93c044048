"""Headless Chromium for the browser tests: Debian's ``chromium`` driven through
``chromedriver`` by Selenium (the test extra), all installed by scripts/setup-test.sh.

A browser test module calls ``require()`` at import: where a part is missing, the module is
skipped, saying which and how to install it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# What every test's browser runs with: no window, no sandbox (containers), nothing fetched
# from the network on its own.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
)


def require() -> Any:
    """Selenium's ``webdriver`` module; skips the calling module where a part is missing."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')"
    )
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "chromium and chromedriver are not installed (apt-get install chromium "
            "chromium-driver; scripts/setup-test.sh does it where it may)",
            allow_module_level=True,
        )
    return webdriver


@contextmanager
def headless(*flags: str, performance_log: bool = False) -> Iterator[Any]:
    """A headless Chromium with ``FLAGS`` and ``flags``; ``performance_log``: keep the network
    log (``driver.get_log("performance")``)."""
    webdriver = require()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags):
        options.add_argument(flag)
    if performance_log:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER)
    )
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``check()``'s first truthy value within ``timeout`` seconds, else an assertion naming
    ``what``. An error counts as not yet: a page redraws, and an element may go stale."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if value := check():
                return value
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
