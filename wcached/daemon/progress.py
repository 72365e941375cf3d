"""How far a fill has got: the unit's status line and a terminal's progress bar.

The loader worker reports bytes read out of the model's total; this turns the
reports into what an operator reads: ``systemctl status wcached@0`` shows
``filling llama-8b (1 of 2): 6.4 of 16.1 GB, 2.1 GB/s, 5 s left``, and
``wcached serve`` on a terminal draws a bar (tqdm). Figures are decimal (GB,
GB/s), as disk and network rates are quoted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any


@dataclass
class ModelProgress:
    name: str
    done: int = 0
    total: int = 0
    started: float | None = None  # the first report from the worker
    updated: float | None = None


class FillMeter:
    """Progress of the models one fill job fills, in order."""

    def __init__(
        self,
        models: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
        bar_stream: IO[str] | None = None,
    ):
        self._clock = clock
        self.models = [ModelProgress(m) for m in models]
        self._by_name = {m.name: m for m in self.models}
        self._current: ModelProgress | None = self.models[0] if self.models else None
        self._bar_stream = bar_stream
        self._bar: Any = None
        self._bar_model = ""

    def update(self, model: str, done: int, total: int) -> None:
        m = self._by_name.get(model)
        if m is None:
            return
        now = self._clock()
        if m.started is None:
            m.started = now
        m.done, m.updated = done, now
        if total:
            m.total = total
        self._current = m
        self._draw(m)

    def rate(self, m: ModelProgress) -> float:
        """Bytes a second since the model's first report (0 before any)."""
        if m.started is None or m.updated is None or m.updated <= m.started:
            return 0.0
        return m.done / (m.updated - m.started)

    def status_line(self) -> str:
        m = self._current
        if m is None:
            return "filling"
        position = self.models.index(m) + 1
        head = f"filling {m.name}" + (f" ({position} of {len(self.models)})" if len(self.models) > 1 else "")
        if not m.total:
            # vLLM builds and loads the model before it reports anything.
            return f"{head}: loading"
        parts = [f"{_gb(m.done)} of {_gb(m.total)} GB"]
        rate = self.rate(m)
        if rate > 0:
            parts.append(f"{rate / 1e9:.2f} GB/s")
            if m.done < m.total:
                parts.append(f"{_eta((m.total - m.done) / rate)} left")
        return f"{head}: {', '.join(parts)}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _draw(self, m: ModelProgress) -> None:
        if self._bar_stream is None or not m.total:
            return
        if self._bar_model == m.name and self._bar is None:
            return  # this model's bar is finished
        if self._bar_model != m.name:
            self.close()
            from tqdm import tqdm

            self._bar = tqdm(
                total=m.total,
                desc=m.name,
                unit="B",
                unit_scale=True,
                file=self._bar_stream,
                dynamic_ncols=True,
                leave=True,
            )
            self._bar_model = m.name
        self._bar.update(m.done - self._bar.n)
        if m.done >= m.total:
            self.close()


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f}"


def _eta(seconds: float) -> str:
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
