"""Outcomes of background work that a later step tells the client about.

A worker has no client to answer: the end or failed part of a buffering job or a background reflection is kept on
the record (bounded, newest last) until the next step answers it. At least once: two concurrent steps may both
answer a part, and a lost write answers it again next step.
"""

from __future__ import annotations

import logging

from om_lib import buffering as buf
from om_lib.parts import BufferingEnd, CycleParts, OMPart, StoredPart, with_observations
from om_lib.record_writer import LeaseName
from om_lib.records import OMRecord
from om_lib.runtime import Runtime

logger = logging.getLogger(__name__)


def finish_background(
    rt: Runtime, record: OMRecord, hint: LeaseName, cycle_id: str | None, part: OMPart | None
) -> None:
    """Clear this cycle's running hint and keep its end/failed part for the next step (best effort)."""
    stored = part.to_json() if part is not None else None

    def finish(current: OMRecord) -> OMRecord | None:
        held = getattr(current, hint)
        update: dict[str, object] = {}
        if held is not None and cycle_id is not None and held.owner == cycle_id:
            update[hint] = None
        if stored is not None:
            update['background_parts'] = buf.keep_background_part(current.background_parts, stored)
        return current.model_copy(update=update) if update else None

    if rt.writer.try_commit(record, finish) is None and stored is not None:
        logger.warning('could not record a background outcome', extra={'key': record.key})


def deliver_background_parts(rt: Runtime, record: OMRecord, parts: CycleParts) -> OMRecord:
    """Answer the end/failed parts of background work finished since the last step, then forget them."""
    waiting = record.background_parts
    if not waiting:
        return record
    texts = {c.cycle_id: c.observations for c in record.buffered_chunks}
    for stored in waiting:
        part = StoredPart.from_json(stored)
        text = texts.get(part.cycle_id)
        if part.kind() == BufferingEnd.TYPE and 'observations' not in part.stored and text:
            part = StoredPart(type=part.type, stored={**part.stored, 'observations': text})
        parts.add(part)
    delivered = {buf.background_part_key(p) for p in waiting}

    def forget(current: OMRecord) -> OMRecord | None:
        rest = tuple(p for p in current.background_parts if buf.background_part_key(p) not in delivered)
        if len(rest) == len(current.background_parts):
            return None
        return current.model_copy(update={'background_parts': rest})

    return rt.writer.try_commit(record, forget) or record


__all__ = ['deliver_background_parts', 'finish_background', 'with_observations']
