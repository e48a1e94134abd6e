"""`EventBridgePublisher`: lifecycle events onto an EventBridge bus (PutEvents, at most 10 entries per call).

Best effort by design: an outcome has already happened when its event is published, so a failed PutEvents (throttled,
the bus gone, an entry refused) is logged and reported to `on_failure` (the handlers count it as a metric), and the
step, turn or job that made the outcome goes on. A failed call is not retried here: the caller is a request whose
budget is the user's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from om_lib.events import EVENT_SOURCE, LifecycleEvent

logger = logging.getLogger(__name__)

# PutEvents takes at most 10 entries, and 256 KB in all (each entry's source, detail type and detail).
MAX_ENTRIES_PER_CALL = 10
MAX_BYTES_PER_CALL = 256 * 1024


class EventBridgePublisher:
    """Publishes to one bus. The client is created on first use (honours AWS_ENDPOINT_URL) and reused.

    Args:
        bus_name: The bus (name or ARN).
        on_failure: Called with the number of events that could not be published (never raises into the caller).
        client: An `events` client (tests); default: one made on first use.
    """

    def __init__(
        self,
        bus_name: str,
        *,
        on_failure: Callable[[int], None] | None = None,
        client: Any | None = None,
        source: str = EVENT_SOURCE,
    ) -> None:
        self.bus_name = bus_name
        self.source = source
        self._on_failure = on_failure
        self._client = client
        self._lock = threading.Lock()

    def _events(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3

                self._client = boto3.client('events')
            return self._client

    def publish(self, events: Sequence[LifecycleEvent]) -> None:
        """See `EventPublisher.publish`: batches in order, each within PutEvents' limits."""
        failed = 0
        for batch in self._batches(events):
            try:
                answer = self._events().put_events(Entries=batch)
            except Exception as exc:  # noqa: BLE001 - publishing never fails the work it reports
                logger.warning(
                    'lifecycle events not published', extra={'events': len(batch), 'error': type(exc).__name__}
                )
                failed += len(batch)
                continue
            refused = int(answer.get('FailedEntryCount') or 0)
            if refused:
                codes = sorted({str(e.get('ErrorCode')) for e in answer.get('Entries', []) if e.get('ErrorCode')})
                logger.warning('lifecycle events refused', extra={'events': refused, 'codes': codes})
                failed += refused
        if failed and self._on_failure is not None:
            try:
                self._on_failure(failed)
            except Exception:  # noqa: BLE001 - a counter must not fail the request either
                logger.exception('could not count unpublished lifecycle events')

    def _batches(self, events: Sequence[LifecycleEvent]) -> list[list[dict[str, Any]]]:
        batches: list[list[dict[str, Any]]] = []
        current: list[dict[str, Any]] = []
        size = 0
        for event in events:
            entry = {
                'Source': self.source,
                'DetailType': event.detail_type,
                'Detail': event.detail_json(),
                'EventBusName': self.bus_name,
            }
            entry_size = len(self.source) + len(event.detail_type) + len(entry['Detail'].encode())
            if current and (len(current) >= MAX_ENTRIES_PER_CALL or size + entry_size > MAX_BYTES_PER_CALL):
                batches.append(current)
                current, size = [], 0
            current.append(entry)
            size += entry_size
        if current:
            batches.append(current)
        return batches
