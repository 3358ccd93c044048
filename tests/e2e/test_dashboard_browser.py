"""The dashboard in a real headless browser (Debian's chromium driven by Selenium) against a
real server behind an API key: the model, a hit, a chart's points, a missed request's
divergence point, a pin with its TTL and its unpin, a cache clear, and not one request
outside the server.

Skips, saying why, where chromium, chromedriver or selenium is missing (scripts/setup-test.sh
installs them). ``OMLX_TEST_DASHBOARD_SCREENSHOT=PATH`` saves the page as it ends (the
README's docs/img/dashboard.png is made so).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests import chromium
from tests.cache_header import checked
from tests.chromium import wait_for
from tests.server_process import ServerProcess

KEY = "dash-key-42"
BEARER = {"Authorization": f"Bearer {KEY}"}
SYSTEM = "You are a careful agent working in a repository of Python code. " * 12
NONE = "\N{EN DASH}"  # what the page shows for a value it does not have
HIT_RATE = "Hit rate (past the template's preamble)"  # the chart's title
chromium.require()

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("dashboard-server")
    process = ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--api-key",
        KEY,
        cache_dir=work / "cache",
        log_path=work / "server.log",
        env={"OMLX_DASHBOARD_SAMPLE_SECONDS": "0.5"},
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium.headless("--window-size=1280,1400", performance_log=True) as driver:
        yield driver


def messages(question: str = "List the files.", system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def ask(server: ServerProcess, question: str = "List the files.") -> Any:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    return client.chat.completions.create(
        model="tiny-llama", messages=messages(question), max_tokens=4, temperature=0
    )


def cache_header(server: ServerProcess, question: str, system: str = SYSTEM) -> dict[str, str]:
    """The ``x-omlx-cache`` fields of a chat request asking ``question``."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-llama", messages=messages(question, system), max_tokens=4, temperature=0
    )
    return checked(raw)  # the header, found to say what usage does


