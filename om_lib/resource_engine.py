"""Resource scope: one observational memory shared by every thread of a resource (issue 6, docs/resource_scope.md).

The engine delegates here when `scope` is `'resource'`. What a step reads is bounded by the resource's *pending*
threads (those with messages the record has not observed, listed by the store's pending index), never by how many
threads the resource has. Each thread keeps its own cursor in the record and it moves only when that thread's
observation is committed, so a failure midway through several threads keeps the progress already made and loses
nothing. Other threads' unobserved messages reach the Actor as `<other-conversation>` blocks until observed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from om_lib import context as ctx
from om_lib import observer as obs
from om_lib import parts as om_parts
from om_lib import resource_scope as rs
from om_lib.errors import DeadlineExceededError, ModelError, ThreadNotFoundError
from om_lib.llm import Content, ModelRequest
from om_lib.messages import Message
from om_lib.records import OMRecord, Thread
from om_lib.work import Job

if TYPE_CHECKING:
    from om_lib.engine import MemoryEngine, StepResult

logger = logging.getLogger(__name__)

# How many pending threads a step looks at, and how many of each other thread's newest unobserved messages the
# Actor sees (the rest stay pending and are counted; they reach the Actor once observed).
MAX_PENDING_THREADS = 50
OTHER_THREAD_MESSAGES = 20
OTHER_THREAD_PART_CHARS = 500
MAX_PARALLEL_BATCHES = 4


@dataclass
class ThreadBacklog:
    """One thread's unobserved messages (after its cursor in the resource record)."""

    thread_id: str
    messages: list[Message]
    tokens: int

    @property
    def last_seq(self) -> int:
        return self.messages[-1].seq or 0 if self.messages else 0


@dataclass
class BatchResult:
    """What one multi-thread Observer call produced, per real thread id (None: the call failed)."""

    backlogs: list[ThreadBacklog]
    parsed: dict[str, obs.ParsedObservations] | None
    error: Exception | None = None


