"""The status page in a real headless Chromium against a real ``flexinfer serve``: two fake model servers
share one GPU group; the page lists both, and after a cold start and a swap (caused by real requests) the
page shows the swap in its timeline, the group's new holder, the latency chart and the server's log tail,
without a reload. When requests waited for the group before each swap was decided (a storm against
``min_hold``), every timeline row keeps a visible label and no bar starts left of the plot area. Screenshots
are kept (see ``support.browser.keep_screenshot``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from support.browser import headless_chromium, keep_screenshot
from support.local_serve import ServeProcess, chat, start_shared_pair
from support.polling import wait_until

pytestmark = pytest.mark.integration

DEADLINE = 30.0


def start_serve(tmp_path: Path, **env: str) -> ServeProcess:
    return start_shared_pair(tmp_path, "gpu0", server_args=("--startup-delay", "0.3"), **env)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = start_serve(tmp_path)
    yield process
    assert process.stop() == 0, process.log


def until(driver: WebDriver, what: str, check: Callable[[WebDriver], object]) -> object:
    """Poll the live page until ``check`` is truthy (deadline-bounded)."""
    deadline, last = time.monotonic() + DEADLINE, None
    while time.monotonic() < deadline:
        try:
            last = check(driver)
        except StaleElementReferenceException:
            last = None  # the page re-rendered between finding a row and reading it: look again
        if last:
            return last
        time.sleep(0.1)  # a polling interval, not a wait for state
    raise AssertionError(f"page never showed {what}; last={last!r}; updated="
                         f"{driver.find_element(By.ID, 'updated').text!r}")


def phases(driver: WebDriver) -> dict[str, str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#models tbody tr")
    return {r.get_attribute("data-key") or "": r.get_attribute("data-phase") or "" for r in rows}


def test_status_page_follows_a_swap(serve: ServeProcess, tmp_path: Path) -> None:
    with headless_chromium(tmp_path) as driver:
        driver.get(f"{serve.url}/ui")
        assert driver.title == "FlexInfer status"
        until(driver, "both models Idle",
              lambda d: phases(d) == {"default/left": "Idle", "default/right": "Idle"})
        assert "local engine" in driver.find_element(By.ID, "mode").text
        assert driver.find_element(By.CSS_SELECTOR, "#groups li").text == "gpu0: free"

        chat(serve.url, "left")
        chat(serve.url, "right")  # swaps left out of gpu0

        swap = until(driver, "the swap in the timeline", lambda d: d.find_elements(
            By.CSS_SELECTOR, '#timeline g.activation[data-kind="swap"][data-model="default/right"]'))
        row = swap[0]  # type: ignore[index]
        assert "swap default/left → default/right" in row.text
        stages = {r.get_attribute("data-stage") for r in row.find_elements(By.CSS_SELECTOR, "rect.stage")}
        assert {"drain", "server_start", "health"} <= stages, stages
        assert driver.find_elements(
            By.CSS_SELECTOR, '#timeline g.activation[data-kind="cold_start"][data-model="default/left"]')
        until(driver, "right holding gpu0",
              lambda d: d.find_element(By.CSS_SELECTOR, '#groups li[data-group="gpu0"]').get_attribute(
                  "data-holder") == "default/right")
        assert phases(driver)["default/right"] == "Ready"
        bins = driver.find_elements(By.CSS_SELECTOR, "#latency rect.bin")
        assert {b.get_attribute("data-kind") for b in bins} == {"cold_start", "swap"}
        assert "(2 recent activations)" in driver.find_element(By.ID, "latency-count").text

        Select(driver.find_element(By.ID, "log-model")).select_by_value("default/right")
        until(driver, "the right server's log tail",
              lambda d: "FAKE_OPENAI_PORT=" in d.find_element(By.ID, "log-tail").text)
        keep_screenshot(driver, tmp_path, "status-page.png")


def test_status_page_asks_for_the_token_when_auth_is_on(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, PROXY_AUTH_ENABLED="true", PROXY_AUTH_TOKEN="page-secret")
    try:
        with headless_chromium(tmp_path) as driver:
            driver.get(f"{serve.url}/ui")
            until(driver, "the token form", lambda d: d.find_element(By.ID, "login").is_displayed())
            assert phases(driver) == {}
            driver.find_element(By.ID, "token").send_keys("page-secret")
            driver.find_element(By.CSS_SELECTOR, "#login button").click()
            until(driver, "both models after the token",
                  lambda d: phases(d) == {"default/left": "Idle", "default/right": "Idle"})
            assert not driver.find_element(By.ID, "login").is_displayed()
    finally:
        assert serve.stop() == 0, serve.log


TIMELINE_GEOMETRY = """
const svg = document.getElementById("timeline");
svg.closest("section").scrollIntoView();
const axis = svg.querySelector("line.axis"), box = svg.getBoundingClientRect();
return {
  plotLeft: axis ? axis.getBoundingClientRect().left : null, svgLeft: box.left, svgRight: box.right,
  rows: [...svg.querySelectorAll("g.activation")].map((g) => {
    const label = g.querySelector("text"), r = label.getBoundingClientRect(), y = (r.top + r.bottom) / 2;
    return {
      kind: g.getAttribute("data-kind"), text: label.textContent,
      label: {left: r.left, right: r.right, width: r.width},
      topmost: [r.left + 2, (r.left + r.right) / 2, r.right - 2].map(
        (x) => label.contains(document.elementFromPoint(x, y))),
      bars: [...g.querySelectorAll("rect.stage")].map((b) => {
        const q = b.getBoundingClientRect();
        return {stage: b.getAttribute("data-stage"), left: q.left, right: q.right};
      }),
    };
  }),
};
"""
"""Script returning the timeline's geometry in CSS pixels: the plot area's left edge (the zero axis), and per
row its label's box, whether the label is the topmost element at three points along it, and its bars."""

