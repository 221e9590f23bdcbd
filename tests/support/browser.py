"""A real headless Chromium for page tests, driven by Selenium through Debian's ``chromedriver``.

``headless_chromium()`` yields a Selenium WebDriver. Both binaries come from PATH (``chromium`` and
``chromium-driver``, installed by ``hack/install-system-deps``); the driver path is given explicitly and
Selenium Manager runs offline, so nothing is downloaded. ``keep_screenshot`` saves a PNG under the test's
tmp dir and, when ``FLEXINFER_SCREENSHOT_DIR`` is set, a copy there (CI uploads it as an artifact).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

SCREENSHOT_DIR_ENV = "FLEXINFER_SCREENSHOT_DIR"


class BrowserMissingError(RuntimeError):
    """Chromium or its WebDriver is not installed."""


def _binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserMissingError(f"none of {', '.join(names)} on PATH; run hack/install-system-deps")


@contextmanager
def headless_chromium(workdir: Path, width: int = 1280, height: int = 1100) -> Iterator[webdriver.Chrome]:
    """A headless Chromium (no network beyond loopback is used by the pages under test); quit on exit."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never try to download a driver
    options = Options()
    options.binary_location = _binary("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--window-size={width},{height}", f"--user-data-dir={workdir / 'chromium-profile'}"):
        options.add_argument(arg)
    service = Service(executable_path=_binary("chromedriver"), log_output=str(workdir / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def keep_screenshot(driver: webdriver.Chrome, tmp_dir: Path, name: str) -> list[Path]:
    """Save a screenshot as ``tmp_dir/name`` (and under ``$FLEXINFER_SCREENSHOT_DIR``); print the paths."""
    paths = [tmp_dir / name]
    extra = os.environ.get(SCREENSHOT_DIR_ENV, "").strip()
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        paths.append(Path(extra) / name)
    for path in paths:
        assert driver.save_screenshot(str(path)), f"screenshot not written to {path}"
        print(f"status page screenshot: {path}")
    return paths