class ResourceScope:
    """The resource-scope parts of a step, an observation and a background job, over the engine's ports."""

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine

    # -- a step -----------------------------------------------------------------------------------------------------
    def after_append(
        self,
        resource_id: str,
        thread_id: str,
        appended: Any,
        deadline: float,
        step_number: int,
        parts: list[dict[str, Any]],
        cycle_start: datetime,
    ) -> StepResult:
        from om_lib.engine import StepResult, _has_pending_tool_call

        e = self.engine
        thread: Thread = appended.thread
        record = e._get_or_create_record(resource_id, thread_id)
        backlogs = self.backlogs(record, resource_id, current=thread_id)
        current = backlogs.get(thread_id) or ThreadBacklog(thread_id, [], 0)
        others = [b for t, b in backlogs.items() if t != thread_id]
        blocks = self.other_conversation_blocks(record, resource_id, others)
        pending = current.tokens + e.counter.count_string(blocks) if blocks else current.tokens
        threshold = e._message_threshold(record)

        if pending >= threshold and not _has_pending_tool_call(current.messages):
            record = self.observe(record, list(backlogs.values()), deadline, parts, threshold=threshold)
            backlogs = self.backlogs(record, resource_id, current=thread_id)
            current = backlogs.get(thread_id) or ThreadBacklog(thread_id, [], 0)
            others = [b for t, b in backlogs.items() if t != thread_id]
            blocks = self.other_conversation_blocks(record, resource_id, others)
            thread = e.store.get_thread(resource_id, thread_id) or thread
        if e._reflection_due(record) and self.reflection_may_start(resource_id, cycle_start):
            record = e._reflect_or_hand_off(record, thread_id, deadline, parts)

        visible = list(current.messages)
        seen = {m.id for m in visible}
        protected = [m for m in appended.messages if m.id not in seen and m.role == 'user']
        visible = sorted([*protected, *visible], key=lambda m: m.seq or 0)
        system = self.system_text(record, thread, blocks)
        messages = [e._continuation_message(), *visible] if record.active_observations.strip() else visible
        parts.append(e._status_part(record, messages, thread_id, step_number))
        return StepResult(thread_id, resource_id, system, messages, parts, record, list(appended.created_ids))

    def backlogs(self, record: OMRecord, resource_id: str, *, current: str | None) -> dict[str, ThreadBacklog]:
        """Unobserved messages of the current thread and of every pending thread (stale marks are cleared)."""
        e = self.engine
        thread_ids = [p.thread_id for p in e.store.list_pending_threads(resource_id, limit=MAX_PENDING_THREADS)]
        if current is not None and current not in thread_ids:
            thread_ids.insert(0, current)
        out: dict[str, ThreadBacklog] = {}
        for tid in thread_ids:
            cursor = record.cursor(tid)
            messages = e._load_after(resource_id, tid, cursor)
            if not messages:
                if tid != current:
                    e.store.clear_pending(resource_id, tid, observed_through=cursor)
                continue
            out[tid] = ThreadBacklog(tid, messages, e.counter.count_messages(messages))
        return out

    def other_conversation_blocks(self, record: OMRecord, resource_id: str, others: Sequence[ThreadBacklog]) -> str:
        """The `<other-conversation>` blocks for the Actor: each other thread's newest unobserved messages."""
        codec = self.codec(resource_id)
        blocks = []
        for backlog in sorted(others, key=lambda b: b.messages[0].seq or 0 if b.messages else 0):
            shown = backlog.messages[-OTHER_THREAD_MESSAGES:]
            transcript = obs.format_messages_for_observer(
                shown,
                timezone=record.observed_timezone,
                max_part_length=OTHER_THREAD_PART_CHARS,
                count=self.engine.counter.count_string,
            ).text
            left_out = len(backlog.messages) - len(shown)
            if left_out:
                transcript = f'({left_out} earlier messages of this conversation are not shown)\n{transcript}'
            blocks.append(rs.other_conversation_block(codec.shown(backlog.thread_id), transcript))
        return rs.join_other_conversations(blocks) or ''

    def system_text(self, record: OMRecord, thread: Thread, blocks: str) -> str:
        e = self.engine
        retrieval = e.settings.retrieval
        messages = ctx.build_observation_system_messages(
            record.active_observations,
            now=e.clock.now(),
            current_task=thread.current_task,
            suggested_response=thread.suggested_response,
            retrieval=retrieval is not None,
            retrieval_scope=retrieval.scope if retrieval is not None else 'resource',
            other_conversations=blocks or None,
        )
        return ctx.join_system_messages(messages)

    def reflection_may_start(self, resource_id: str, cycle_start: datetime) -> bool:
        """Reflection waits until every message older than this cycle's start is observed (newer ones do not block)."""
        pending = self.engine.store.list_pending_threads(resource_id, limit=1)
        return not pending or pending[0].pending_since >= cycle_start

    def codec(self, resource_id: str) -> rs.ThreadIdCodec:
        return rs.ThreadIdCodec(resource_id, obscure=self.engine.settings.obscure_thread_ids)

    # -- observing several threads ------------------------------------------------------------------------------------
    def observe(
        self,
        record: OMRecord,
        backlogs: Sequence[ThreadBacklog],
        deadline: float,
        parts: list[dict[str, Any]],
        *,
        threshold: int | None,
        can_defer: bool = True,
    ) -> OMRecord:
        """One resource-scope observation cycle over the selected threads (spec §17.4, with per-thread cursors).

        `threshold=None` takes every thread with a backlog (the worker and the sweeper: quiet threads are observed
        too). Returns the freshest record.
        """
        from om_lib.engine import MIN_SYNC_OBSERVATION_S, _has_pending_tool_call

        e = self.engine
        now = e.clock.now()
        ready = [b for b in backlogs if b.messages and not _has_pending_tool_call(b.messages)]
        if not ready:
            return record
        by_id = {b.thread_id: b for b in ready}
        loads = [rs.ThreadLoad(b.thread_id, b.tokens, b.messages[0].created_at) for b in ready]
        chosen = rs.select_threads(loads, threshold if threshold is not None else sum(x.tokens for x in loads), now=now)
        selected = [by_id[x.thread_id] for x in chosen]
        tokens = sum(b.tokens for b in selected)
        cycle = e._start_cycle()
        anchor = selected[0].thread_id
        if can_defer and e.work is not None and deadline - e.clock.monotonic() < MIN_SYNC_OBSERVATION_S:
            return self._defer(record, anchor, cycle, tokens, parts, 'no time left in this request')

        wanted = {b.thread_id: b.last_seq for b in selected}
        leased = e._take_lease(
            record,
            'observing',
            cycle.cycle_id,
            lambda cur: any(cur.cursor(t) < seq for t, seq in wanted.items()),
            deadline=deadline,
        )
        if leased is None:
            return e.store.get_record(record.key) or record  # another request is observing (or already did)
        # Re-check after winning: a holder that finished meanwhile may have observed part of these backlogs.
        selected = [trimmed for b in selected if (trimmed := _after_cursor(b, leased.cursor(b.thread_id), e))]
        if not selected:  # pragma: no cover - the lease is only taken while something is left
            return e._release_lease(leased, 'observing', cycle.cycle_id)
        thread_ids = [b.thread_id for b in selected]
        for b in selected:
            parts.append(
                om_parts.observation_start(
                    cycle_id=cycle.cycle_id,
                    operation='observation',
                    started_at=cycle.started_at,
                    tokens_to_observe=b.tokens,
                    record_id=leased.id,
                    thread_id=b.thread_id,
                    thread_ids=thread_ids,
                    config=e._marker_config(),
                )
            )
        try:
            results = self._run_batches(leased, selected, deadline)
        except Exception:
            e._release_lease_quietly(leased, 'observing', cycle.cycle_id)
            raise
        done = [r for r in results if r.parsed is not None]
        failed = [r for r in results if r.parsed is None]
        committed = self._commit(leased, cycle.cycle_id, done) if done else None
        if committed is None:
            # Nothing was written (every batch failed, or the lease was taken over): every thread stays pending.
            failed, done = results, []
            committed = e._release_lease(leased, 'observing', cycle.cycle_id)
        for result in failed:
            exc = result.error or RuntimeError('the observing lease was lost before commit')
            reason = None if result.error is not None else 'conflict'
            for b in result.backlogs:
                parts.append(e._failed_part(cycle, 'observation', b.tokens, exc, leased.id, b.thread_id, reason=reason))
        if can_defer and any(isinstance(r.error, DeadlineExceededError) for r in failed):
            e._submit(Job('observe', record.resource_id, anchor, record.key, 'deferred'))
        if done:
            self._after_commit(committed, cycle, done, parts)
        return committed

    def _run_batches(self, record: OMRecord, selected: list[ThreadBacklog], deadline: float) -> list[BatchResult]:
        loads = [rs.ThreadLoad(b.thread_id, b.tokens, None) for b in selected]
        by_id = {b.thread_id: b for b in selected}
        batches = [
            [by_id[x.thread_id] for x in batch]
            for batch in rs.batch_threads(loads, self.engine.settings.max_tokens_per_batch)
        ]
        if len(batches) == 1:
            return [self._observe_batch(record, batches[0], deadline)]
        # Batches run in parallel (spec §17.4 step 7); each keeps its own failure.
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_BATCHES, len(batches))) as pool:
            return list(pool.map(lambda batch: self._observe_batch(record, batch, deadline), batches))

    def _observe_batch(self, record: OMRecord, batch: list[ThreadBacklog], deadline: float) -> BatchResult:
        e = self.engine
        s = e.settings
        codec = self.codec(record.resource_id)
        context_text, truncated = obs.prepare_observer_context(
            record.active_observations,
            s.previous_observer_tokens,
            e.counter.count_string,
            buffered_reflection=record.buffered_reflection,
            reflected_line_count=record.reflected_line_count,
        )
        inputs: list[obs.ThreadInput] = []
        image_index = file_index = 1
        for b in batch:
            thread = e.store.get_thread(record.resource_id, b.thread_id)
            transcript = obs.format_messages_for_observer(
                b.messages,
                timezone=record.observed_timezone,
                count=e.counter.count_string,
                first_image_index=image_index,
                first_file_index=file_index,
            )
            image_index += sum(1 for a in transcript.attachments if a.kind == 'image')
            file_index += sum(1 for a in transcript.attachments if a.kind == 'file')
            inputs.append(
                (
                    codec.shown(b.thread_id),
                    transcript,
                    thread.current_task if thread else None,
                    thread.suggested_response if thread else None,
                    thread.title if thread else None,
                )
            )
        prompt = obs.build_multi_thread_observer_request(inputs, context_text, truncated, s.thread_title)
        request = ModelRequest(
            purpose='observer',
            system=obs.build_observer_system_prompt(
                instruction=s.observation_instruction, thread_title=s.thread_title, multi_thread=True
            ),
            contents=(Content('user', (prompt,)),),
            temperature=s.observer_temperature,
            max_output_tokens=s.observer_max_output_tokens,
            thinking_budget=s.observer_thinking_budget,
            source_messages=tuple(m for b in batch for m in b.messages),
            source_observations=context_text,
        )
        shown_ids = [shown for shown, *_ in inputs]
        try:
            for attempt in range(2):
                response = e.router.generate(
                    s.observer_model, request, input_tokens=sum(b.tokens for b in batch), deadline=deadline
                )
                parsed = obs.parse_multi_thread_observer_output(response.text, shown_ids)
                if not any(p.degenerate for p in parsed.values()):
                    by_real = {b.thread_id: parsed[codec.shown(b.thread_id)] for b in batch}
                    return BatchResult(batch, by_real)
                logger.warning('observer output degenerate', extra={'attempt': attempt + 1})
            raise ModelError('Observer produced degenerate output after retry')
        except (ModelError, DeadlineExceededError) as exc:
            logger.warning('resource observation batch failed', extra={'threads': len(batch), 'error': str(exc)})
            return BatchResult(batch, None, exc)

    def _commit(self, leased: OMRecord, owner: str, done: list[BatchResult]) -> OMRecord | None:
        e = self.engine
        codec = self.codec(leased.resource_id)
        ordered = [(b, r.parsed[b.thread_id]) for r in done for b in r.backlogs if r.parsed is not None]
        ordered.sort(key=lambda item: item[0].messages[0].created_at)

        def apply(current: OMRecord) -> OMRecord | None:
            held = current.observing
            if held is None or held.owner != owner:
                return None  # the lease was taken over: a stale holder never writes
            text = current.active_observations
            cursors = dict(current.cursors)
            last_observed = current.last_observed_at
            observed_tokens = 0
            for backlog, parsed in ordered:
                if cursors.get(backlog.thread_id, 0) >= backlog.last_seq:
                    continue
                observed_at = max(m.created_at for m in backlog.messages)
                if parsed.observations.strip():
                    section = rs.wrap_with_thread_tag(codec.shown(backlog.thread_id), parsed.observations)
                    text = rs.replace_or_append_thread_section(text, section, observed_at)
                cursors[backlog.thread_id] = backlog.last_seq
                last_observed = max(last_observed, observed_at) if last_observed else observed_at
                observed_tokens += backlog.tokens
            return current.model_copy(
                update={
                    'active_observations': text,
                    'observation_tokens': e.counter.count_observations(text),
                    'total_tokens_observed': current.total_tokens_observed + observed_tokens,
                    'cursors': cursors,
                    'last_observed_at': last_observed,
                    'observing': None,
                }
            )

        return e._commit(leased, apply)

    def _after_commit(
        self, committed: OMRecord, cycle: Any, done: list[BatchResult], parts: list[dict[str, Any]]
    ) -> None:
        e = self.engine
        for result in done:
            assert result.parsed is not None
            for backlog in result.backlogs:
                parsed = result.parsed[backlog.thread_id]
                e.store.clear_pending(committed.resource_id, backlog.thread_id, observed_through=backlog.last_seq)
                thread = e.store.get_thread(committed.resource_id, backlog.thread_id)
                if thread is not None:
                    e._update_thread_hints(thread, parsed, cycle, parts)
                parts.append(
                    om_parts.observation_end(
                        cycle_id=cycle.cycle_id,
                        operation='observation',
                        completed_at=e.clock.now(),
                        duration_ms=e._elapsed_ms(cycle),
                        tokens_observed=backlog.tokens,
                        observation_tokens=e.counter.count_observations(parsed.observations),
                        observations=parsed.observations,
                        current_task=parsed.current_task,
                        suggested_response=parsed.suggested_response,
                        record_id=committed.id,
                        thread_id=backlog.thread_id,
                    )
                )

    def _defer(
        self, record: OMRecord, thread_id: str, cycle: Any, tokens: int, parts: list[dict[str, Any]], why: str
    ) -> OMRecord:
        e = self.engine
        if e._submit(Job('observe', record.resource_id, thread_id, record.key, 'deferred')):
            error, reason = f'observation deferred to the background worker ({why})', 'deferred'
        else:
            error, reason = f'observation postponed: {why}; the work queue is unavailable', 'error'
        parts.append(e._failed_part(cycle, 'observation', tokens, error, record.id, thread_id, reason=reason))
        return record

    # -- background ---------------------------------------------------------------------------------------------------
    def observe_all(
        self, resource_id: str, thread_id: str, deadline: float, *, reflect: bool
    ) -> tuple[OMRecord, list[dict[str, Any]]]:
        """Observe every pending thread of the resource, below the threshold too (the worker and the sweeper)."""
        e = self.engine
        if e.store.get_thread(resource_id, thread_id) is None:
            raise ThreadNotFoundError(thread_id)
        parts: list[dict[str, Any]] = []
        cycle_start = e.clock.now()
        record = e._get_or_create_record(resource_id, thread_id)
        backlogs = self.backlogs(record, resource_id, current=thread_id)
        if backlogs:
            record = self.observe(record, list(backlogs.values()), deadline, parts, threshold=None, can_defer=False)
        if reflect and e._reflection_due(record) and self.reflection_may_start(resource_id, cycle_start):
            record = e._reflect_or_hand_off(record, thread_id, deadline, parts)
        return record, parts

    def pending_tokens(self, record: OMRecord, resource_id: str, thread_id: str) -> int:
        """What counts toward the threshold for `thread_id`'s next step (its backlog and the other blocks)."""
        backlogs = self.backlogs(record, resource_id, current=thread_id)
        current = backlogs.get(thread_id)
        others = [b for t, b in backlogs.items() if t != thread_id]
        blocks = self.other_conversation_blocks(record, resource_id, others)
        return (current.tokens if current else 0) + (self.engine.counter.count_string(blocks) if blocks else 0)


def _after_cursor(backlog: ThreadBacklog, cursor: int, engine: MemoryEngine) -> ThreadBacklog | None:
    """The part of a backlog after `cursor` (None when nothing is left)."""
    if not backlog.messages or (backlog.messages[0].seq or 0) > cursor:
        return backlog
    rest = [m for m in backlog.messages if (m.seq or 0) > cursor]
    return ThreadBacklog(backlog.thread_id, rest, engine.counter.count_messages(rest)) if rest else None