STORM_SWAPS = 5


def timeline_geometry(driver: WebDriver, rows: int) -> dict[str, Any] | None:
    """The live timeline's geometry (``TIMELINE_GEOMETRY``) once it shows ``rows`` rows, else ``None``."""
    geometry: dict[str, Any] = driver.execute_script(TIMELINE_GEOMETRY)
    return geometry if len(geometry["rows"]) == rows else None


def test_timeline_rows_keep_their_labels_when_requests_queued_before_the_decision(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, FLEXINFER_SWAP_MIN_HOLD="1s")
    try:
        for turn in range(STORM_SWAPS + 1):  # each request waits ~1 s for the holder's min_hold: a queue stage
            chat(serve.url, ("left", "right")[turn % 2])
        with headless_chromium(tmp_path) as driver:
            driver.get(f"{serve.url}/ui")
            geometry = wait_until(lambda: timeline_geometry(driver, rows=STORM_SWAPS + 1), DEADLINE,
                                  "every activation in the timeline")
            keep_screenshot(driver, tmp_path, "status-page-queued.png")
    finally:
        assert serve.stop() == 0, serve.log
    queued = [row for row in geometry["rows"] if any(bar["stage"] == "queue" for bar in row["bars"])]
    assert len(queued) == STORM_SWAPS, geometry  # every swap's request waited before its decision
    for row in geometry["rows"]:
        assert "default/" in row["text"] and row["label"]["width"] > 0, row
        assert all(row["topmost"]), f"a bar or mark is drawn over the label: {row}"
        assert row["label"]["left"] >= geometry["svgLeft"], row
        assert all(bar["left"] >= row["label"]["right"] for bar in row["bars"]), row
    plot_left = geometry["plotLeft"]
    assert plot_left is not None, "the timeline draws no zero axis"
    for row in geometry["rows"]:
        assert row["label"]["right"] <= plot_left, row
        for bar in row["bars"]:
            assert plot_left - 0.5 <= bar["left"] <= bar["right"] <= geometry["svgRight"], (bar, row)
