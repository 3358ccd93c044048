"""Where an object store's blocks live, and how to reach it: ``s3://bucket/prefix`` and the
usual AWS settings.

Settings are read as the AWS command line reads them: environment variables first
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``),
then the profile ``AWS_PROFILE`` (else ``default``) of the shared files
``~/.aws/credentials`` and ``~/.aws/config`` (or ``AWS_SHARED_CREDENTIALS_FILE`` and
``AWS_CONFIG_FILE``). obstore reads the environment but not those files, so they are
read here and everything is handed to it explicitly.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"  # what S3-compatible stores (SeaweedFS, MinIO, Garage) accept
# Bucket names as S3 allows them (3-63 characters); stores that allow more are not refused.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$", re.IGNORECASE)
# Other ways to credentials obstore follows by itself (a container's role, web identity).
_DELEGATED = (
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


def is_object_store_url(value: str) -> bool:
    """Whether a ``block_store`` setting names an object store (else: the cache folder)."""
    return value.strip().lower().startswith(SCHEME)


@dataclass(frozen=True, slots=True)
class S3Location:
    """A bucket and a key prefix (``""``: the bucket's root; no slash at either end)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """``s3://bucket[/prefix]``; ValueError naming what is wrong."""
        text = url.strip()
        if not is_object_store_url(text):
            raise ValueError(f"block_store {url!r} is not an s3://bucket/prefix URL")
        bucket, _, prefix = text[len(SCHEME) :].partition("/")
        if not _BUCKET.match(bucket):
            raise ValueError(f"block_store {url!r}: {bucket!r} is not a bucket name")
        prefix = prefix.strip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ValueError(f"block_store {url!r}: the prefix has an empty or dot segment")
        return cls(bucket, prefix)

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True, slots=True)
class S3Access:
    """Region, endpoint and credentials for a bucket; None where nothing set one."""

    region: str = DEFAULT_REGION
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    source: str = "environment"  # where the keys came from, for the start-up line

    @property
    def allow_http(self) -> bool:
        """Plain HTTP is allowed only to an endpoint named with it (a loopback SeaweedFS)."""
        return (self.endpoint or "").lower().startswith("http://")

    def config(self) -> dict[str, str]:
        """obstore's ``S3Config`` keys that are set."""
        values = {
            "region": self.region,
            "endpoint": self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "session_token": self.session_token,
        }
        return {k: v for k, v in values.items() if v}


def resolve_access(env: Mapping[str, str] | None = None, home: Path | None = None) -> S3Access:
    """The settings for a bucket from ``env`` (default: this process's) and the shared files.

    Keys come as a pair from one place: the environment's, else the profile's. ValueError
    when ``AWS_PROFILE`` names a profile neither file has, or no keys are found and no
    other source (a container role, web identity) is configured.
    """
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    named = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE")
    profile = named or "default"
    creds_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    from_creds = _section(creds_file, profile)
    from_config = _section(config_file, profile if profile == "default" else f"profile {profile}")
    if named and from_creds is None and from_config is None:
        raise ValueError(f"AWS_PROFILE={named!r}: no such profile in {creds_file} or {config_file}")
    files = {**(from_config or {}), **(from_creds or {})}  # credentials file wins, as in the CLI
    region = (
        env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or files.get("region") or ""
    ).strip() or DEFAULT_REGION
    endpoint = (
        env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or files.get("endpoint_url")
    )
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return S3Access(
            region,
            endpoint,
            env["AWS_ACCESS_KEY_ID"],
            env["AWS_SECRET_ACCESS_KEY"],
            env.get("AWS_SESSION_TOKEN") or None,
            "environment",
        )
    if files.get("aws_access_key_id") and files.get("aws_secret_access_key"):
        return S3Access(
            region,
            endpoint,
            files["aws_access_key_id"],
            files["aws_secret_access_key"],
            files.get("aws_session_token") or None,
            f"profile {profile}",
        )
    if any(env.get(var) for var in _DELEGATED):
        return S3Access(region, endpoint, source="a role obstore assumes")
    raise ValueError(
        "no credentials for the object store: set AWS_ACCESS_KEY_ID and "
        f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with keys in {creds_file}"
    )


def _section(path: Path, name: str) -> dict[str, str] | None:
    """One section of an AWS ini file (keys lower-cased), or None when absent."""
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error) as exc:
        raise ValueError(f"{path}: cannot be read as an AWS settings file ({exc})") from None
    if not parser.has_section(name):
        return None
    return {k.lower(): v.strip() for k, v in parser.items(name) if v.strip()}
