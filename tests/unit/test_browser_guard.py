"""The browser guard's rules, one by one, through the app's own routes (api.browser_guard):
JSON bodies only, foreign Origins and Hosts refused, Basic credentials only from the
server's own page, and no answer shown in another site's frame."""

from __future__ import annotations

import base64
import re
import socket

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.settings import load_settings
from tests.unit.api_fakes import MODEL, TEST_CLIENT_HOST, FakeEngine, fake_container

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OWN = f"http://{TEST_CLIENT_HOST}"
BEARER = {"Authorization": "Bearer k1"}


def basic(key: str = "k1") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"anyone:{key}".encode()).decode()}


def client(**settings) -> TestClient:
    return TestClient(create_app(fake_container(FakeEngine(), **settings)))


# ---- bodies: JSON only ----------------------------------------------------------------


def test_bodies_a_cross_site_form_can_send_are_refused_naming_the_content_type():
    with client() as c:
        plain = c.post(
            "/v1/chat/completions",
            content=b'{"model": "fake", "messages": []}',
            headers={"content-type": "text/plain;charset=UTF-8"},
        )
        form = c.post("/v1/chat/completions", data={"model": MODEL})
        multipart = c.post("/v1/cache/pins", files={"f": b"{}"})
        untyped = c.post("/v1/dashboard/models/fake/unload")  # a no-cors fetch without a body
        anthropic = c.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})
        json_ok = c.post("/v1/chat/completions", json=CHAT)
        suffixed = c.post(
            "/v1/chat/completions",
            content=b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}]}',
            headers={"content-type": "application/vnd.omlx+json; charset=utf-8"},
        )
    for refused in (plain, form, multipart, untyped):
        assert refused.status_code == 415, refused.text
        error = refused.json()["error"]
        assert error["param"] == "content-type" and error["code"] == "unsupported_media_type"
        assert "application/json" in error["message"]
    assert "'text/plain'" in plain.json()["error"]["message"]
    assert "'none'" in untyped.json()["error"]["message"]
    # The Anthropic route answers in Anthropic's envelope.
    assert anthropic.status_code == 415
    assert anthropic.json()["type"] == "error" and "Content-Type" in anthropic.text
    assert json_ok.status_code == 200 and suffixed.status_code == 200


def test_the_import_takes_an_archive_type_and_nothing_a_form_can_send():
    with client() as c:
        as_json = c.post(f"/v1/cache/import?model={MODEL}", json={})
        as_text = c.post(
            f"/v1/cache/import?model={MODEL}", content=b"x", headers={"content-type": "text/plain"}
        )
        tar = c.post(
            f"/v1/cache/import?model={MODEL}",
            content=b"not a tar",
            headers={"content-type": "application/x-tar"},
        )
        octets = c.post(
            f"/v1/cache/import?model={MODEL}",
            content=b"not a tar",
            headers={"content-type": "application/octet-stream"},
        )
    assert as_json.status_code == as_text.status_code == 415
    assert "application/x-tar or application/octet-stream" in as_json.json()["error"]["message"]
    # Past the guard: the import itself refuses the bytes (400, not 415).
    for passed in (tar, octets):
        assert passed.status_code == 400
        assert passed.json()["error"]["code"] != "unsupported_media_type"


# ---- Origin ---------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", ["", "k1"])
def test_requests_from_another_origin_are_refused_on_every_method(api_key):
    auth = BEARER if api_key else {}
    with client(api_key=api_key) as c:
        foreign = {**auth, "origin": "http://localhost:9999"}
        chat = c.post("/v1/chat/completions", json=CHAT, headers=foreign)
        read = c.get("/v1/models", headers=foreign)
        unpin = c.delete("/v1/cache/pins/nope", headers=foreign)
        sandboxed = c.post("/v1/chat/completions", json=CHAT, headers={**auth, "origin": "null"})
        own = c.post("/v1/chat/completions", json=CHAT, headers={**auth, "origin": OWN})
        tool = c.post("/v1/chat/completions", json=CHAT, headers=auth)  # SDKs send no Origin
    for refused in (chat, read, unpin, sandboxed):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "origin_not_allowed"
        assert "--allowed-origin" in refused.json()["error"]["message"]
    assert own.status_code == tool.status_code == 200


def test_an_operator_lists_origins_or_turns_the_check_off():
    listed = "https://chat.example.com"
    with client(allowed_origins=(listed + "/",)) as c:
        ok = c.post("/v1/chat/completions", json=CHAT, headers={"origin": listed})
        other = c.post(
            "/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"}
        )
    with client(allowed_origins=("*",)) as c:
        any_origin = c.post(
            "/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"}
        )
    assert ok.status_code == 200 and other.status_code == 403
    assert any_origin.status_code == 200


# ---- Host (DNS rebinding) -------------------------------------------------------------


