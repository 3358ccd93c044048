"""An object store's location and access, as a user sets them: the URL, the AWS variables and
the shared files; and obstore's errors in one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from omlx.adapters.objectstore.errors import StoreDenied, StoreUnreachable, describe, store_error
from omlx.adapters.objectstore.location import S3Location, is_object_store_url, resolve_access
from omlx.app.settings import load_settings


def test_urls() -> None:
    assert S3Location.parse("s3://bucket/a/b/") == S3Location("bucket", "a/b")
    assert S3Location.parse("S3://bucket") == S3Location("bucket", "")
    assert S3Location.parse("s3://bucket/a/b").url == "s3://bucket/a/b"
    assert S3Location("bucket").url == "s3://bucket"
    for bad in ("http://bucket/x", "s3://", "s3://b", "s3://bucket/a//b", "s3://bucket/../x"):
        with pytest.raises(ValueError):
            S3Location.parse(bad)
    assert is_object_store_url(" s3://b/x") and not is_object_store_url("/mnt/cache")


def test_settings_name_a_bad_block_store() -> None:
    with pytest.raises(ValueError, match="OMLX_BLOCK_STORE"):
        load_settings(env={"OMLX_BLOCK_STORE": "minio://bucket"})
    settings = load_settings(
        env={"OMLX_BLOCK_STORE": "s3://bucket/omlx"}, flags={"read_through_max_size": "5GB"}
    )
    assert settings.block_store == "s3://bucket/omlx" and settings.read_through_bytes == 5 * 10**9
    with pytest.raises(ValueError, match="read_through_max_size"):
        load_settings(flags={"read_through_max_size": "lots"})


def _files(tmp_path: Path, credentials: str, config: str = "") -> dict[str, str]:
    (tmp_path / "credentials").write_text(credentials)
    (tmp_path / "config").write_text(config)
    return {
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
    }


def test_the_environment_comes_first(tmp_path: Path) -> None:
    files = _files(tmp_path, "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = F\n")
    env = {
        **files,
        "AWS_ACCESS_KEY_ID": "ENVKEY",
        "AWS_SECRET_ACCESS_KEY": "E",
        "AWS_SESSION_TOKEN": "T",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    access = resolve_access(env, home=tmp_path)
    assert (access.access_key_id, access.secret_access_key, access.session_token) == (
        "ENVKEY",
        "E",
        "T",
    )
    assert access.endpoint == "http://127.0.0.1:9000"  # the S3 one beats the general one
    assert access.region == "eu-west-1" and access.allow_http and access.source == "environment"
    assert resolve_access({**env, "AWS_REGION": "us-west-2"}, home=tmp_path).region == "us-west-2"


def test_a_profile_from_the_shared_files(tmp_path: Path) -> None:
    env = _files(
        tmp_path,
        "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
        "[lab]\naws_access_key_id = LAB\naws_secret_access_key = LS\n",
        "[profile lab]\nregion = ap-south-1\nendpoint_url = https://s3.lab.example\n",
    )
    access = resolve_access({**env, "AWS_PROFILE": "lab"}, home=tmp_path)
    assert (access.access_key_id, access.secret_access_key) == ("LAB", "LS")
    assert access.region == "ap-south-1" and access.endpoint == "https://s3.lab.example"
    assert not access.allow_http and access.source == "profile lab"
    default = resolve_access(env, home=tmp_path)
    assert (
        default.access_key_id == "D" and default.region == "us-east-1" and default.endpoint is None
    )
    with pytest.raises(ValueError, match="nope"):
        resolve_access({**env, "AWS_PROFILE": "nope"}, home=tmp_path)


def test_no_keys_anywhere_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID"):
        resolve_access({}, home=tmp_path)
    role = resolve_access({"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/token"}, home=tmp_path)
    assert role.access_key_id is None and role.config() == {"region": "us-east-1"}


_REFUSED = """Generic S3 error: Error performing GET http://127.0.0.1:1/b?list-type=2 in 545µs - \
Server returned non-2xx status code: 403 Forbidden: <?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature...</Message></Error>

Debug source:
Generic {
    store: "S3",
}"""
_DOWN = """Generic S3 error: Error performing GET http://127.0.0.1:1/b/x in 2.001574454s, after \
2 retries, max_retries: 2, retry_timeout: 4s  - HTTP error: error sending request

Debug source:
..."""
_SLOW = """Generic S3 error: Error performing PUT http://h/b/k in 12ms - Server returned non-2xx \
status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>"""


def test_errors_in_one_short_line() -> None:
    assert describe(Exception(_REFUSED)) == "HTTP 403 SignatureDoesNotMatch"
    assert describe(Exception(_DOWN)) == "HTTP error: error sending request after 2.00 s"
    refused = store_error(Exception(_REFUSED), "LIST s3://b")
    down = store_error(Exception(_DOWN), "GET k")
    slow = store_error(Exception(_SLOW), "PUT k")
    assert isinstance(refused, StoreDenied) and str(refused).count("\n") == 0
    assert isinstance(down, StoreUnreachable) and isinstance(slow, StoreUnreachable)
    assert str(slow) == "PUT k: HTTP 503 SlowDown"
    missing = store_error(FileNotFoundError("Object at location k not found: ..."), "GET k")
    assert type(missing) is FileNotFoundError
