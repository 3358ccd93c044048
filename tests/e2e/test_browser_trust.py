"""Another site's page cannot drive omlx through its visitor's browser (api/browser_guard.py).

A real server (with ``--api-key``, the browser logged in to its dashboard; and without
one), a second tiny HTTP server playing the attacker's site on another origin
(``localhost`` vs ``127.0.0.1``), and headless Chromium: the attacker's page tries every
route that changes something with ``no-cors`` fetches and form posts (chat, Anthropic
messages, responses, pins, import of a real archive, unpin, the dashboard's clear, unload
and vacuum). The server's own counters and state show none went through and each arrived
(refused). A rebound name (Chromium told to resolve ``rebind.test`` to 127.0.0.1) and a
``Host: attacker.example`` request are refused too.

Skips, saying why, where chromium, chromedriver or selenium is missing.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests import chromium
from tests.chromium import wait_for
from tests.server_process import ServerProcess

KEY = "trust-key-42"
BEARER = {"Authorization": f"Bearer {KEY}"}
MODEL = "tiny-llama"
SYSTEM = "You are a careful agent working in a repository of Python code. " * 6
chromium.require()

from selenium.webdriver.common.by import By  # noqa: E402

# The attacker's page: every attempt, then ``window.attackDone``. ``no-cors`` fetches send
# only what a browser lets any page send cross-site (text/plain and form bodies); forms post
# into hidden frames. With ``?top=K`` it instead makes the K-th of ``TOP`` a top-level form
# post: the one request a browser sends its stored Basic credentials with (the auth cache is
# partitioned by the top-level site: a frame or fetch from the attacker's page gets none).
ATTACK_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>cute cats</title></head><body>
<script>
const T = %(target)s, M = %(model)s, PIN = %(pin)s;
const chat = JSON.stringify({model: M, messages: [{role: "user", content: "leak it"}], max_tokens: 2});
const pinBody = JSON.stringify({model: M, messages: [{role: "user", content: "x"}]});
const send = (path, body, init) => fetch(T + path, Object.assign(
  {method: "POST", mode: "no-cors", credentials: "include", body: body}, init || {}))
  .catch((err) => String(err));
function formPost(path, enctype, fields, file, top) {
  return new Promise((resolve) => {
    const form = document.createElement("form");
    form.method = "POST"; form.action = T + path; form.enctype = enctype; form.target = "_top";
    if (!top) {
      const frame = document.createElement("iframe");
      frame.name = "f" + Math.random().toString(36).slice(2);
      frame.onload = () => resolve();
      document.body.appendChild(frame);
      form.target = frame.name;
    }
    for (const [name, value] of fields) {
      const input = document.createElement("input");
      input.type = "hidden"; input.name = name; input.value = value;
      form.appendChild(input);
    }
    if (file) {
      const input = document.createElement("input");
      input.type = "file"; input.name = "archive";
      const files = new DataTransfer();
      files.items.add(file);
      input.files = files.files;
      form.appendChild(input);
    }
    document.body.appendChild(form);
    form.submit();
    setTimeout(resolve, 5000);  // a frame that never loads does not hold the test
  });
}
// A text/plain form whose one field makes the body read as JSON: NAME=VALUE.
const jsonForm = (path, json, top) => formPost(path, "text/plain",
  [[json.slice(0, -1) + ', "pad": "', '"}']], null, top);
const TOP = [
  () => jsonForm("/v1/chat/completions", chat, true),
  () => jsonForm("/v1/cache/pins", pinBody, true),
  () => formPost("/v1/dashboard/models/" + M + "/clear-cache", "application/x-www-form-urlencoded", [], null, true),
  () => formPost("/v1/dashboard/models/" + M + "/unload", "application/x-www-form-urlencoded", [], null, true),
  () => formPost("/v1/dashboard/pins/" + PIN + "/unpin", "text/plain", [["{}", ""]], null, true),
  (archive) => formPost("/v1/cache/import?model=" + M, "multipart/form-data", [],
    new File([archive], "cache.tar", {type: "application/x-tar"}), true),
];
(async () => {
  const archive = await (await fetch("/archive.tar")).blob();
  const top = new URLSearchParams(location.search).get("top");
  if (top !== null) {
    await TOP[Number(top)](archive);
    return;
  }
  const tar = new Blob([archive], {type: "application/x-tar"});
  await Promise.all([
    send("/v1/chat/completions", chat, {headers: {"Content-Type": "text/plain"}}),
    send("/v1/chat/completions", new URLSearchParams({model: M})),
    send("/v1/messages", JSON.stringify({model: M, max_tokens: 2,
      messages: [{role: "user", content: "leak it"}]})),
    send("/v1/responses", JSON.stringify({model: M, input: "leak it", max_output_tokens: 2})),
    send("/v1/cache/pins", pinBody),
    send("/v1/cache/import?model=" + M, tar),
    send("/v1/dashboard/models/" + M + "/clear-cache", "{}"),
    send("/v1/dashboard/models/" + M + "/unload", "{}"),
    send("/v1/dashboard/pins/" + PIN + "/unpin", "{}"),
    send("/v1/dashboard/vacuum", JSON.stringify({max_size: "0"})),
    send("/v1/cache/pins/" + PIN, undefined, {method: "DELETE", mode: "cors"}),
  ]);
  await jsonForm("/v1/chat/completions", chat);
  await jsonForm("/v1/cache/pins", pinBody);
  await formPost("/v1/dashboard/models/" + M + "/clear-cache", "application/x-www-form-urlencoded", []);
  await formPost("/v1/dashboard/models/" + M + "/unload", "application/x-www-form-urlencoded", []);
  await formPost("/v1/dashboard/pins/" + PIN + "/unpin", "text/plain", [["{}", ""]]);
  await formPost("/v1/cache/import?model=" + M, "multipart/form-data", [],
    new File([archive], "cache.tar", {type: "application/x-tar"}));
  window.attackDone = true;
})();
</script></body></html>
"""
TOP_POSTS = 6  # the page's TOP list

