"""`InMemoryEventLog`: lifecycle events kept in a list, in order (tests, and library users who read them in-process)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from om_lib.events import LifecycleEvent


class InMemoryEventLog:
    """Keeps every published event, oldest first; `published_calls` counts `publish` calls (one per request or job)."""

    def __init__(self) -> None:
        self._events: list[LifecycleEvent] = []
        self._lock = threading.Lock()
        self.published_calls = 0

    def publish(self, events: Sequence[LifecycleEvent]) -> None:
        """See `EventPublisher.publish`."""
        with self._lock:
            self.published_calls += 1
            self._events.extend(events)

    @property
    def events(self) -> list[LifecycleEvent]:
        """A copy of what was published so far."""
        with self._lock:
            return list(self._events)

    def of_type(self, detail_type: str) -> list[LifecycleEvent]:
        """The events of one detail type."""
        return [e for e in self.events if e.detail_type == detail_type]
