"""The dashboard by role, in headless Chromium against a real server with a keys file: a
tenant's page shows its own requests and pins and no operator panel or action; an
operator's page shows every tenant's requests and the actions, with no excerpt of another
tenant's prompt. Skips, saying why, where the browser is missing (as the dashboard test).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests import chromium
from tests.chromium import wait_for
from tests.e2e.test_dashboard_browser import cell_texts
from tests.server_process import ServerProcess
from tests.tenant_keys import ALICE, BOB, OPS, keys_file

chromium.require()

SECRET = "The launch code is 0000-7777. " * 20


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("dashboard-roles")
    keys = keys_file(work)
    with ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--api-keys-file",
        str(keys),
        cache_dir=work / "cache",
        log_path=work / "server.log",
    ) as process:
        yield process


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium.headless() as driver:
        yield driver


def chat(server: ServerProcess, key: str, system: str, question: str) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2,
        temperature=0,
    )


def open_as(driver, origin: str, key: str) -> None:
    driver.get(origin.replace("http://", f"http://omlx:{key}@") + "/dashboard")
    wait_for("the models table", lambda: cell_texts(driver, "#models tbody th"))


def test_a_tenant_s_page_and_an_operator_s(server, browser) -> None:
    chat(server, BOB, SECRET, "What is the code?")
    chat(server, BOB, SECRET.replace("7777", "9999"), "What is the code?")  # a miss, quoted
    chat(server, ALICE, "You answer briefly.", "Hello?")
    pin = httpx.post(
        server.base_url + "/v1/cache/pins",
        headers={"authorization": f"Bearer {BOB}"},
        json={"model": "tiny-llama", "messages": [{"role": "user", "content": "pinned"}]},
        timeout=60,
    )
    assert pin.status_code == 201, pin.text
    driver = browser
    # Alice on 127.0.0.1, the operator on localhost: two origins, two stored logins.
    open_as(driver, server.base_url, ALICE)
    rows = wait_for("alice's request", lambda: cell_texts(driver, "#requests tbody tr"))
    assert len(rows) == 1  # hers; bob's two are not on her page
    assert "tenant alice" in driver.find_element("id", "server").text
    assert not driver.find_element("id", "tiers").is_displayed()
    assert driver.find_elements("css selector", "button.unload, button.clear") == []
    assert cell_texts(driver, "#pins tbody tr") == ["No pins."]  # bob's pin is not hers
    assert "0000-7777" not in driver.page_source

    open_as(driver, server.base_url.replace("127.0.0.1", "localhost"), OPS)
    rows = wait_for(
        "every tenant's requests",
        lambda: (r := cell_texts(driver, "#requests tbody tr")) and len(r) == 3 and r,
    )
    assert driver.find_element("id", "tiers").is_displayed()
    assert driver.find_elements("css selector", "button.unload")
    assert driver.find_elements("css selector", "button.clear")
    # Where bob's edited prompt left the cache is shown (a token offset), never what it said.
    diverged = driver.find_elements("css selector", "#requests td.diverged")
    tips = [cell.get_attribute("title") or "" for cell in diverged]
    assert not any("7777" in tip or "9999" in tip for tip in tips)