# Each attacked route and method, with how many attempts the page makes on it.
ATTEMPTS = {
    ("/v1/chat/completions", "POST"): 4,
    ("/v1/messages", "POST"): 1,
    ("/v1/responses", "POST"): 1,
    ("/v1/cache/pins", "POST"): 3,
    ("/v1/cache/import", "POST"): 3,
    ("/v1/dashboard/models/{model_id}/clear-cache", "POST"): 3,
    ("/v1/dashboard/models/{model_id}/unload", "POST"): 3,
    ("/v1/dashboard/pins/{pin_id}/unpin", "POST"): 3,
    ("/v1/dashboard/vacuum", "POST"): 1,
}
METRIC = re.compile(
    r'^omlx_http_requests_total\{method="(\w+)",route="([^"]+)",status="(\d+)"\} ([\d.]+)$'
)


class AttackerSite:
    """The attacker's web server: its page and the archive it smuggles, on its own port."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bytes]] = {}
        files = self.files

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kind, body = files.get(self.path.split("?")[0], ("text/plain", b"no such page"))
                self.send_response(200 if self.path.split("?")[0] in files else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # quiet in the test's output
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def page_for(self, server: ServerProcess, pin: str, archive: bytes) -> str:
        """The attack on ``server``, at a URL of another origin (localhost, not 127.0.0.1)."""
        html = ATTACK_PAGE % {
            "target": json.dumps(server.base_url),
            "model": json.dumps(MODEL),
            "pin": json.dumps(pin),
        }
        self.files["/"] = ("text/html", html.encode())
        self.files["/archive.tar"] = ("application/x-tar", archive)
        return f"http://localhost:{self.port}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_server(tiny_model_dir, work, *key: str) -> ServerProcess:
    return ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        *key,
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    with start_server(tiny_model_dir, tmp_path_factory.mktemp("keyed"), "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_any_origin(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("any-origin")
    with start_server(tiny_model_dir, work, "--api-key", KEY, "--allowed-origin", "*") as s:
        yield s


@pytest.fixture(scope="module")
def open_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    with start_server(tiny_model_dir, tmp_path_factory.mktemp("open")) as s:
        yield s


@pytest.fixture(scope="module")
def attacker() -> Iterator[AttackerSite]:
    site = AttackerSite()
    try:
        yield site
    finally:
        site.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # DNS rebinding without a DNS server: the attacker's name resolves to this machine.
    with chromium.headless("--host-resolver-rules=MAP rebind.test 127.0.0.1") as driver:
        yield driver


def answers(server: ServerProcess, headers: dict[str, str]) -> Counter:
    """The server's own count of its answers: ``(route, method, status) -> n``."""
    text = httpx.get(server.base_url + "/metrics", headers=headers, timeout=30).text
    counts: Counter = Counter()
    for line in text.splitlines():
        if m := METRIC.match(line):
            counts[(m.group(2), m.group(1), int(m.group(3)))] = int(float(m.group(4)))
    return counts


