"""Outcomes of background work that a later step tells the client about.

A worker has no client to answer: the parts of a buffering job, a worker's observation, a background reflection (the
worker's or the reflection workflow's) are kept on the record (bounded, newest last) until the next step answers
them, in every mode: buffered or not, thread or resource scope. Exactly once: a step takes the kept parts off the
record with one conditional write and answers only what its write removed, so of two concurrent steps one answers a
part and the other does not (a step whose answer is then lost in transit loses them too).

Large texts are not kept twice: a buffered chunk's observations, a staged reflection and a reflection's new log are
on the record already, and delivery copies them into the part (`observations`, the seed's field).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from om_lib.observation import buffering as buf
from om_lib.parts import (
    BufferingEnd,
    BufferingFailed,
    CycleParts,
    ObservationEnd,
    ObservationFailed,
    ObservationStart,
    OMPart,
    StoredPart,
    ThreadUpdate,
    with_observations,
)
from om_lib.records import OMRecord
from om_lib.runtime.record_writer import LeaseName
from om_lib.runtime.runtime import Runtime

logger = logging.getLogger(__name__)

# The parts of background work a client is told about on its next step (status parts describe the step itself).
KEPT_KINDS = frozenset(
    kind.TYPE
    for kind in (ObservationStart, ObservationEnd, ObservationFailed, ThreadUpdate, BufferingEnd, BufferingFailed)
)
# Parts whose `observations` text the record holds already: kept without it, filled in on delivery.
_TEXT_ON_RECORD = frozenset({BufferingEnd.TYPE})


def stored_form(part: OMPart) -> dict[str, Any]:
    """A part as kept on a record: its JSON, without a reflection's new log (the record holds it)."""
    stored = part.to_json()
    data = stored['data']
    if part.kind() == ObservationEnd.TYPE and data.get('operationType') == 'reflection':
        data.pop('observations', None)
    return stored


def finish_background(
    rt: Runtime, record: OMRecord, hint: LeaseName, cycle_id: str | None, part: OMPart | None
) -> None:
    """Clear this cycle's running hint and keep its start/end/failed part for the next step (best effort)."""

    def clear_hint(current: OMRecord) -> dict[str, object]:
        held = getattr(current, hint)
        return {hint: None} if held is not None and cycle_id is not None and held.owner == cycle_id else {}

    _keep(rt, record, [part] if part is not None else [], clear_hint)


def keep_background_parts(rt: Runtime, record: OMRecord, parts: Iterable[OMPart]) -> None:
    """Keep what a worker's job produced (observation and reflection start/end/failed, title updates) on `record`
    (its head, as the job left it), for the client's next step (best effort: a lost write loses only the news, never
    memory)."""
    _keep(rt, record, [p for p in parts if p.kind() in KEPT_KINDS])


def _keep(
    rt: Runtime,
    record: OMRecord,
    parts: Sequence[OMPart],
    also: Callable[[OMRecord], dict[str, object]] = lambda _: {},
) -> None:
    """One write: `parts` kept on the record (`stored_form`), plus the update `also` makes of the fresh head."""
    stored = [stored_form(p) for p in parts]

    def keep(current: OMRecord) -> OMRecord | None:
        update = also(current)
        if stored:
            waiting = current.background_parts
            for part in stored:
                waiting = buf.keep_background_part(waiting, part)
            update['background_parts'] = waiting
        return current.model_copy(update=update) if update else None

    if rt.writer.try_commit(record, keep) is None and stored:
        logger.warning('could not record background outcomes', extra={'key': record.key})


def deliver_background_parts(rt: Runtime, record: OMRecord, parts: CycleParts) -> OMRecord:
    """Answer the parts background work kept since the last step, exactly once, and forget them."""
    if not record.background_parts:
        return record
    taken: list[dict[str, Any]] = []

    def take(current: OMRecord) -> OMRecord | None:
        if not current.background_parts:
            return None  # a concurrent step answered them
        taken[:] = current.background_parts
        return current.model_copy(update={'background_parts': ()})

    committed = rt.writer.try_commit(record, take)
    if committed is None:
        return rt.writer.fresh(record)
    for stored in taken:
        parts.add(_with_text(committed, StoredPart.from_json(stored)))
    return committed


def _with_text(record: OMRecord, part: StoredPart) -> StoredPart:
    """The part with its `observations` text, from the record where it is kept there ('' when it is gone)."""
    data = part.stored
    kind = part.kind()
    if 'observations' in data or kind not in {*_TEXT_ON_RECORD, ObservationEnd.TYPE, BufferingFailed.TYPE}:
        return part
    text = ''
    if kind == BufferingEnd.TYPE and data.get('operationType') == 'reflection':
        if record.buffered_reflection_cycle_id == part.cycle_id:
            text = record.buffered_reflection or ''
    elif kind == BufferingEnd.TYPE:
        text = next((c.observations for c in record.buffered_chunks if c.cycle_id == part.cycle_id), '')
    elif kind == ObservationEnd.TYPE and record.id == data.get('recordId'):
        text = record.active_observations  # the generation this reflection made (lines appended since included)
    return StoredPart(type=part.type, stored={**data, 'observations': text})


__all__ = [
    'KEPT_KINDS',
    'deliver_background_parts',
    'finish_background',
    'keep_background_parts',
    'stored_form',
    'with_observations',
]