@pytest.mark.parametrize("api_key", ["", "k1"])
def test_a_host_that_is_not_this_servers_name_is_refused(api_key):
    rebound = {**(BEARER if api_key else {}), "host": "attacker.example:8000"}
    with client(api_key=api_key, allowed_hosts=()) as c:
        health = c.get("/health", headers=rebound)
        chat = c.post("/v1/chat/completions", json=CHAT, headers=rebound)
        # Same-origin as far as the rebound browser knows: the Origin matches the Host.
        state = c.get(
            "/v1/dashboard/state", headers={**rebound, "origin": "http://attacker.example:8000"}
        )
    for refused in (health, chat, state):
        assert refused.status_code == 421, refused.text
        error = refused.json()["error"]
        assert error["code"] == "host_not_allowed" and "--allowed-host" in error["message"]
        assert "'attacker.example'" in error["message"]


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8000",
        "localhost:8000",
        "LOCALHOST.",
        "[::1]:8000",
        "192.168.1.7:8000",  # an address on the LAN: rebinding needs a name
        "[fe80::1]",
        f"{socket.gethostname()}:8000",
        "omlx.lan:8000",  # the bound --host
        "llm.example.com",  # listed by the operator
    ],
)
def test_this_servers_names_and_addresses_are_answered(host):
    with client(host="omlx.lan", allowed_hosts=("llm.example.com",)) as c:
        answer = c.post("/v1/chat/completions", json=CHAT, headers={"host": host})
    assert answer.status_code == 200, answer.text


def test_a_wildcard_bind_is_no_name_and_a_star_answers_any():
    with client(host="0.0.0.0", allowed_hosts=()) as c:
        assert c.get("/health", headers={"host": "anything.example"}).status_code == 421
    with client(allowed_hosts=("*",)) as c:
        assert c.get("/health", headers={"host": "anything.example"}).status_code == 200


# ---- Basic credentials: the dashboard's page only -------------------------------------


def test_basic_credentials_act_only_from_the_servers_own_page():
    action = f"/v1/dashboard/models/{MODEL}/clear-cache"
    with client(api_key="k1") as c:
        page = c.get("/dashboard", headers=basic())
        token = _token(page.text)
        again = _token(c.get("/dashboard", headers=basic()).text)
        bare = c.post(action, json={}, headers=basic())
        chat = c.post("/v1/chat/completions", json=CHAT, headers=basic())
        by_origin = c.post(action, json={}, headers={**basic(), "origin": OWN})
        by_fetch_site = c.post(
            action, json={}, headers={**basic(), "sec-fetch-site": "same-origin"}
        )
        cross_site = c.post(action, json={}, headers={**basic(), "sec-fetch-site": "cross-site"})
        by_referer = c.post(action, json={}, headers={**basic(), "referer": OWN + "/dashboard"})
        foreign_referer = c.post(
            action, json={}, headers={**basic(), "referer": "http://localhost:9/x"}
        )
        by_token = c.post(action, json={}, headers={**basic(), "x-omlx-csrf": token})
        wrong_token = c.post(action, json={}, headers={**basic(), "x-omlx-csrf": "0" * 32})
        read = c.get("/v1/dashboard/state", headers=basic())
        bearer = c.post(action, json={}, headers=BEARER)
        api_key_header = c.post(action, json={}, headers={**basic("wrong"), "x-api-key": "k1"})
    assert token == again  # one per key and process
    for refused in (bare, chat, cross_site, foreign_referer, wrong_token):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "csrf_check_failed"
        assert "Bearer" in refused.json()["error"]["message"]
    for ok in (by_origin, by_fetch_site, by_referer, by_token, read, bearer, api_key_header):
        assert ok.status_code == 200, ok.text


def test_a_token_is_bound_to_the_key_the_page_was_opened_with(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("team-b sk-team-b-key-0123 operator\n")  # clearing is an operator's
    action = f"/v1/dashboard/models/{MODEL}/clear-cache"
    with client(api_key="k1", api_keys_file=str(keys)) as c:
        token_a = _token(c.get("/dashboard", headers=basic()).text)
        token_b = _token(c.get("/dashboard", headers=basic("sk-team-b-key-0123")).text)
        crossed = c.post(
            action, json={}, headers={**basic("sk-team-b-key-0123"), "x-omlx-csrf": token_a}
        )
        own = c.post(
            action, json={}, headers={**basic("sk-team-b-key-0123"), "x-omlx-csrf": token_b}
        )
    assert token_a != token_b
    assert crossed.status_code == 403 and own.status_code == 200


def _token(page: str) -> str:
    return re.search(r'name="omlx-csrf" content="([0-9a-f]{32})"', page).group(1)


# ---- frames ---------------------------------------------------------------------------


def test_no_answer_may_be_framed_and_the_pages_own_policy_stays():
    with client() as c:
        api = c.get("/v1/models")
        missing = c.get("/v1/nothing-here")
        refused = c.post(
            "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"}
        )
        page = c.get("/dashboard")
    for response in (api, missing, refused, page):
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert api.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


# ---- settings -------------------------------------------------------------------------


def test_the_settings_come_from_flags_and_the_environment_and_are_checked():
    flags = {"allowed_hosts": ["llm.example.com"], "allowed_origins": ["https://a.example"]}
    from_flags = load_settings(env={}, flags=flags)
    assert from_flags.allowed_hosts == ("llm.example.com",)
    assert from_flags.allowed_origins == ("https://a.example",)
    env = {"OMLX_ALLOWED_ORIGINS": "https://a.example, http://b.example:3000"}
    assert load_settings(env=env).allowed_origins == ("https://a.example", "http://b.example:3000")
    with pytest.raises(ValueError, match=r"--allowed-origin.*not an origin"):
        load_settings(env={}, flags={"allowed_origins": ["a.example"]})
    with pytest.raises(ValueError, match="allowed_hosts"):
        load_settings(env={}, flags={"allowed_hosts": ["http://a.example/"]})
