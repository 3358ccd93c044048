"""Settings: config/omlx.toml, then OMLX_* environment variables, then CLI flags (STYLE §10)."""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, get_origin

import msgspec

from omlx.app.config_errors import check_file_keys, describe_invalid, name_origin
from omlx.domain.cache.kv_quant import KVQuant, kv_quant_of, parse_kv_mode
from omlx.domain.json_values import JsonObject
from omlx.domain.responses import Retention
from omlx.domain.sizes import parse_size
from omlx.domain.tier_defaults import AUTO, COLD_TIER_DEFAULT, HOT_TIER_DEFAULT

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/\s]+/?$")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every key is documented in config/omlx.toml."""

    model: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    api_key: str = ""
    api_keys_file: str = ""
    report_excerpts: bool = True  # quote the prompt and the cache where they part, in reports
    allowed_hosts: tuple[str, ...] = ()  # Host names answered beside this machine's own; "*": any
    allowed_origins: tuple[str, ...] = ()  # web origins whose requests are accepted; "*": any
    cache_enabled: bool = True
    block_size: int = 64
    kv_bits: str = "off"  # "off", "8" or "4": blocks stored quantized (domain/cache/kv_quant.py)
    kv_group_size: int = 64
    kv_mode: str = "auto"  # "auto", "exact" or "store": how kv_bits quantizes (kv_quant.py)
    hot_cache_max_size: str = HOT_TIER_DEFAULT
    paged_ssd_cache_dir: str = "~/.omlx/cache"
    paged_ssd_cache_max_size: str = COLD_TIER_DEFAULT
    ssd_cache_enabled: bool = True
    warm_restart: bool = True  # record RAM's hot set, read it back from the SSD tier at start
    warm_restart_record_seconds: float = 60.0  # how often the hot set is recorded when it changed
    prepared_weights_max_size: str = "16GB"
    index_url: str = ""
    block_store: str = ""  # s3://bucket/prefix: blocks in an object store; "": the cache folder
    read_through_max_size: str = "20GB"  # local copies of an object store's blocks
    server_id: str = ""
    eviction_lease_seconds: float = 60.0
    reconcile_grace_seconds: float = 60.0
    max_concurrent_requests: int = 8
    max_queued_requests: int = 64
    speculation: bool = True
    draft_model: str = ""
    speculation_max_draft: int = 12
    speculation_max_rows: int = 1
    prefill_step_size: int = 256
    kv_memory_limit: str = "auto"
    default_max_tokens: int = 1024
    max_request_body_bytes: int = 16_000_000
    max_import_bytes: int = 8 * 1024**3  # a cache archive (POST /v1/cache/import), streamed
    max_import_blocks: int = 100_000  # blocks in one archive
    max_image_pixels: int = 25_000_000  # width x height of one image, read from its header
    max_image_bytes: int = 20 * 1024**2  # one image, encoded (as sent, or fetched)
    max_images_per_request: int = 16
    allow_image_urls: bool = False  # fetch http(s) image URLs (else data URLs only)
    image_url_timeout_s: float = 10.0  # the whole fetch of one image URL
    models: tuple[str, ...] = ()  # more models beside ``model`` (--model, repeated)
    model_dir: str = ""
    max_model_memory: str = "auto"
    pin_models: tuple[str, ...] = ()
    model_idle_timeout: float = 0.0  # seconds; 0: never unload for idleness
    model_aliases: tuple[str, ...] = ("claude-*",)
    answer_any_model: bool = False
    prompt_normalizations: tuple[str, ...] = ("claude_code_billing_header",)
    responses_max_stored: int = 1000
    responses_max_age_days: int = 30
    responses_max_size: str = "256MB"  # all stored responses together
    dashboard_sample_seconds: float = 5.0

    @property
    def hot_cache_auto(self) -> bool:
        """``hot_cache_max_size = "auto"``: each model's hot tier sized at its load."""
        return str(self.hot_cache_max_size).strip().lower() == AUTO

    @property
    def hot_cache_bytes(self) -> int | None:
        """The hot tier's budget per model; None for ``auto`` (``auto_hot_tier_bytes``)."""
        return None if self.hot_cache_auto else parse_size(self.hot_cache_max_size)

    @property
    def ssd_cache_bytes(self) -> int:
        return parse_size(self.paged_ssd_cache_max_size)

    @property
    def read_through_bytes(self) -> int:
        return parse_size(self.read_through_max_size)

    @property
    def prepared_weights_bytes(self) -> int:
        return parse_size(self.prepared_weights_max_size)

    @property
    def kv_memory_limit_bytes(self) -> int | None:
        """The guard's limit in bytes; None for "auto" (the engine side decides) or "off"."""
        value = str(self.kv_memory_limit).strip().lower()
        return None if value in ("auto", "off") else parse_size(self.kv_memory_limit)

    @property
    def kv_memory_guard(self) -> bool:
        return str(self.kv_memory_limit).strip().lower() != "off"

    @property
    def responses_retention(self) -> Retention:
        return Retention(
            self.responses_max_stored,
            self.responses_max_age_days,
            parse_size(self.responses_max_size),
        )

    @property
    def model_list(self) -> tuple[str, ...]:
        """Every model named (``model`` then ``models``); empty: the default or ``model_dir``."""
        return tuple(m for m in (self.model, *self.models) if m)

    def max_model_memory_bytes(self, ram: int | None) -> int | None:
        """The limit on loaded models' weights plus KV: "auto" is RAM less 8 GB (at least
        half of RAM), "off" none, else a size."""
        value = str(self.max_model_memory).strip().lower()
        if value == "off":
            return None
        if value == "auto":
            return None if ram is None else max(ram - 8 * 10**9, ram // 2)
        return parse_size(self.max_model_memory)

    @property
    def kv_quant(self) -> KVQuant | None:
        """The KV quantization blocks are stored with, in ``store`` mode (``kv_mode`` is
        resolved per model, where the backend is known: ``model_loader.kv_quant_for``);
        None when ``kv_bits`` is off."""
        return kv_quant_of(self.kv_bits, self.kv_group_size)

    @property
    def cache_dir(self) -> Path:
        return Path(self.paged_ssd_cache_dir).expanduser()

    @property
    def server_identity(self) -> str:
        """This server's name among those sharing an index: ``server_id``, or host and port."""
        return self.server_id or f"{socket.gethostname()}-{self.port}"

    def validate(self) -> Settings:
        """Raise ValueError with a readable message for impossible values."""
        if not 1 <= self.block_size <= 4096:
            raise ValueError("block_size must be between 1 and 4096")
        if self.max_concurrent_requests < 1 or self.max_queued_requests < 0:
            raise ValueError("max_concurrent_requests must be >= 1 and max_queued_requests >= 0")
        if self.prefill_step_size < 1:
            raise ValueError("prefill_step_size must be >= 1")
        if not 1 <= self.speculation_max_draft <= 64:
            raise ValueError("speculation_max_draft must be between 1 and 64")
        if self.speculation_max_rows < 1:
            raise ValueError("speculation_max_rows must be >= 1")
        self.kv_quant  # noqa: B018 - raises naming kv_bits or kv_group_size
        parse_kv_mode(self.kv_mode)
        for key in (
            "hot_cache_max_size",
            "paged_ssd_cache_max_size",
            "prepared_weights_max_size",
            "read_through_max_size",
        ):
            if key == "hot_cache_max_size" and self.hot_cache_auto:
                continue
            try:  # parse now so a bad size fails at start, naming its key
                parse_size(getattr(self, key))
            except ValueError as exc:
                also = ', or "auto" (sized per model)' if key == "hot_cache_max_size" else ""
                raise ValueError(f"{key}: {exc}{also}") from None
        try:
            kv_limit = self.kv_memory_limit_bytes
        except ValueError as exc:
            raise ValueError(f"kv_memory_limit: {exc}") from None
        if kv_limit == 0:
            raise ValueError('kv_memory_limit must be a size above 0, "auto" or "off"')
        from omlx.app.chat.normalize import PromptNormalizer

        PromptNormalizer(self.prompt_normalizations)  # raises naming an unknown rule
        if self.model_idle_timeout < 0:
            raise ValueError("model_idle_timeout must be >= 0 seconds (0: never)")
        if str(self.max_model_memory).strip().lower() not in ("auto", "off"):
            try:  # a bad size fails at start
                parse_size(self.max_model_memory)
            except ValueError as exc:
                raise ValueError(f"max_model_memory: {exc}") from None
        if self.max_import_bytes < 1 or self.max_import_blocks < 1:
            raise ValueError("max_import_bytes and max_import_blocks must be >= 1")
        if min(self.max_image_pixels, self.max_image_bytes, self.max_images_per_request) < 1:
            raise ValueError(
                "max_image_pixels, max_image_bytes and max_images_per_request must be >= 1"
            )
        if self.image_url_timeout_s <= 0:
            raise ValueError("image_url_timeout_s must be > 0")
        if self.dashboard_sample_seconds <= 0:
            raise ValueError("dashboard_sample_seconds must be > 0")
        if self.warm_restart_record_seconds <= 0:
            raise ValueError("warm_restart_record_seconds must be > 0")
        if self.eviction_lease_seconds < 0 or self.reconcile_grace_seconds < 0:
            raise ValueError("eviction_lease_seconds and reconcile_grace_seconds must be >= 0")
        if self.index_url and not _URL.match(self.index_url):
            raise ValueError(
                f"index_url {self.index_url!r} is not a URL: sqlite:///PATH or postgresql+psycopg://…"
            )
        if self.block_store:
            from omlx.adapters.objectstore.location import S3Location

            S3Location.parse(self.block_store)  # raises naming block_store
        for origin in self.allowed_origins:
            if origin != "*" and not _ORIGIN.match(origin.strip()):
                raise ValueError(
                    f"allowed_origins: {origin!r} is not an origin: scheme://host[:port], "
                    'e.g. "https://llm.example.com", or "*"'
                )
        for host in self.allowed_hosts:
            if not host.strip() or "/" in host:
                raise ValueError(
                    f'allowed_hosts: {host!r} is not a host name: e.g. "llm.example.com", or "*"'
                )
        self.responses_retention  # noqa: B018 - raises for an impossible retention
        return self


def default_config_text() -> str:
    return resources.files("omlx._config").joinpath("omlx.toml").read_text(encoding="utf-8")


# Flags whose names are not ``--`` plus the key with dashes.
_FLAG_NAMES = {
    "models": "--model",
    "pin_models": "--pin-model",
    "allowed_hosts": "--allowed-host",
    "allowed_origins": "--allowed-origin",
    "model_aliases": "--model-alias",
    "answer_any_model": "--any-model",
    "cache_enabled": "--no-cache",
    "speculation": "--no-speculation",
    "ssd_cache_enabled": "--no-ssd-cache",
    "warm_restart": "--no-warm-restart",
    "prompt_normalizations": "--no-prompt-normalization",
    "image_url_timeout_s": "--image-url-timeout",
}


def load_settings(
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    added_aliases: Sequence[str] = (),
) -> Settings:
    """Defaults from the packaged TOML, then ``config_file``, env, then non-None flags.

    ``added_aliases`` (``--model-alias``) come first, before the aliases those give (the
    default ``claude-*`` included): a flag adds a name, and replaces only an alias of the
    same NAME. ValueError messages name the file, variable or flag at fault.
    """
    values: JsonObject = tomllib.loads(default_config_text())
    known = [field.name for field in msgspec.structs.fields(Settings)]
    origins: dict[str, str] = {}
    if config_file is not None:
        try:
            from_file = tomllib.loads(Path(config_file).read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{config_file}: not valid TOML: {exc}") from None
        check_file_keys(str(config_file), from_file, known)
        values.update(from_file)
        origins.update(dict.fromkeys(from_file, str(config_file)))
    env = os.environ if env is None else env
    for field in msgspec.structs.fields(Settings):
        var = f"OMLX_{field.name.upper()}"
        raw = env.get(var)
        if raw is not None:
            try:  # the field's type, not the TOML value's: model_idle_timeout = 0 is a float
                values[field.name] = _from_env(raw, get_origin(field.type) or field.type)
            except ValueError:
                kind = get_origin(field.type) or field.type
                raise ValueError(f"{var}={raw!r}: expected {_ENV_WORDS.get(kind, kind)}") from None
            origins[field.name] = var
    for key, value in (flags or {}).items():
        if value is not None:
            values[key] = value
            origins[key] = _FLAG_NAMES.get(key, "--" + key.replace("_", "-"))
    configured = values.get("model_aliases", ())
    if added_aliases and isinstance(configured, list | tuple):  # else msgspec names the bad type
        names = {spec.partition("=")[0].strip() for spec in added_aliases}
        kept = [a for a in configured if str(a).partition("=")[0].strip() not in names]
        values["model_aliases"] = [*added_aliases, *kept]
        origins["model_aliases"] = "--model-alias"
    if isinstance(values.get("kv_bits"), int) and not isinstance(values["kv_bits"], bool):
        values["kv_bits"] = str(values["kv_bits"])  # kv_bits = 8 in TOML means "8"
    try:
        settings = msgspec.convert(values, Settings)
    except msgspec.ValidationError as exc:
        raise ValueError(describe_invalid(str(exc), origins, values)) from None
    try:
        return settings.validate()
    except ValueError as exc:
        raise ValueError(name_origin(str(exc), origins)) from None


_ENV_WORDS = {int: "a whole number", float: "a number"}


def _from_env(raw: str, kind: type) -> Any:
    if kind in (list, tuple):  # comma-separated
        return [item.strip() for item in raw.split(",") if item.strip()]
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind is int:
        return int(raw)
    if kind is float:
        return float(raw)
    return raw