def request_urls(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def cell_texts(driver: Any, selector: str) -> list[str]:
    return [c.text for c in driver.find_elements(By.CSS_SELECTOR, selector)]


def tooltips(driver: Any, selector: str) -> list[str]:
    """The text of SVG ``<title>`` elements (never displayed: read as their content)."""
    return [t.get_attribute("textContent") for t in driver.find_elements(By.CSS_SELECTOR, selector)]


def test_the_dashboard_shows_the_server_and_acts_on_it(server, browser):
    driver = browser
    origin = server.base_url
    # The page's 401 asks for Basic credentials: any user name, the key as password.
    driver.get(origin.replace("http://", f"http://omlx:{KEY}@") + "/dashboard")
    model = wait_for(
        "the served model",
        lambda: driver.find_element(By.CSS_SELECTOR, 'tr[data-model="tiny-llama"]'),
    )
    assert "loaded" in model.text

    ask(server)
    second = ask(server)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    # The repeated request is listed with its cached tokens, newest first.
    cached = wait_for(
        "the hit in the request list",
        lambda: (
            [
                int(t.replace(",", ""))
                for t in cell_texts(driver, "#requests tbody td.cached")
                if t not in ("", NONE)
            ]
            if len(driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")) >= 2
            else None
        ),
    )
    assert cached[0] == second.usage.prompt_tokens_details.cached_tokens
    assert cached[1] == 0
    tiers = cell_texts(driver, "#requests tbody td.tier")
    assert tiers[:2] == ["hot", "none"]
    # The series sampled both: the hit-rate chart has points.
    wait_for(
        "a chart's points",
        lambda: driver.find_elements(By.CSS_SELECTOR, f'[data-chart="{HIT_RATE}"] circle.point'),
    )
    # The first request found nothing: a new conversation, from token 0, in the system message.
    rows = driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")
    assert (
        rows[-1].find_element(By.CSS_SELECTOR, "td.diverged").text
        == "new conversation: token 0, message 0 (system)"
    )
    assert rows[0].find_element(By.CSS_SELECTOR, "td.diverged").text == "hit"  # the repeat

    # A conversation on another system prompt restores only the template's preamble, which
    # every request does: alone in its sample, the hit rate it charts is 0%.
    time.sleep(1.2)  # the samples of the requests before it are taken
    other = cache_header(server, "List the files.", system="Review pull requests.")
    assert int(other["cached"]) > 0 and other["outcome"] == "new_conversation", other
    recent = httpx.get(server.base_url + "/v1/cache/recent", headers=BEARER, timeout=30)
    latest = recent.json()["data"][0]
    assert (latest["restored"], latest["preamble_tokens"]) == ("preamble", int(other["cached"]))
    time.sleep(1.2)
    rate = wait_for(
        "the preamble-only request's point",
        lambda: (
            (tips := tooltips(driver, f'[data-chart="{HIT_RATE}"] circle.point title'))
            and (len(tips) >= 2 and tips[-1])
        ),
    )
    assert rate.endswith(": 0% (1 requests)"), rate
    metrics = httpx.get(server.base_url + "/metrics", headers=BEARER, timeout=30).text
    assert 'omlx_cache_reports_total{outcome="new_conversation",restored="preamble"} 1.0' in metrics

    # A new question on the same system prompt diverges in the user's message, where its
    # cache report (the x-omlx-cache header) says.
    report = cache_header(server, "Which tests are slow?")
    assert int(report["diverged_at"]) > 0 and report["role"] == "user"
    diverged = wait_for(
        "the divergence point",
        lambda: (
            (t := cell_texts(driver, "#requests tbody td.diverged")[0]) != NONE
            and len(driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")) >= 4
            and t
        ),
    )
    assert diverged.startswith(
        f"new conversation: token {int(report['diverged_at']):,}, message {report['message']} ("
    )

    # A pin made through the API shows with its TTL; unpinning it in the page removes it.
    pin = pin_for_a_while(server, 600)
    row = wait_for(
        "the pin", lambda: driver.find_element(By.CSS_SELECTOR, f'#pins tr[data-pin="{pin}"]')
    )
    assert "tiny-llama" in row.text and "api" in row.text
    ttl = row.find_element(By.CSS_SELECTOR, "td.ttl").text  # "9 min 58 s"
    assert ttl.startswith(("9 min", "10 min")), ttl
    row.find_element(By.CSS_SELECTOR, "button.unpin").click()
    dialog = wait_for(
        "the unpin's confirmation",
        lambda: (d := driver.find_element(By.ID, "confirm")).is_displayed() and d,
    )
    assert "Unpin" in dialog.text and "tiny-llama" in dialog.text
    driver.find_element(By.ID, "confirm-ok").click()
    wait_for("the unpin's report", lambda: "unpinned" in driver.find_element(By.ID, "status").text)
    wait_for(
        "the pin gone from the page",
        lambda: not driver.find_elements(By.CSS_SELECTOR, "#pins tr[data-pin]"),
    )
    assert (
        httpx.get(server.base_url + "/v1/cache/pins", headers=BEARER, timeout=30).json()["data"]
        == []
    )

    hot_before = wait_for(
        "hot blocks",
        lambda: (
            (t := model_cell(driver, "hot"))
            and t.startswith(("1", "2", "3", "4", "5", "6", "7", "8", "9"))
            and t
        ),
    )

    # Clear its cache, by keyboard: Tab from Unload to Clear cache; the focus stays there
    # while the page redraws its tables; Enter, then confirm in the dialog.
    driver.execute_script(
        "arguments[0].focus()", driver.find_element(By.CSS_SELECTOR, "button.unload")
    )
    driver.switch_to.active_element.send_keys(Keys.TAB)
    drawn = driver.find_element(By.TAG_NAME, "body").get_attribute("data-updated")
    wait_for(
        "a redraw",
        lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-updated") != drawn,
    )
    assert driver.switch_to.active_element.get_attribute("data-key") == "clear:tiny-llama"
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    dialog = wait_for(
        "the confirmation",
        lambda: (d := driver.find_element(By.ID, "confirm")).is_displayed() and d,
    )
    assert "tiny-llama" in dialog.text
    driver.find_element(By.ID, "confirm-ok").click()
    status = wait_for(
        "the clear's report",
        lambda: "cleared" in (t := driver.find_element(By.ID, "status").text) and t,
    )
    assert "tiny-llama" in status
    wait_for("an empty hot tier", lambda: model_cell(driver, "hot").startswith("0 blocks"))
    wait_for("an empty SSD tier", lambda: model_cell(driver, "ssd").startswith("0 blocks"))
    assert hot_before != model_cell(driver, "hot")
    # A clear is a real miss: the same prompt is computed again.
    assert ask(server).usage.prompt_tokens_details.cached_tokens == 0

    if path := os.environ.get("OMLX_TEST_DASHBOARD_SCREENSHOT"):
        for _ in range(3):  # a few more points on the charts
            time.sleep(0.6)
            ask(server)
        wait_for(
            "the last request",
            lambda: len(driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")) >= 6,
        )
        shown = pin_for_a_while(server, 3600)  # the pins panel with one in it
        wait_for(
            "the pin",
            lambda: driver.find_elements(By.CSS_SELECTOR, f'#pins tr[data-pin="{shown}"]'),
        )
        driver.set_window_size(1280, 1750)  # tall enough for the pins panel below the requests
        time.sleep(1.5)
        driver.save_screenshot(path)
        driver.set_window_size(1280, 1400)
        # Unpinned again: the vacuum below must be free to evict every block.
        assert (
            httpx.delete(f"{server.base_url}/v1/cache/pins/{shown}", headers=BEARER).status_code
            == 200
        )
        # A pin acquires the model without submitting: the pool holds it "in use" for 5 s
        # (pool.IN_USE_GRACE_S), which would refuse the unload below; a request clears that.
        ask(server)

    # Vacuum the SSD tier to nothing from the form, by keyboard alone.
    # Once every block the last miss computed is on disk (written behind the request).
    wait_for(
        "the miss's blocks on disk",
        lambda: (
            blocks_in(driver, "ssd") == blocks_in(driver, "hot") > 0
            and "0 blocks queued for disk" in driver.find_element(By.ID, "tier-ssd").text
        ),
    )
    size = driver.find_element(By.ID, "vacuum-size")
    size.send_keys(Keys.CONTROL, "a")
    size.send_keys("0", Keys.ENTER)
    wait_for(
        "the vacuum's confirmation", lambda: driver.find_element(By.ID, "confirm").is_displayed()
    )
    driver.switch_to.active_element.send_keys(Keys.TAB)  # Cancel has the focus; Confirm is next
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    status = wait_for(
        "the vacuum's report",
        lambda: "vacuumed" in (t := driver.find_element(By.ID, "status").text) and t,
    )
    assert "evicted" in status
    wait_for(
        "an SSD tier vacuumed to nothing", lambda: model_cell(driver, "ssd").startswith("0 blocks")
    )
    assert "0 B of" in driver.find_element(By.ID, "tier-ssd").text

    # Unload the model; it is listed as available (the next request loads it again).
    driver.find_element(By.CSS_SELECTOR, 'tr[data-model="tiny-llama"] button.unload').click()
    wait_for(
        "the unload's confirmation", lambda: driver.find_element(By.ID, "confirm").is_displayed()
    )
    driver.find_element(By.ID, "confirm-ok").click()
    wait_for(
        "an unloaded model",
        lambda: (
            "available" in driver.find_element(By.CSS_SELECTOR, 'tr[data-model="tiny-llama"]').text
        ),
    )

    urls = request_urls(driver)
    assert any(u.endswith("/v1/dashboard/state") for u in urls)
    here = urlsplit(origin).netloc
    outside = [
        u
        for u in urls
        if not u.startswith("data:") and urlsplit(u).netloc.rpartition("@")[2] != here
    ]
    assert not outside, f"the page asked for something outside the server: {outside}"


def pin_for_a_while(server: ServerProcess, ttl_seconds: int) -> str:
    """Pin the system prompt's conversation through the API; the pin's id."""
    body = {"model": "tiny-llama", "messages": messages(), "ttl_seconds": ttl_seconds}
    made = httpx.post(server.base_url + "/v1/cache/pins", headers=BEARER, json=body, timeout=30)
    assert made.status_code == 201, made.text
    return made.json()["id"]


def blocks_in(driver: Any, column: str) -> int:
    """The block count a model's tier cell shows ("41 blocks, 329.2 KB")."""
    return int(model_cell(driver, column).split(" blocks")[0].replace(",", ""))


def model_cell(driver: Any, column: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, f'tr[data-model="tiny-llama"] td.{column}').text
