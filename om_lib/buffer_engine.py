"""Async buffering in thread scope (issue 5; reference spec §10–§12): the engine delegates here when a work queue is
available and `observation.bufferTokens` / `reflection.bufferActivation` are on.

- **Buffering.** Each time pending tokens cross a `bufferTokens` interval, the step queues a `buffer` job (SQS FIFO,
  one group per record, de-duplicated by message range) and carries on: the step never calls a model for it. The
  worker observes that slice and appends a buffered chunk with a conditional write that is a no-op when the range is
  already buffered or observed, so a redelivered or re-run job adds nothing.
- **Activation.** When pending tokens reach `messageTokens`, a prefix of the chunks moves into the active
  observations (the activation math is `om_lib/buffering.py`); no model call. The cursor moves to the last activated
  chunk, so those messages leave the Actor's context.
- **blockAfter.** Past it, after activating what there is, a synchronous observation runs as a last resort within the
  request's time budget (or is deferred to the worker when the budget is spent).
- **Buffered reflection.** At `observationTokens × reflection.bufferActivation` a background reflection of the leading
  lines starts through the workflow and is staged on the record; past `observationTokens` it activates (a new
  generation: the staged reflection plus every line appended since). Past `reflection.blockAfter` with nothing staged,
  the request reflects synchronously.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from om_lib import buffering as buf
from om_lib import context as ctx
from om_lib import parts as om_parts
from om_lib import reflector as refl
from om_lib.errors import DeadlineExceededError, ModelError, ThreadNotFoundError, VersionConflictError
from om_lib.messages import Message
from om_lib.records import BufferedChunk, Lease, ObservationGroup, OMRecord, Thread
from om_lib.thresholds import resolve_retention_floor
from om_lib.work import Job

if TYPE_CHECKING:
    from om_lib.engine import MemoryEngine

logger = logging.getLogger(__name__)

# How long a queued buffering job or reflection counts as "running" in status answers (a hint, never a lock).
RUNNING_HINT_TTL = timedelta(minutes=2)
# Below this much time left in a request, a due synchronous reflection is handed to the workflow instead.
MIN_SYNC_REFLECTION_S = 2.0


class ThreadBuffering:
    """The buffering parts of a step, a turn and a background job, over the engine's ports."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine

    # -- the step ---------------------------------------------------------------------------------------------------
    def step(
        self,
        record: OMRecord,
        thread: Thread,
        unobserved: list[Message],
        deadline: float,
        parts: list[dict[str, Any]],
    ) -> tuple[OMRecord, Thread, list[Message]]:
        """Activate buffered chunks when due, observe past blockAfter, queue the next slice; returns the new state."""
        from om_lib.engine import _has_pending_tool_call

        e = self.engine
        s = e.settings
        record = self.deliver_background_parts(record, parts)
        pending = e.counter.count_messages(unobserved)
        threshold = e._message_threshold(record)
        if record.buffered_chunks and pending >= threshold:
            record, thread, activated = self.activate(record, thread, pending, parts)
            if activated:
                unobserved = e._load_unobserved(record, record.resource_id, thread.id)
                pending = e.counter.count_messages(unobserved)
        waiting_on_tool = _has_pending_tool_call(unobserved)
        retained: list[Message] = []
        if unobserved and not waiting_on_tool and s.block_after is not None and pending >= s.block_after:
            # Buffering could not keep up: observe synchronously, the last resort (spec §7.9, seed 000 blockAfter).
            before = unobserved
            record, thread = e._observe(record, thread, unobserved, deadline, parts)
            unobserved = e._load_unobserved(record, record.resource_id, thread.id)
            pending = e.counter.count_messages(unobserved)
            still = {m.id for m in unobserved}
            floor = resolve_retention_floor(
                s.buffer_activation or buf.DEFAULT_BUFFER_ACTIVATION, s.max_message_threshold()
            )
            observed = [m for m in before if m.id not in still]
            retained = buf.retained_after_observation(observed, pending, floor, e.counter.count_messages)
        if unobserved and not waiting_on_tool:
            record, _ = self.maybe_enqueue(record, thread.id, unobserved, pending, parts)
        return record, thread, [*retained, *unobserved]

    def maybe_enqueue(
        self, record: OMRecord, thread_id: str, unobserved: list[Message], pending: int, parts: list[dict[str, Any]]
    ) -> tuple[OMRecord, bool]:
        """Queue a buffering job when pending crossed a new `bufferTokens` interval (spec §10.1–§10.2)."""
        from om_lib.engine import _has_pending_tool_call

        e = self.engine
        buffer_tokens = e.settings.buffer_tokens
        if not buffer_tokens or not unobserved or _has_pending_tool_call(unobserved):
            return record, False
        threshold = e._message_threshold(record)
        if not buf.should_buffer(pending, record.last_buffered_at_tokens, buffer_tokens, threshold):
            return record, False
        cursor = record.cursor(thread_id)
        start = buf.slice_start(cursor, buf.live_chunks(record.buffered_chunks, cursor))
        batch = [m for m in unobserved if (m.seq or 0) >= start]
        tokens = e.counter.count_messages(batch)
        if not batch or tokens < buffer_tokens / 2:
            return record, False  # not enough new content yet (spec §10.3 step 5)
        cycle = e._start_cycle()
        cycle_id = f'buffer-obs-{cycle.cycle_id}'
        job = Job(
            'buffer',
            record.resource_id,
            thread_id,
            record.key,
            'interval',
            start_seq=start,
            end_seq=batch[-1].seq or start,
            cycle_id=cycle_id,
        )
        if not e._submit(job):
            return record, False
        hint = Lease(owner=cycle_id, expires_at=e.clock.now() + RUNNING_HINT_TTL)

        def mark(current: OMRecord) -> OMRecord | None:
            return current.model_copy(update={'last_buffered_at_tokens': pending, 'buffering_observation': hint})

        try:
            record = e._commit(record, mark) or record
        except VersionConflictError:
            pass  # only the interval bookkeeping is lost: at worst one more job, which the range makes a no-op
        parts.append(
            om_parts.buffering_start(
                cycle_id=cycle_id,
                operation='observation',
                started_at=cycle.started_at,
                tokens_to_buffer=tokens,
                record_id=record.id,
                thread_id=thread_id,
                thread_ids=[thread_id],
                config=e._marker_config(),
            )
        )
        return record, True

    # -- activation -------------------------------------------------------------------------------------------------
    def activate(
        self,
        record: OMRecord,
        thread: Thread,
        pending: int,
        parts: list[dict[str, Any]],
        *,
        everything: bool = False,
    ) -> tuple[OMRecord, Thread, bool]:
        """Move buffered chunks into the active observations (no model call; spec §11).

        `everything` activates every chunk (the worker's full observation, before it observes the rest).
        """
        e = self.engine
        s = e.settings
        thread_id = thread.id
        cursor = record.cursor(thread_id)
        chunks = buf.live_chunks(record.buffered_chunks, cursor)
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
            cur_cursor = current.cursor(thread_id)
            live = buf.live_chunks(current.buffered_chunks, cur_cursor)
            if tuple(c.id for c in live[:count]) != planned:
                return None  # another step activated (or observed) meanwhile
            act = buf.activate_chunks(
                current.active_observations,
                live,
                count,
                cursor=cur_cursor,
                last_observed_at=current.last_observed_at,
            )
            done[:] = [act]
            groups = tuple(
                ObservationGroup(
                    id=c.id[-16:],
                    thread_id=thread_id,
                    start_id=c.message_ids[0],
                    end_id=c.message_ids[-1],
                    start_seq=c.start_seq,
                    end_seq=c.end_seq,
                    created_at=e.clock.now(),
                )
                for c in act.activated
                if c.message_ids
            )
            return current.model_copy(
                update={
                    'active_observations': act.active_observations,
                    'observation_tokens': e.counter.count_observations(act.active_observations),
                    'total_tokens_observed': current.total_tokens_observed + act.message_tokens,
                    'cursors': {**current.cursors, thread_id: act.cursor},
                    'last_observed_at': act.last_observed_at,
                    'groups': (*current.groups, *groups),
                    'buffered_chunks': act.remaining,
                    'last_buffered_at_tokens': 0,
                    'pending_message_tokens': max(0, pending - act.message_tokens),
                }
            )

        try:
            committed = e._commit(record, apply)
        except VersionConflictError:
            committed = None
        if committed is None or not done:
            return e.store.get_record(record.key) or record, thread, False
        act = done[0]
        thread = self._carry_hints(thread, act)
        now = e.clock.now()
        for chunk in act.activated:
            parts.append(
                om_parts.activation(
                    cycle_id=chunk.cycle_id,
                    operation='observation',
                    activated_at=now,
                    chunks_activated=1,
                    tokens_activated=chunk.message_tokens,
                    observation_tokens=committed.observation_tokens,
                    messages_activated=len(chunk.message_ids),
                    generation_count=committed.generation,
                    observations=chunk.observations,
                    record_id=committed.id,
                    thread_id=thread_id,
                    config=e._marker_config(),
                )
            )
        return committed, thread, True

    def _carry_hints(self, thread: Thread, act: buf.Activation) -> Thread:
        """Continuation hints survive activation: the last activated chunk's, else the thread keeps its own."""
        e = self.engine
        update: dict[str, Any] = {}
        if act.current_task or act.suggested_response:
            update = {'current_task': act.current_task, 'suggested_response': act.suggested_response}
        title = (act.thread_title or '').strip()
        if e.settings.thread_title and len(title) >= 3 and title != (thread.title or ''):
            update['title'] = title
        if not update:
            return thread
        try:
            return e.store.update_thread(thread.model_copy(update={**update, 'updated_at': e.clock.now()}))
        except Exception:  # noqa: BLE001 - hints are advisory; the activation is committed
            logger.exception('could not update thread hints', extra={'thread_id': thread.id})
            return thread

    # -- background outcomes ----------------------------------------------------------------------------------------
    def finish_background(
        self, record: OMRecord, hint_attr: str, cycle_id: str | None, part: dict[str, Any] | None
    ) -> None:
        """Clear this cycle's running hint and keep its end/failed part for the next step (best effort)."""
        e = self.engine

        def finish(current: OMRecord) -> OMRecord | None:
            hint = getattr(current, hint_attr)
            update: dict[str, Any] = {}
            if hint is not None and cycle_id is not None and hint.owner == cycle_id:
                update[hint_attr] = None
            if part is not None:
                update['background_parts'] = buf.keep_background_part(current.background_parts, part)
            return current.model_copy(update=update) if update else None

        try:
            e._commit(record, finish)
        except VersionConflictError:  # the hint expires on its own; the part is in the worker's logs
            logger.warning('could not record a background outcome', extra={'key': record.key})

    def deliver_background_parts(self, record: OMRecord, parts: list[dict[str, Any]]) -> OMRecord:
        """Answer the end/failed parts of background work finished since the last step, then forget them.

        At least once: two concurrent steps may both answer a part; a lost write answers it again next step.
        """
        waiting = record.background_parts
        if not waiting:
            return record
        texts = {c.cycle_id: c.observations for c in record.buffered_chunks}
        for part in waiting:
            text = texts.get(part['data'].get('cycleId', ''))
            if part['type'] == 'data-om-buffering-end' and 'observations' not in part['data'] and text:
                parts.append(om_parts.with_observations(part, text))
            else:
                parts.append({**part, 'data': dict(part['data'])})  # a copy: the record's own stays as stored
        delivered = {buf.background_part_key(p) for p in waiting}

        def forget(current: OMRecord) -> OMRecord | None:
            rest = tuple(p for p in current.background_parts if buf.background_part_key(p) not in delivered)
            if len(rest) == len(current.background_parts):
                return None
            return current.model_copy(update={'background_parts': rest})

        try:
            return self.engine._commit(record, forget) or record
        except VersionConflictError:
            return record

    # -- the worker -------------------------------------------------------------------------------------------------
    def run_buffer_job(self, job: Job, deadline: float) -> list[dict[str, Any]]:
        """Observe one slice and store it as a buffered chunk. Idempotent per (record, message range)."""
        e = self.engine
        thread = e.store.get_thread(job.resource_id, job.thread_id)
        if thread is None:
            raise ThreadNotFoundError(job.thread_id)
        record = e.store.get_record(job.record_key)
        if record is None or job.end_seq is None:
            return []
        thread_id = thread.id
        cursor = record.cursor(thread_id)
        chunks = buf.live_chunks(record.buffered_chunks, cursor)
        # Start after whatever is buffered or observed by now (not the job's own start): consecutive chunks stay
        # disjoint and gapless even when an earlier job was lost.
        start = buf.slice_start(cursor, chunks)
        if job.end_seq < start:
            # This range is buffered or observed already (a redelivered job).
            self.finish_background(record, 'buffering_observation', job.cycle_id, None)
            return []
        messages = [m for m in e._load_after(job.resource_id, thread_id, start - 1) if (m.seq or 0) <= job.end_seq]
        messages = [m for m in messages if m.role != 'system']
        if not messages:
            self.finish_background(record, 'buffering_observation', job.cycle_id, None)
            return []
        cycle = e._start_cycle()
        cycle_id = job.cycle_id or f'buffer-obs-{cycle.cycle_id}'
        tokens = e.counter.count_messages(messages)
        # The Observer sees what is active plus what is already buffered, so the new chunk does not repeat it.
        previous = '\n\n'.join(
            t for t in (record.active_observations.strip(), *(c.observations.strip() for c in chunks)) if t
        )
        context_record = record.model_copy(update={'active_observations': previous})
        try:
            parsed = e._call_observer(context_record, thread, messages, tokens, deadline)
        except (ModelError, DeadlineExceededError) as exc:
            reason = 'timeout' if isinstance(exc, DeadlineExceededError) else 'error'
            logger.warning('buffering failed', extra={'thread_id': thread_id, 'error': str(exc)})
            failed = om_parts.buffering_failed(
                cycle_id=cycle_id,
                operation='observation',
                failed_at=e.clock.now(),
                duration_ms=e._elapsed_ms(cycle),
                tokens_attempted=tokens,
                error=str(exc) or type(exc).__name__,
                record_id=record.id,
                thread_id=thread_id,
                reason=reason,
            )
            self.finish_background(record, 'buffering_observation', cycle_id, failed)
            return [failed]
        text = parsed.observations.strip()
        if not text:
            # Nothing worth keeping; the next job (or the threshold) covers these messages again.
            self.finish_background(record, 'buffering_observation', cycle_id, None)
            return []
        if e.settings.retrieval is not None:
            text = ctx.wrap_in_observation_group(text, messages[0].id, messages[-1].id)
        chunk = BufferedChunk(
            id=f'ombuf-{e._new_id()}',
            cycle_id=cycle_id,
            thread_id=thread_id,
            observations=text,
            token_count=e.counter.count_observations(text),
            message_ids=tuple(m.id for m in messages),
            message_tokens=tokens,
            start_seq=messages[0].seq or start,
            end_seq=messages[-1].seq or start,
            last_observed_at=max(m.created_at for m in messages),
            created_at=e.clock.now(),
            current_task=parsed.current_task,
            suggested_response=parsed.suggested_response,
            thread_title=parsed.thread_title,
        )

        completed_at, duration_ms = e.clock.now(), e._elapsed_ms(cycle)

        def ended(record_id: str) -> dict[str, Any]:
            # Without its text: the record keeps the part next to the chunk that holds it; delivery adds it back.
            return om_parts.buffering_end(
                cycle_id=cycle_id,
                operation='observation',
                completed_at=completed_at,
                duration_ms=duration_ms,
                tokens_buffered=tokens,
                buffered_tokens=chunk.token_count,
                observations=None,
                record_id=record_id,
                thread_id=thread_id,
            )

        def append(current: OMRecord) -> OMRecord | None:
            cur_cursor = current.cursor(thread_id)
            live = buf.live_chunks(current.buffered_chunks, cur_cursor)
            if buf.slice_start(cur_cursor, live) != start:
                return None  # buffered or observed meanwhile: adding this chunk would duplicate it
            hint = current.buffering_observation
            if hint is not None and hint.owner == cycle_id:
                hint = None
            return current.model_copy(
                update={
                    'buffered_chunks': (*live, chunk),
                    'buffering_observation': hint,
                    'background_parts': buf.keep_background_part(current.background_parts, ended(current.id)),
                }
            )

        committed = e._commit(record, append)
        if committed is None:
            self.finish_background(record, 'buffering_observation', cycle_id, None)
            return []
        return [om_parts.with_observations(ended(committed.id), text)]

    # -- buffered reflection ----------------------------------------------------------------------------------------
    def reflection_wanted(self, record: OMRecord) -> bool:
        """Observations reached `observationTokens × reflection.bufferActivation` and nothing is staged or running."""
        e = self.engine
        s = e.settings
        ratio = s.reflection_buffer_activation
        now = e.clock.now()
        return bool(
            ratio
            and record.active_observations.strip()
            and record.buffered_reflection is None
            and record.observation_tokens >= s.observation_tokens * ratio
            and record.reflection_stalled_at_tokens != record.observation_tokens
            and not (record.reflecting is not None and record.reflecting.active(now))
            and not (record.buffering_reflection is not None and record.buffering_reflection.active(now))
            and not record.reflection_backing_off(now)
        )

    def maybe_start_reflection(
        self, record: OMRecord, thread_id: str, parts: list[dict[str, Any]]
    ) -> tuple[OMRecord, bool]:
        """Start a background reflection through the workflow when due; marks the record so it starts once."""
        e = self.engine
        if not self.reflection_wanted(record):
            return record, False
        cycle = e._start_cycle()
        cycle_id = f'buffer-refl-{cycle.cycle_id}'
        hint = Lease(owner=cycle_id, expires_at=e.clock.now() + RUNNING_HINT_TTL)
        wanted = self.reflection_wanted

        def mark(current: OMRecord) -> OMRecord | None:
            if current.generation != record.generation or not wanted(current):
                return None
            return current.model_copy(update={'buffering_reflection': hint})

        try:
            marked = e._commit(record, mark)
        except VersionConflictError:
            marked = None
        if marked is None:
            return e.store.get_record(record.key) or record, False
        job = Job('reflect', record.resource_id, thread_id, record.key, 'buffer', cycle_id=cycle_id)
        if not e._submit(job):
            return marked, False
        slice_ = buf.reflection_slice(
            marked.active_observations,
            marked.observation_tokens,
            e.settings.observation_tokens,
            e.settings.reflection_buffer_activation or 0.5,
        )
        parts.append(
            om_parts.buffering_start(
                cycle_id=cycle_id,
                operation='reflection',
                started_at=cycle.started_at,
                tokens_to_buffer=slice_.input_tokens,
                record_id=marked.id,
                thread_id=thread_id,
                thread_ids=[thread_id],
                config=e._marker_config(),
            )
        )
        return marked, True

    def reflection_step(
        self, record: OMRecord, thread_id: str, deadline: float, parts: list[dict[str, Any]]
    ) -> OMRecord:
        """Activate a staged reflection past the threshold; reflect synchronously past blockAfter; else buffer."""
        e = self.engine
        s = e.settings
        over = record.observation_tokens > s.observation_tokens and bool(record.active_observations.strip())
        if over and record.buffered_reflection:
            activated = self.activate_reflection(record, thread_id, parts)
            if activated is not None:
                # Still past the start point: the next background reflection starts now (spec §12.4).
                return self.maybe_start_reflection(activated, thread_id, parts)[0]
            record = e.store.get_record(record.key) or record
        block_after = s.reflection_block_after
        if (
            over
            and not record.buffered_reflection
            and block_after is not None
            and record.observation_tokens >= block_after
            and deadline - e.clock.monotonic() >= MIN_SYNC_REFLECTION_S
        ):
            # The last resort: reflect inside this request (a running background reflection holds the lease and
            # wins; then this is a no-op).
            return e._maybe_reflect(record, thread_id, deadline, parts)
        return self.maybe_start_reflection(record, thread_id, parts)[0]

    def activate_reflection(self, record: OMRecord, thread_id: str, parts: list[dict[str, Any]]) -> OMRecord | None:
        """Make the staged reflection the new generation, keeping every line appended since (no model call)."""
        e = self.engine
        before = record.observation_tokens
        owner = f'activate-{e._new_id()}'
        now = e.clock.now()
        lease = Lease(owner=owner, expires_at=now + RUNNING_HINT_TTL)

        def take(current: OMRecord) -> OMRecord | None:
            held = current.reflecting
            if held is not None and held.active(now):
                return None
            running = current.buffering_reflection
            if running is not None and running.active(now):
                return None  # staged by a run that has not validated and released it yet
            if not current.buffered_reflection or current.generation != record.generation:
                return None
            return current.model_copy(update={'reflecting': lease})

        try:
            leased = e._commit(record, take)
        except VersionConflictError:
            leased = None
        if leased is None:
            return None

        def compose(current: OMRecord) -> str:
            return refl.merge_buffered_reflection(
                current.buffered_reflection or '', current.active_observations, current.reflected_line_count or 0
            )

        committed = e._commit_generation(leased, owner, compose)
        if committed is None:
            e._release_lease_quietly(leased, 'reflecting', owner)
            return None
        if committed.reflection_stalled_at_tokens is not None:
            # A buffered reflection covers only the leading lines, so a log still over the threshold is expected:
            # the next background reflection covers more. (A reflection that cannot shrink its slice still stalls.)
            try:
                committed = (
                    e._commit(committed, lambda cur: cur.model_copy(update={'reflection_stalled_at_tokens': None}))
                    or committed
                )
            except VersionConflictError:
                pass
        parts.append(
            om_parts.activation(
                cycle_id=leased.buffered_reflection_cycle_id or owner,
                operation='reflection',
                activated_at=e.clock.now(),
                chunks_activated=1,
                tokens_activated=before,
                observation_tokens=committed.observation_tokens,
                messages_activated=0,
                generation_count=committed.generation,
                observations=committed.active_observations,
                record_id=committed.id,
                thread_id=thread_id,
                config=e._marker_config(),
            )
        )
        return committed
