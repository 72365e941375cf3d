"""The fill's status line and progress bar, from the worker's reports."""

from __future__ import annotations

import io

import pytest

from wcached.daemon.progress import FillMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_line_has_bytes_rate_and_time_left() -> None:
    clock = Clock()
    meter = FillMeter(["llama", "draft"], clock=clock)
    assert meter.status_line() == "filling llama (1 of 2): loading"
    meter.update("llama", 0, 16_000_000_000)
    assert meter.status_line() == "filling llama (1 of 2): 0.0 of 16.0 GB"
    clock.now += 2.0
    meter.update("llama", 4_000_000_000, 16_000_000_000)
    # 4 GB in 2 s: 2 GB/s, 12 GB to go.
    assert meter.status_line() == "filling llama (1 of 2): 4.0 of 16.0 GB, 2.00 GB/s, 6 s left"
    clock.now += 3.0
    meter.update("draft", 0, 0)
    assert meter.status_line() == "filling draft (2 of 2): loading"


@pytest.mark.parametrize(
    ("total", "done", "expected"),
    [
        # Minutes left for a long fill.
        (1_000_000_000_000, 10_000_000_000, "filling m: 10.0 of 1000.0 GB, 1.00 GB/s, 16 min 30 s left"),
        # Nothing left once all of it is read.
        (10, 10, "filling m: 0.0 of 0.0 GB, 0.00 GB/s"),
    ],
)
def test_time_left_after_ten_seconds(total: int, done: int, expected: str) -> None:
    clock = Clock()
    meter = FillMeter(["m"], clock=clock)
    meter.update("m", 0, total)
    clock.now += 10
    meter.update("m", done, total)
    assert meter.status_line() == expected


def test_unknown_model_reports_are_ignored() -> None:
    meter = FillMeter(["m"])
    meter.update("other", 5, 10)
    assert meter.status_line() == "filling m: loading"


def test_terminal_bar_per_model_reaches_the_total() -> None:
    out = io.StringIO()
    meter = FillMeter(["a", "b"], bar_stream=out)
    meter.update("a", 0, 2000)
    meter.update("a", 1000, 2000)
    meter.update("a", 2000, 2000)
    meter.update("a", 2000, 2000)  # a repeated last report draws nothing new
    meter.update("b", 0, 3000)
    meter.update("b", 3000, 3000)
    meter.close()
    text = out.getvalue()
    assert "a: 100%" in text and "2.00k/2.00k " in text, text
    assert "b: 100%" in text and "3.00k/3.00k " in text, text
    assert text.count("a: 100%") == 1, text
