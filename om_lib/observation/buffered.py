"""Async buffering of observations in thread scope (issue 5; reference spec §10–§11).

- **Buffering.** Each time pending tokens cross a `bufferTokens` interval, the step (or turn) queues a `buffer` job
  (SQS FIFO, one group per record, de-duplicated by message range) and carries on: it never calls a model for it.
  The worker observes that slice through the observation pipeline and appends a buffered chunk with a conditional
  write that is a no-op when the range is already buffered or observed, so a redelivered job adds nothing.
- **Activation.** When pending tokens reach `messageTokens`, a prefix of the chunks moves into the active
  observations (the activation math is `om_lib/observation/buffering.py`); no model call. The cursor moves to the last
  activated chunk, so those messages leave the Actor's context.
- **blockAfter.** Past it, after activating what there is, the pipeline observes synchronously, the last resort,
  within the request's time budget (deferred to the worker when the budget is spent).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from om_lib.context import context as ctx
from om_lib.context.idle import ActivationTrigger
from om_lib.context.thresholds import resolve_retention_floor
from om_lib.errors import ThreadNotFoundError
from om_lib.messages import Message
from om_lib.observation import buffering as buf
from om_lib.observation.background import deliver_background_parts, finish_background
from om_lib.observation.observation import Backlog, ObservationPipeline, ThreadFailure, backlog_of, update_thread_hints
from om_lib.parts import Activation, BufferingEnd, BufferingFailed, CycleParts, with_observations
from om_lib.records import BufferedChunk, Lease, ObservationGroup, OMRecord, Thread
from om_lib.runtime.runtime import Runtime, before_step_input, has_pending_tool_call
from om_lib.work import Job

logger = logging.getLogger(__name__)

# How long a queued buffering job counts as "running" in status answers (a hint, never a lock).
RUNNING_HINT_TTL = timedelta(minutes=2)


class ObservationBuffering:
    """The buffering parts of a step, a turn and a buffer job."""

    def __init__(self, rt: Runtime, pipeline: ObservationPipeline) -> None:
        self.rt = rt
        self.pipeline = pipeline

    # -- the step ---------------------------------------------------------------------------------------------------
    def step(
        self,
        record: OMRecord,
        thread: Thread,
        unobserved: list[Message],
        deadline: float,
        parts: CycleParts,
        *,
        step_input: Sequence[Message] = (),
        trigger: ActivationTrigger | None = None,
    ) -> tuple[OMRecord, Thread, list[Message]]:
        """Activate buffered chunks when due, observe past blockAfter, queue the next slice; returns the new state
        and the messages the Actor sees.

        `trigger`: the thread was idle past `activateAfterIdle`, or the Actor's model changed
        (om_lib/context/idle.py): every buffered chunk is activated, below the threshold too (no model call).

        The step's own input is not buffered here: the turn that answers it buffers it together with the answer (one
        Observer call per turn instead of two); a client that never sends turns gets it buffered by its next step.
        """
        rt = self.rt
        s = rt.settings
        record = deliver_background_parts(rt, record, parts)
        pending = rt.counter.count_messages(unobserved)
        over = pending >= rt.message_threshold(record)
        if record.buffered_chunks and (over or trigger is not None):
            record, thread, activated = self.activate(
                record, thread, pending, parts, everything=not over, trigger=None if over else trigger
            )
            if activated:
                unobserved = rt.load_after(record.resource_id, thread.id, record.cursor(thread.id))
                pending = rt.counter.count_messages(unobserved)
        waiting_on_tool = has_pending_tool_call(unobserved)
        retained: list[Message] = []
        observable = before_step_input(unobserved, step_input)
        if observable and not waiting_on_tool and s.block_after is not None and pending >= s.block_after:
            # Buffering could not keep up: observe synchronously, the last resort (spec §7.9, seed 000 blockAfter).
            # The step's own input stays out: the Actor answers it, so it must not be shown twice.
            before = unobserved
            backlog = backlog_of(thread.id, observable, rt)
            record = self.pipeline.observe(record, [backlog], deadline, parts, due_at=int(s.block_after))
            thread = rt.store.get_thread(record.resource_id, thread.id) or thread
            unobserved = rt.load_after(record.resource_id, thread.id, record.cursor(thread.id))
            pending = rt.counter.count_messages(unobserved)
            still = {m.id for m in unobserved}
            floor = resolve_retention_floor(
                s.buffer_activation or buf.DEFAULT_BUFFER_ACTIVATION, s.max_message_threshold()
            )
            observed = [m for m in before if m.id not in still]
            retained = buf.retained_after_observation(observed, pending, floor, rt.counter.count_messages)
        if unobserved and not waiting_on_tool:
            own = {m.id for m in step_input}
            earlier = [m for m in unobserved if m.id not in own]
            if earlier:
                record, _ = self.maybe_enqueue(record, thread.id, earlier, rt.counter.count_messages(earlier), parts)
        return record, thread, [*retained, *unobserved]

    def maybe_enqueue(
        self, record: OMRecord, thread_id: str, unobserved: Sequence[Message], pending: int, parts: CycleParts
    ) -> tuple[OMRecord, bool]:
        """Queue a buffering job when pending crossed a new `bufferTokens` interval (spec §10.1–§10.2)."""
        rt = self.rt
        buffer_tokens = rt.settings.buffer_tokens
        if not buffer_tokens or not unobserved or has_pending_tool_call(unobserved):
            return record, False
        threshold = rt.message_threshold(record)
        if not buf.should_buffer(pending, record.last_buffered_at_tokens, buffer_tokens, threshold):
            return record, False
        cursor = record.cursor(thread_id)
        start = buf.slice_start(cursor, buf.live_chunks(record.buffered_chunks, cursor))
        batch = [m for m in unobserved if (m.seq or 0) >= start]
        tokens = rt.counter.count_messages(batch)
        if not batch or tokens < buffer_tokens / 2:
            return record, False  # not enough new content yet (spec §10.3 step 5)
        cycle = rt.start_cycle('buffer-obs-')
        job = Job(
            'buffer',
            record.resource_id,
            thread_id,
            record.key,
            'interval',
            start_seq=start,
            end_seq=batch[-1].seq or start,
            cycle_id=cycle.cycle_id,
        )
        if not rt.submit(job):
            return record, False
        hint = Lease(owner=cycle.cycle_id, expires_at=rt.clock.now() + RUNNING_HINT_TTL)
        # Only the interval bookkeeping may be lost here: at worst one more job, which its range makes a no-op.
        record = (
            rt.writer.try_commit(
                record,
                lambda cur: cur.model_copy(update={'last_buffered_at_tokens': pending, 'buffering_observation': hint}),
            )
            or record
        )
        parts.add(rt.buffering_start_part(cycle, 'observation', tokens, record.id, thread_id))
        return record, True

    # -- activation -------------------------------------------------------------------------------------------------
    def activate(
        self,
        record: OMRecord,
        thread: Thread,
        pending: int,
        parts: CycleParts,
        *,
        everything: bool = False,
        trigger: ActivationTrigger | None = None,
    ) -> tuple[OMRecord, Thread, bool]:
        """Move buffered chunks into the active observations (no model call; spec §11).

        `everything` activates every chunk (the worker's full observation, before it observes the rest; an idle or
        model-change `trigger`, whose fields the activation parts carry).
        """
        rt = self.rt
        s = rt.settings
        thread_id = thread.id
        chunks = buf.live_chunks(record.buffered_chunks, record.cursor(thread_id))
        if everything:
            count = len(chunks)
        else:
            count = buf.plan_activation(
                [c.message_tokens for c in chunks],
                pending=pending,
                threshold=s.max_message_threshold(),
                buffer_activation=s.buffer_activation,
                buffer_tokens=s.buffer_tokens,
                block_after=s.block_after,
            )
        if count == 0:
            return record, thread, False
        planned = tuple(c.id for c in chunks[:count])
        done: list[buf.Activation] = []

        def apply(current: OMRecord) -> OMRecord | None:
            cursor = current.cursor(thread_id)
            live = buf.live_chunks(current.buffered_chunks, cursor)
            if tuple(c.id for c in live[:count]) != planned:
                return None  # another step activated (or observed) meanwhile
            act = buf.activate_chunks(
                current.active_observations,
                live,
                count,
                cursor=cursor,
                last_observed_at=current.last_observed_at,
                render=grouped if s.retrieval is not None else None,
            )
            done[:] = [act]
            now = rt.clock.now()
            groups = tuple(
                ObservationGroup(
                    id=ctx.group_id_for(c.start_seq),
                    thread_id=thread_id,
                    start_id=c.message_ids[0],
                    end_id=c.message_ids[-1],
                    start_seq=c.start_seq,
                    end_seq=c.end_seq,
                    created_at=now,
                )
                for c in act.activated
                if c.message_ids
            )
            return current.model_copy(
                update={
                    'active_observations': act.active_observations,
                    'observation_tokens': rt.counter.count_observations(act.active_observations),
                    'total_tokens_observed': current.total_tokens_observed + act.message_tokens,
                    'cursors': {**current.cursors, thread_id: act.cursor},
                    'last_observed_at': act.last_observed_at,
                    'groups': (*current.groups, *groups),
                    'buffered_chunks': act.remaining,
                    'last_buffered_at_tokens': 0,
                    'pending_message_tokens': max(0, pending - act.message_tokens),
                }
            )

        committed = rt.writer.try_commit(record, apply)
        if committed is None or not done:
            return rt.writer.fresh(record), thread, False
        act = done[0]
        now = rt.clock.now()
        for chunk in act.activated:
            parts.add(
                Activation(
                    cycle_id=chunk.cycle_id,
                    operation_type='observation',
                    activated_at=now,
                    chunks_activated=1,
                    tokens_activated=chunk.message_tokens,
                    observation_tokens=committed.observation_tokens,
                    messages_activated=len(chunk.message_ids),
                    generation_count=committed.generation,
                    observations=chunk.observations,
                    record_id=committed.id,
                    thread_id=thread_id,
                    config=rt.marker_config(),
                    **(trigger.part_fields() if trigger is not None else {}),  # type: ignore[arg-type]
                )
            )
        # Continuation hints survive activation: the last activated chunk's, else the thread keeps its own. A title
        # the chunk proposed is applied here, not when it was buffered: the rename is this activation's to report
        # (only the writer that activated the chunk gets here, so it is reported once).
        thread = update_thread_hints(
            rt,
            thread,
            current_task=act.current_task,
            suggested_response=act.suggested_response,
            title=act.thread_title,
            cycle_id=act.activated[-1].cycle_id,
            parts=parts,
            replace_hints=False,
        )
        return committed, thread, True

    # -- the worker -------------------------------------------------------------------------------------------------
    def run_buffer_job(self, job: Job, deadline: float, *, announce: bool = True) -> CycleParts:
        """Observe one slice and store it as a buffered chunk. Idempotent per (record, message range).

        `announce`: keep the job's end or failed part on the record for the client's next step (a worker's job); a
        client that asked for it (`POST …/memory/buffer`) gets them in its answer instead.
        """
        rt = self.rt
        parts = CycleParts()
        thread = rt.store.get_thread(job.resource_id, job.thread_id)
        if thread is None:
            raise ThreadNotFoundError(job.thread_id)
        record = rt.store.get_record(job.record_key)
        if record is None or job.end_seq is None:
            return parts
        thread_id = thread.id
        cursor = record.cursor(thread_id)
        chunks = buf.live_chunks(record.buffered_chunks, cursor)
        # Start after whatever is buffered or observed by now (not the job's own start): consecutive chunks stay
        # disjoint and gapless even when an earlier job was lost.
        start = buf.slice_start(cursor, chunks)
        cycle_id = job.cycle_id or f'buffer-obs-{rt.new_id()}'
        messages = [m for m in rt.load_after(job.resource_id, thread_id, start - 1) if (m.seq or 0) <= job.end_seq]
        backlog = backlog_of(thread_id, messages, rt)
        if job.end_seq < start or not backlog.messages:
            # This range is buffered or observed already (a redelivered job), or holds nothing to observe.
            finish_background(rt, record, 'buffering_observation', job.cycle_id, None)
            return parts
        cycle = rt.start_cycle()
        # The Observer sees what is active plus what is already buffered, so the new chunk does not repeat it.
        previous = '\n\n'.join(
            t for t in (record.active_observations.strip(), *(c.observations.strip() for c in chunks)) if t
        )
        result, usage = self.pipeline.buffer_slice(record, backlog, deadline, cycle_id=cycle_id, previous=previous)
        if isinstance(result, ThreadFailure):
            failed = BufferingFailed(
                cycle_id=cycle_id,
                operation_type='observation',
                failed_at=rt.clock.now(),
                duration_ms=rt.elapsed_ms(cycle),
                tokens_attempted=backlog.tokens,
                error=str(result.error) or type(result.error).__name__,
                record_id=record.id,
                thread_id=thread_id,
                reason=result.reason,
                usage=usage,
            )
            finish_background(rt, record, 'buffering_observation', cycle_id, failed if announce else None)
            parts.add(failed)
            return parts
        if result is None:
            # Nothing worth keeping; the next job (or the threshold) covers these messages again.
            finish_background(rt, record, 'buffering_observation', cycle_id, None)
            return parts
        chunk = result
        completed_at, duration_ms = rt.clock.now(), rt.elapsed_ms(cycle)

        def ended(record_id: str) -> BufferingEnd:
            # Stored without its text: the record keeps the part next to the chunk that holds it; delivery adds it.
            return BufferingEnd(
                cycle_id=cycle_id,
                operation_type='observation',
                completed_at=completed_at,
                duration_ms=duration_ms,
                tokens_buffered=backlog.tokens,
                buffered_tokens=chunk.token_count,
                record_id=record_id,
                thread_id=thread_id,
            )

        def append(current: OMRecord) -> OMRecord | None:
            if current.deletions != record.deletions:
                return None  # messages were deleted since this job read them: the chunk may hold one of them
            cur_cursor = current.cursor(thread_id)
            live = buf.live_chunks(current.buffered_chunks, cur_cursor)
            if buf.slice_start(cur_cursor, live) != start:
                return None  # buffered or observed meanwhile: adding this chunk would duplicate it
            hint = current.buffering_observation
            if hint is not None and hint.owner == cycle_id:
                hint = None
            kept = (
                buf.keep_background_part(current.background_parts, ended(current.id).to_json())
                if announce
                else current.background_parts
            )
            return current.model_copy(
                update={'buffered_chunks': (*live, chunk), 'buffering_observation': hint, 'background_parts': kept}
            )

        committed = rt.writer.commit(record, append)
        if committed is None:
            finish_background(rt, record, 'buffering_observation', cycle_id, None)
            return parts
        parts.add(replace(with_observations(ended(committed.id), chunk.observations), usage=usage))
        return parts

    def activate_everything(self, record: OMRecord, thread: Thread, parts: CycleParts) -> OMRecord:
        """The worker's full observation: whatever is buffered becomes active first (no model call)."""
        if not record.buffered_chunks:
            return record
        rt = self.rt
        pending = rt.counter.count_messages(rt.load_after(record.resource_id, thread.id, record.cursor(thread.id)))
        return self.activate(record, thread, pending, parts, everything=True)[0]


__all__ = ['Backlog', 'ObservationBuffering']


def grouped(chunk: BufferedChunk) -> str:
    """A buffered chunk as it joins the log in retrieval mode: wrapped in the observation group of its messages (a
    chunk buffered before groups were written at activation is already wrapped)."""
    text = chunk.observations.strip()
    if text.startswith('<observation-group') and text.endswith('</observation-group>'):
        if ctx.group_markup_problem(text) is None:
            return text
    return ctx.wrap_in_observation_group(
        chunk.observations, ctx.group_range(chunk.start_seq, chunk.end_seq), group_id=ctx.group_id_for(chunk.start_seq)
    )
