"""What the Actor sees for a step: the memory system message, the continuation reminder, the visible messages, and
the `data-om-status` part that describes the windows (reference spec §7.10, §16)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from om_lib.context import context as ctx
from om_lib.context import temporal
from om_lib.messages import Message, TextPart
from om_lib.observation import buffering as buf
from om_lib.parts import BufferedWindows, Status
from om_lib.records import OMRecord, Thread
from om_lib.reflection.archive import catalog_line
from om_lib.runtime.record_writer import lease_active
from om_lib.runtime.runtime import Runtime


def system_text(rt: Runtime, record: OMRecord, thread: Thread, *, now: datetime, other_conversations: str = '') -> str:
    """The memory system message: observations, continuation hints, retrieval guidance and (resource scope) the
    other conversations' unobserved messages. Empty when there is neither.

    `now` is the step's time (`messages.now_of`): relative dates ("2 weeks ago") are counted from it."""
    if not record.active_observations.strip() and not other_conversations and not record.archived:
        return ''
    retrieval = rt.settings.retrieval
    default_scope = 'resource' if rt.settings.scope == 'resource' else 'thread'
    catalog = catalog_line(
        record.archived,
        rt.counter.count_string,
        max_tokens=rt.settings.archive.max_catalog_tokens,
        recall=retrieval is not None,
    )
    messages = ctx.build_observation_system_messages(
        record.active_observations,
        now=now,
        current_task=thread.current_task,
        suggested_response=thread.suggested_response,
        retrieval=retrieval is not None,
        retrieval_scope=retrieval.scope if retrieval is not None else default_scope,
        other_conversations=other_conversations or None,
        archived_catalog=catalog,
    )
    return ctx.join_system_messages(messages)


def continuation_message(rt: Runtime) -> Message:
    """The reminder the reference adds after the observations (never stored)."""
    return Message(
        id=ctx.CONTINUATION_REMINDER_ID,
        role='user',
        created_at=datetime(1970, 1, 1, tzinfo=rt.clock.now().tzinfo),
        parts=(TextPart(text=ctx.continuation_reminder_text()),),
    )


def visible_messages(
    rt: Runtime, record: OMRecord, unobserved: Sequence[Message], step_input: Sequence[Message]
) -> list[Message]:
    """The Actor's messages: the reminder (when there are observations), then the unobserved messages in order, with a
    temporal gap marker before each message that follows a gap (`temporalMarkers`, om_lib/context/temporal.py).

    The step's own new user input is never taken away: a step does not observe it (it is observed with the turn that
    answers it), and one already observed earlier (a retried step) is still the message the Actor answers.
    """
    seen = {m.id for m in unobserved}
    protected = [m for m in step_input if m.id not in seen and m.role == 'user']
    visible = sorted([*protected, *unobserved], key=lambda m: m.seq or 0)
    visible = temporal.with_markers(visible, rt.settings.temporal_gap_s, record.observed_timezone)
    if record.active_observations.strip():
        return [continuation_message(rt), *visible]
    return visible


def drop_engine_text(messages: Sequence[Message]) -> list[Message]:
    """Text the engine inserts (the continuation reminder, temporal gap markers) is never saved as if someone had
    said it."""
    reminder = ctx.continuation_reminder_text()
    return [
        m
        for m in messages
        if m.id != ctx.CONTINUATION_REMINDER_ID and m.text() != reminder and not temporal.is_marker(m)
    ]


def buffered_windows(rt: Runtime, record: OMRecord | None, thread_id: str, pending: int) -> BufferedWindows:
    """The `buffered` windows of `data-om-status` and the memory view (seed 000, spec §7.10)."""
    if record is None:
        return BufferedWindows()
    now = rt.clock.now()
    s = rt.settings
    chunks = buf.live_chunks(record.buffered_chunks, record.cursor(thread_id))
    staged = bool(record.buffered_reflection)
    running_refl = lease_active(record.buffering_reflection, now) or (
        lease_active(record.reflecting, now) and not staged
    )
    return BufferedWindows(
        chunks=len(chunks),
        message_tokens=min(sum(c.message_tokens for c in chunks), pending),
        projected_message_removal=buf.projected_removal(
            chunks, s.buffer_activation, s.max_message_threshold(), pending
        ),
        observation_tokens=sum(c.token_count for c in chunks),
        observation_status='running'
        if lease_active(record.buffering_observation, now)
        else ('complete' if chunks else 'idle'),
        reflection_input_tokens=record.buffered_reflection_input_tokens or 0,
        reflection_output_tokens=record.buffered_reflection_tokens or 0,
        reflection_status='running' if running_refl else ('complete' if staged else 'idle'),
    )


def status_part(
    rt: Runtime,
    record: OMRecord,
    messages: Sequence[Message],
    thread_id: str,
    step_number: int,
    *,
    other_tokens: int = 0,
) -> Status:
    """`data-om-status` for the messages the Actor gets; `other_tokens`: the other threads' unobserved tokens
    (resource scope)."""
    total = rt.counter.count_messages(messages) + other_tokens
    return Status(
        message_tokens=total,
        message_threshold=rt.message_threshold(record),
        observation_tokens=record.observation_tokens,
        observation_threshold=rt.observation_threshold(record),
        buffered=buffered_windows(rt, record, thread_id, total),
        record_id=record.id,
        thread_id=thread_id,
        step_number=step_number,
        generation_count=record.generation,
    )
