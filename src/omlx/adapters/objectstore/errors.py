"""An object store's failures as the cold tier's callers expect them: ``FileNotFoundError``
for a missing object, else an ``OSError`` that names its fault in one short line.

obstore raises its own exceptions with the request, the retries and the store's XML
reply in the message (dozens of lines); callers log one line per fault episode
(``disk_faults.FaultEpisodes``), so this keeps the status and the store's error code.
"""

from __future__ import annotations

import re

from omlx.adapters.disk_faults import DENIED, UNREACHABLE

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_TOOK = re.compile(r" in ([\d.]+)(ms|µs|s)\b")
_UNIT_S = {"s": 1.0, "ms": 1e-3, "µs": 1e-6}
# Error codes that mean our credentials or our bucket, not the store's health.
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "NoSuchBucket",
        "ExpiredToken",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
    }
)


class ObjectStoreError(OSError):
    """A request to the object store failed; ``fault`` names the kind (``disk_faults``)."""

    fault = UNREACHABLE


class StoreUnreachable(ObjectStoreError):
    """Down, slow, failing (5xx) or throttling (429, SlowDown): passes by itself; retried."""

    fault = UNREACHABLE


class StoreDenied(ObjectStoreError):
    """The store refuses us: wrong or expired credentials, no such bucket, no permission."""

    fault = DENIED


def describe(exc: BaseException) -> str:
    """One short line for an obstore error: its HTTP status and the store's error code, or
    what failed on the way (a connection, a timeout)."""
    text = str(exc)
    status = _STATUS.search(text)
    code = _CODE.search(text)
    if status or code:
        parts = [f"HTTP {status.group(1)}" if status else "", code.group(1) if code else ""]
        return " ".join(p for p in parts if p)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    # "Error performing GET http://host/bucket/key in 2.0s - HTTP error: error sending request"
    tail = first.rsplit(" - ", 1)[-1].strip()
    took = _TOOK.search(first)
    if took is None:
        return tail[:200]
    seconds = float(took.group(1)) * _UNIT_S[took.group(2)]
    return f"{tail[:200]} after {seconds:.2f} s"


def store_error(exc: BaseException, what: str) -> OSError:
    """``exc`` (raised by obstore while doing ``what``) as the error to raise instead."""
    import obstore.exceptions as obx

    summary = describe(exc)
    if isinstance(exc, FileNotFoundError | obx.NotFoundError):
        if "NoSuchBucket" in str(exc):
            return StoreDenied(f"{what}: no such bucket ({summary})")
        return FileNotFoundError(f"{what}: no such object")
    if isinstance(exc, obx.PermissionDeniedError | obx.UnauthenticatedError):
        return StoreDenied(f"{what}: {summary or 'access denied'}")
    code = _CODE.search(str(exc))
    status = _STATUS.search(str(exc))
    if (code and code.group(1) in _DENIED_CODES) or (status and status.group(1) in ("401", "403")):
        return StoreDenied(f"{what}: {summary}")
    # Anything else (a refused connection, a timeout, 5xx, 429, a reply cut short) is a
    # fault of the store's health: reads miss, writes are tried again later.
    return StoreUnreachable(f"{what}: {summary}")
