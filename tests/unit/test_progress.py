"""The progress reporter: a bar on a terminal, rate-limited lines elsewhere, a prefill's log."""

from __future__ import annotations

import io
import logging

import pytest

from omlx.app.progress import LINE_INTERVAL_S, PrefillWatch, Reporter, line_interval, track
from omlx.domain.generation import Failed, Finished, PrefillProgress, PrefillStarted, TextDelta


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_not_a_terminal_gets_plain_lines_at_the_interval() -> None:
    out, clock = Stream(tty=False), Clock()
    r = Reporter("verifying blocks", 1000, stream=out, interval=4.0, clock=clock)
    assert not r.bar
    for _ in range(1000):  # 1,000 updates over 15.6 s: one line per 4 s, not one per update
        clock.now += 1 / 64
        r.advance()
    r.close()
    assert out.getvalue().splitlines() == [
        "verifying blocks: 256/1,000 (25%), 4.0 s",
        "verifying blocks: 512/1,000 (51%), 8.0 s",
        "verifying blocks: 768/1,000 (76%), 12.0 s",
        "verifying blocks: 1,000/1,000 (100%), 15.6 s",
    ]
    assert "\r" not in out.getvalue()


def test_a_terminal_gets_one_redrawn_bar() -> None:
    out, clock = Stream(tty=True), Clock()
    r = Reporter("verifying blocks", 200, stream=out, clock=clock)
    assert r.bar and r.interval == pytest.approx(0.1)
    for _ in range(200):
        clock.now += 0.01
        r.advance()
    r.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn with \r
    draws = text.split("\r")[1:]
    assert 15 <= len(draws) <= 21  # 2 s of work, at most ten draws a second
    assert draws[-1] == "verifying blocks [########################] 100% 200/200 2.0 s\n"
    half = Reporter("verifying blocks", 200, "blocks", stream=Stream(True), clock=clock)
    half.done = 100
    assert half.bar_text(clock.now + 1) == (
        "verifying blocks [############------------]  50% 100/200 blocks 1.0 s"
    )


def test_short_work_shows_nothing() -> None:
    for tty in (True, False):
        out, clock = Stream(tty), Clock()
        with Reporter("checking index rows", 3, stream=out, clock=clock) as r:
            r.advance(3)
        assert out.getvalue() == ""


def test_unknown_total_counts_without_percent() -> None:
    out, clock = Stream(tty=False), Clock()
    r = Reporter("checking block files", None, stream=out, interval=1.0, clock=clock)
    clock.now += 1.5
    r.advance(1234)
    r.close()
    assert out.getvalue().splitlines() == ["checking block files: 1,234, 1.5 s"]
    bar = Reporter("checking block files", None, stream=Stream(True), clock=clock)
    assert bar.bar_text(clock.now + 2) == "checking block files 0 2.0 s"


def test_bytes_are_shown_as_sizes() -> None:
    clock = Clock()
    r = Reporter("digesting", 4_000_000_000, "bytes", stream=Stream(False), clock=clock)
    r.update(1_500_000_000)
    assert r.line(clock.now + 3) == "digesting: 1.5 GB/4.0 GB (37%), 3.0 s"


def test_lines_to_a_logger(caplog: pytest.LogCaptureFixture) -> None:
    clock, logger = Clock(), logging.getLogger("omlx.test.progress")
    r = Reporter("x", 10, "tokens", logger=logger, interval=1.0, clock=clock)
    assert not r.bar
    with caplog.at_level(logging.INFO, logger="omlx.test.progress"):
        clock.now += 1
        r.update(4)
        r.close("stopped")
    assert [rec.getMessage() for rec in caplog.records] == [
        "x: 4/10 tokens (40%), 1.0 s",
        "x: 4/10 tokens (40%), 1.0 s, stopped",
    ]