def state(server: ServerProcess, headers: dict[str, str]) -> dict[str, Any]:
    return httpx.get(server.base_url + "/v1/dashboard/state", headers=headers, timeout=30).json()


def prepare(server: ServerProcess, headers: dict[str, str]) -> tuple[str, bytes]:
    """A cached conversation, a pin on it and its exported archive, made the honest way."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    chat = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    url = server.base_url
    assert httpx.post(url + "/v1/chat/completions", json=chat, headers=headers).status_code == 200
    body = {"model": MODEL, "messages": messages, "ttl_seconds": 600}
    pin = httpx.post(url + "/v1/cache/pins", json=body, headers=headers, timeout=30)
    assert pin.status_code == 201, pin.text
    exported = httpx.post(
        url + "/v1/cache/export", json={"model": MODEL, "messages": messages}, headers=headers
    )
    assert exported.status_code == 200 and len(exported.content) > 0, exported.text
    return pin.json()["id"], exported.content


def attack(
    server: ServerProcess, headers: dict[str, str], driver: Any, attacker: AttackerSite
) -> Counter:
    """Run the attacker's page against ``server``; assert nothing went through. The
    server's answers to the page: ``(route, method, status) -> n``."""
    pin, archive = prepare(server, headers)
    before_answers, before = answers(server, headers), state(server, headers)
    page = attacker.page_for(server, pin, archive)
    driver.get(page)
    wait_for("the attack page", lambda: driver.execute_script("return window.attackDone"), 60)
    for k in range(TOP_POSTS):
        driver.get(f"{page}?top={k}")
        wait_for(
            f"top-level post {k}",
            lambda: (
                urlsplit(driver.current_url).port == server.port
                and driver.execute_script("return document.readyState") == "complete"
            ),
        )
    after_answers, after = answers(server, headers), state(server, headers)

    new = after_answers - before_answers
    for (route, method), tries in ATTEMPTS.items():
        got = {status: n for (r, m, status), n in new.items() if (r, m) == (route, method)}
        # Each attempt arrived, and each was refused: by Origin (403) or body type (415).
        assert sum(got.values()) >= tries, f"{method} {route}: {got}, expected {tries} attempts"
        assert set(got) <= {403, 415}, f"{method} {route} answered {got}"
    ours = {"/metrics", "/v1/dashboard/state"}  # the test's own reads between the snapshots
    through = [
        k for k, n in new.items() if k[2] < 400 and n and k[0] not in ours and k[1] != "OPTIONS"
    ]
    assert not through, f"something went through: {new}"
    # The cross-origin DELETE needs a preflight, which grants no CORS (refused, or a bare
    # 204 with every origin allowed): the DELETE itself never came.
    one_pin = "/v1/cache/pins/{pin_id}"
    assert sum(n for k, n in new.items() if k[:2] == (one_pin, "OPTIONS")) == 1, new
    assert not [k for k in new if k[:2] == (one_pin, "DELETE")], new
    # The server's state says the same: no request served, no pin made or dropped, the
    # model still loaded, its cache neither cleared nor vacuumed.
    assert after["requests"] == before["requests"]
    assert [p["id"] for p in after["pins"][MODEL]] == [pin]
    (model_before,) = [m for m in before["models"] if m["id"] == MODEL]
    (model_after,) = [m for m in after["models"] if m["id"] == MODEL]
    assert model_after["state"] == "loaded"
    hot_before, hot_after = model_before["cache"]["hot"], model_after["cache"]["hot"]
    assert hot_after["blocks"] == hot_before["blocks"] > 0
    listed = httpx.get(server.base_url + "/v1/cache/pins", headers=headers).json()["data"]
    assert [p["id"] for p in listed] == [pin]
    return new


