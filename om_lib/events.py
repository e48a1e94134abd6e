"""Lifecycle events: every memory outcome that is a `data-om-*` part, published so a team reacts without polling.

The serverless form of the reference's lifecycle hooks (`onObservationStart`/`End`, `onReflectionStart`/`End`): a
step, a turn, a worker job or a reflection task hands the parts it made itself (`CycleParts.own`: never the ones
background work kept for it, which were published where they were made) to the service, which turns them into
events and publishes them once, in one batch, at the end of the call (`EventPublisher`, om_lib/ports.py).

An event is the part's `data` plus `resourceId` and, where the outcome cost model calls, `usage` (`{model, calls,
inputTokens, outputTokens, totalTokens}`, as the provider reported it). Its detail type is the part's type
(`data-om-observation-end` …), its source `observational-memory`. Parts that describe a request rather than memory
(`data-om-status`, `data-om-scheduled`, the chat's Actor parts) are not events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from om_lib.parts import (
    Activation,
    BufferingEnd,
    BufferingFailed,
    BufferingStart,
    ObservationEnd,
    ObservationFailed,
    ObservationsArchived,
    ObservationStart,
    OMPart,
    StoredPart,
    ThreadUpdate,
)

EVENT_SOURCE = 'observational-memory'
"""The `source` of every lifecycle event (EventBridge rules match on it)."""

# The parts that are lifecycle events: the memory's own outcomes (a start is announced, so a consumer can time it).
EVENT_TYPES: tuple[str, ...] = tuple(
    kind.TYPE
    for kind in (
        ObservationStart,
        ObservationEnd,
        ObservationFailed,
        BufferingStart,
        BufferingEnd,
        BufferingFailed,
        Activation,
        ObservationsArchived,
        ThreadUpdate,
    )
)
_EVENT_TYPES = frozenset(EVENT_TYPES)

# EventBridge takes at most 256 KB per PutEvents call; an entry is kept well under it. The `observations` text of a
# part (a reflection's whole new log) is what can be large: past this many UTF-8 bytes it is cut, and the event says
# so (`observationsTruncated`); the full text is in the memory (`GET /threads/{id}/memory`).
MAX_OBSERVATIONS_BYTES = 64 * 1024


@dataclass(frozen=True)
class LifecycleEvent:
    """One event: its detail type (the part's type) and its detail (JSON-ready)."""

    detail_type: str
    detail: dict[str, Any]

    def detail_json(self) -> str:
        """The detail as compact JSON."""
        return json.dumps(self.detail, separators=(',', ':'), ensure_ascii=False)


def lifecycle_events(resource_id: str, parts: Iterable[OMPart]) -> list[LifecycleEvent]:
    """The events of `parts` (in order), for the resource they concern. Stored parts (made elsewhere) are skipped."""
    events: list[LifecycleEvent] = []
    for sequence, part in enumerate(p for p in parts if not isinstance(p, StoredPart) and p.kind() in _EVENT_TYPES):
        detail: dict[str, Any] = {'resourceId': resource_id, **part.data(), 'sequence': sequence}
        if part.usage is not None:
            detail['usage'] = part.usage.as_json()
        text = detail.get('observations')
        if isinstance(text, str) and len(text.encode()) > MAX_OBSERVATIONS_BYTES:
            detail['observations'] = text.encode()[:MAX_OBSERVATIONS_BYTES].decode(errors='ignore')
            detail['observationsTruncated'] = True
        events.append(LifecycleEvent(part.kind(), detail))
    return events


def lifecycle_event_pattern(detail_types: Iterable[str] | None = None) -> dict[str, Any]:
    """The EventBridge pattern of lifecycle events (all of them, or these detail types): the rule the local stack
    keeps them readable with and the CDK app's optional queue use the same one."""
    pattern: dict[str, Any] = {'source': [EVENT_SOURCE]}
    if detail_types is not None:
        pattern['detail-type'] = sorted(set(detail_types))
    return pattern