def test_track_wraps_an_iterable_and_notes_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Stream(False)
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0")  # a line per item
    assert list(track(iter("abc"), 3, "deleting block files", stream=out)) == ["a", "b", "c"]
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "deleting block files: 1/3 (33%)",
        "deleting block files: 2/3 (66%)",
        "deleting block files: 3/3 (100%)",
    ]
    clock = Clock()
    reporter = Reporter("loop", 10, stream=out, interval=0.0, clock=clock)
    with pytest.raises(KeyError), reporter:
        reporter.advance()
        raise KeyError
    assert out.getvalue().splitlines()[-1] == "loop: 1/10 (10%), 0.0 s, stopped"


def test_line_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMLX_PROGRESS_INTERVAL", raising=False)
    assert line_interval() == LINE_INTERVAL_S
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0.5")
    assert line_interval() == 0.5
    assert Reporter("x", stream=Stream(False)).interval == 0.5
    assert Reporter("x", stream=Stream(True)).interval == pytest.approx(0.1)  # bars keep 10 Hz
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "soon")
    assert line_interval() == LINE_INTERVAL_S


def _prefill(watch: PrefillWatch, clock: Clock, cached: int, prompt: int, end: object) -> None:
    watch(PrefillStarted(cached, prompt))
    done = cached
    while done < prompt - 1:
        clock.now += 1.0  # one 256-token chunk a second
        done = min(done + 256, prompt - 1)
        watch(PrefillProgress(done, prompt))
    clock.now += 0.5
    watch(end)


def test_a_long_prefill_is_logged_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = PrefillWatch("tiny", interval=3.0, min_tokens=1024, clock=clock)
    watch.request_id = 7
    with caplog.at_level(logging.INFO, logger="omlx.app.progress"):
        _prefill(watch, clock, 1024, 1024 + 2560, TextDelta("Hi"))
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == [
        "request 7 (tiny) prefill: 768/2,560 tokens (30%), 3.0 s",
        "request 7 (tiny) prefill: 1,536/2,560 tokens (60%), 6.0 s",
        "request 7 (tiny) prefill: 2,304/2,560 tokens (90%), 9.0 s",
        "request 7 (tiny) prefill: 2,560/2,560 tokens (100%), 10.5 s",
    ]
    watch(TextDelta("more"))  # later tokens log nothing
    assert len(caplog.records) == 4


def test_short_or_cached_prefills_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="omlx.app.progress"):
        # 4,000-token prompt, 3,500 restored: 500 to prefill, under min_tokens
        _prefill(PrefillWatch("tiny", interval=0.0, clock=clock), clock, 3500, 4000, TextDelta("x"))
    assert caplog.records == []


def test_a_cancelled_prefill_says_where_it_stopped(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="omlx.app.progress"):
        watch = PrefillWatch("tiny", interval=100.0, min_tokens=10, clock=clock)
        watch(PrefillStarted(0, 5000))
        clock.now += 200
        watch(PrefillProgress(256, 5000))
        watch(Finished("cancelled", 5000, 0, 0))
        other = PrefillWatch("tiny", interval=100.0, min_tokens=10, clock=clock)
        other(PrefillStarted(0, 5000))
        clock.now += 200
        other(Failed("boom"))
    assert [rec.getMessage() for rec in caplog.records] == [
        "a request (tiny) prefill: 256/5,000 tokens (5%), 200.0 s",
        "a request (tiny) prefill: 256/5,000 tokens (5%), 200.0 s, stopped",
        "a request (tiny) prefill: 0/5,000 tokens (0%), 200.0 s, stopped",
    ]


def test_a_prefill_ending_in_eos_is_complete(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="omlx.app.progress"):
        watch = PrefillWatch("tiny", interval=1.0, min_tokens=10, clock=clock)
        _prefill(watch, clock, 0, 600, Finished("stop", 600, 0, 0))
    assert (
        caplog.records[-1].getMessage() == "a request (tiny) prefill: 600/600 tokens (100%), 3.5 s"
    )