def test_another_sites_page_cannot_act_through_a_browser_logged_in_to_the_dashboard(
    keyed, attacker, browser
):
    # Logged in: the dashboard's Basic credentials are stored for the server's origin.
    browser.get(keyed.base_url.replace("http://", f"http://omlx:{KEY}@") + "/dashboard")
    wait_for(
        "the dashboard",
        lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-model="{MODEL}"]'),
    )
    attack(keyed, BEARER, browser, attacker)
    refused_by_name(keyed, BEARER, browser)


def test_with_every_origin_allowed_bodies_and_the_login_still_hold(
    keyed_any_origin, attacker, browser
):
    """``--allowed-origin '*'`` turns the Origin rule off: the body types and the Basic
    credentials' own check still refuse everything the page sends."""
    browser.get(keyed_any_origin.base_url.replace("http://", f"http://omlx:{KEY}@") + "/dashboard")
    wait_for(
        "the dashboard",
        lambda: browser.find_element(By.CSS_SELECTOR, f'tr[data-model="{MODEL}"]'),
    )
    new = attack(keyed_any_origin, BEARER, browser, attacker)
    # The top-level posts carry the stored Basic credentials: refused by their own check
    # (403) before their bodies' type is looked at. Every other attempt (no credentials)
    # sends text/plain or form bodies: 415. Even a Blob typed application/x-tar goes out
    # of a no-cors fetch without that type, so the import refuses it by type as well.
    for route, in_page in (
        ("/v1/chat/completions", 3),
        ("/v1/cache/pins", 2),
        ("/v1/cache/import", 2),
        ("/v1/dashboard/models/{model_id}/unload", 2),
        ("/v1/dashboard/pins/{pin_id}/unpin", 2),
    ):
        assert new[(route, "POST", 415)] == in_page, new
        assert new[(route, "POST", 403)] == 1, new


def test_another_sites_page_cannot_act_on_a_server_without_a_key(open_server, attacker, browser):
    attack(open_server, {}, browser, attacker)
    refused_by_name(open_server, {}, browser)


def refused_by_name(server: ServerProcess, headers: dict[str, str], driver: Any) -> None:
    """DNS rebinding: a name that resolves here but is not this server's is refused."""
    rebound = f"http://rebind.test:{server.port}/v1/dashboard/state"
    driver.get(rebound)
    body = wait_for("the refusal", lambda: driver.find_element(By.TAG_NAME, "body").text)
    assert "host_not_allowed" in body and "rebind.test" in body
    direct = httpx.get(
        server.base_url + "/v1/models",
        headers={**headers, "Host": f"attacker.example:{server.port}"},
    )
    assert direct.status_code == 421 and direct.json()["error"]["code"] == "host_not_allowed"
    # The server's own names still answer: what agent CLIs and SDKs send.
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        ok = httpx.get(server.base_url + "/v1/models", headers={**headers, "Host": host})
        assert ok.status_code == 200
