"""Clocks: the real one, and a manual one for tests and benchmarks."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta


class SystemClock:
    """Wall time from the OS (UTC) and `time.monotonic` for deadlines."""

    def now(self) -> datetime:
        """Current UTC time."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (or by `tick` on every `now()` call, to keep times distinct)."""

    def __init__(self, start: datetime | None = None, *, tick: timedelta = timedelta(0)) -> None:
        self._now = start or datetime(2025, 1, 1, 9, 0, tzinfo=UTC)
        self._mono = 1000.0
        self._tick = tick
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The current fake time (then advance by `tick`)."""
        with self._lock:
            current = self._now
            self._now += self._tick
            return current

    def monotonic(self) -> float:
        """The fake monotonic time."""
        with self._lock:
            return self._mono

    def advance(self, delta: timedelta | float) -> None:
        """Move both clocks forward by `delta` (a timedelta or seconds)."""
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def set(self, when: datetime) -> None:
        """Jump the wall clock to `when` (monotonic moves by the same amount when going forward)."""
        with self._lock:
            delta = (when - self._now).total_seconds()
            self._now = when
            if delta > 0:
                self._mono += delta
