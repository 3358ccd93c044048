"""Progress of long work a person waits for: a bar on a terminal, plain lines elsewhere.

One rule for both: nothing is shown for work shorter than one interval (0.1 s for a
bar, ``OMLX_PROGRESS_INTERVAL`` seconds, default 5, for lines), then at most one update
per interval and a last one when the work ends. Lines go to a logger (the server) or a
stream (the admin commands, stderr, so ``--json`` on stdout stays clean).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

from omlx.domain.generation import Finished, PrefillProgress, PrefillStarted, TextDelta
from omlx.domain.sizes import format_bytes

T = TypeVar("T")

BAR_INTERVAL_S = 0.1
LINE_INTERVAL_S = 5.0
PREFILL_MIN_TOKENS = 1024  # shorter prefills are not worth a progress line
_BAR_WIDTH = 24

log = logging.getLogger(__name__)


def line_interval() -> float:
    """Seconds between plain progress lines: ``OMLX_PROGRESS_INTERVAL``, default 5."""
    raw = os.environ.get("OMLX_PROGRESS_INTERVAL", "")
    try:
        return max(0.0, float(raw)) if raw.strip() else LINE_INTERVAL_S
    except ValueError:
        return LINE_INTERVAL_S


def _is_tty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


class Reporter:
    """Counts done units of one piece of work and shows it, rate-limited.

    ``total=None``: the size is unknown (a count and the time are shown).
    ``unit="bytes"`` shows sizes (``1.2 GB/4.0 GB``); any other unit follows the counts.
    """

    def __init__(
        self,
        label: str | Callable[[], str],
        total: int | None = None,
        unit: str = "",
        *,
        stream: IO[str] | None = None,
        logger: logging.Logger | None = None,
        bar: bool | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self.logger = logger
        self.stream = stream if stream is not None or logger is not None else sys.stderr
        self.bar = _is_tty(self.stream) if bar is None else bar
        self.interval = (
            interval if interval is not None else (BAR_INTERVAL_S if self.bar else line_interval())
        )
        self._clock = clock
        self.started = self._last = clock()
        self.shown = 0  # updates shown so far
        self._shown_done = -1  # ``done`` at the last update shown
        self.closed = False

    @property
    def label(self) -> str:
        return self._label() if callable(self._label) else self._label

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        now = self._clock()
        if now - self._last >= self.interval:
            self._last = now
            self._show(now, final=False)

    def close(self, note: str = "") -> None:
        """The work ended: a last update, if any was shown or the work outlasted an interval."""
        if self.closed:
            return
        self.closed = True
        now = self._clock()
        repeat = not self.bar and not note and self._shown_done == self.done
        if (self.shown or now - self.started >= self.interval) and not repeat:
            self._show(now, final=True, note=note)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close("stopped" if exc[0] is not None else "")

    # ---- rendering ------------------------------------------------------------------

    def _count(self, n: int) -> str:
        return format_bytes(n) if self.unit == "bytes" else f"{n:,}"

    def _amount(self) -> str:
        unit = "" if self.unit in ("", "bytes") else f" {self.unit}"
        if self.total is None:
            return f"{self._count(self.done)}{unit}"
        return f"{self._count(self.done)}/{self._count(self.total)}{unit}"

    def _percent(self) -> int | None:
        if not self.total:
            return None
        return min(100, self.done * 100 // self.total)

    def line(self, now: float, note: str = "") -> str:
        """``label: 4,096/17,000 tokens (24%), 3.1 s``."""
        pct = self._percent()
        text = f"{self.label}: {self._amount()}"
        if pct is not None:
            text += f" ({pct}%)"
        text += f", {now - self.started:.1f} s"
        return f"{text}, {note}" if note else text

    def bar_text(self, now: float) -> str:
        """``label [#########---------------]  37% 3,700/10,000 blocks 3.1 s``."""
        pct = self._percent()
        if pct is None:
            return f"{self.label} {self._amount()} {now - self.started:.1f} s"
        filled = _BAR_WIDTH * pct // 100
        meter = "#" * filled + "-" * (_BAR_WIDTH - filled)
        return f"{self.label} [{meter}] {pct:3d}% {self._amount()} {now - self.started:.1f} s"

    def _show(self, now: float, final: bool, note: str = "") -> None:
        self.shown += 1
        self._shown_done = self.done
        if self.bar:
            assert self.stream is not None
            tail = f" {note}" if note else ""
            self.stream.write("\r" + self.bar_text(now) + tail + ("\n" if final else ""))
            self.stream.flush()
        elif self.logger is not None:
            self.logger.info("%s", self.line(now, note))
        else:
            assert self.stream is not None
            self.stream.write(self.line(now, note) + "\n")
            self.stream.flush()


def track(
    items: Iterable[T],
    length: int | None,
    label: str,
    *,
    stream: IO[str] | None = None,
    logger: logging.Logger | None = None,
) -> Iterator[T]:
    """``items``, counted as they are consumed: lines in ``logger``, or on ``stream``
    (default stderr; a bar when it is a terminal).

    The shape of ``blockfiles.maintenance.Progress``: the admin commands pass it there.
    """
    reporter = Reporter(label, length, stream=stream, logger=logger)
    with reporter:
        for item in items:
            yield item
            reporter.advance()


def for_log(logger: logging.Logger, label: str, total: int | None, unit: str = "") -> Reporter:
    """Progress of server work: a bar when stderr is a terminal, else lines in the log."""
    if _is_tty(sys.stderr):
        return Reporter(label, total, unit, stream=sys.stderr, bar=True)
    return Reporter(label, total, unit, logger=logger)


class PrefillWatch:
    """Logs a long prefill's progress from one request's engine events.

    The engine calls the request's ``emit`` on its own thread at each prefill chunk;
    the generation service passes every event here first. Prefills of fewer than
    ``min_tokens`` uncached tokens are not logged.
    """

    def __init__(
        self,
        model_id: str,
        *,
        logger: logging.Logger = log,
        min_tokens: int = PREFILL_MIN_TOKENS,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_id = model_id
        self.request_id: int | None = None  # the engine's id, known once submitted
        self.logger = logger
        self.min_tokens = min_tokens
        self.interval = interval
        self._clock = clock
        self._cached = 0
        self._reporter: Reporter | None = None

    def _label(self) -> str:
        who = f"request {self.request_id}" if self.request_id is not None else "a request"
        return f"{who} ({self.model_id}) prefill"

    def __call__(self, event: object) -> None:
        if isinstance(event, PrefillStarted):
            todo = event.prompt_tokens - event.cached_tokens
            if todo >= self.min_tokens:
                self._cached = event.cached_tokens
                self._reporter = Reporter(
                    self._label,
                    todo,
                    "tokens",
                    logger=self.logger,
                    interval=self.interval,
                    clock=self._clock,
                )
        elif self._reporter is None:
            return
        elif isinstance(event, PrefillProgress):
            self._reporter.update(event.done - self._cached)
        else:  # the first token, or the end: the prefill is over
            finished = isinstance(event, TextDelta) or (
                isinstance(event, Finished) and event.reason != "cancelled"
            )
            if finished and self._reporter.total is not None:
                self._reporter.done = self._reporter.total
            self._reporter.close("" if finished else "stopped")
            self._reporter = None
