"""The step engine: what happens around every Actor call.

`prepare_step` saves the step's new input first, then loads only the unobserved messages (by cursor), observes
synchronously when they pass `messageTokens`, reflects when observations pass `observationTokens`, and returns what
the Actor should see. `complete_turn` saves the turn's outputs. A failing model never loses a message: the step
still answers, with a `data-om-observation-failed` part, and the backlog is observed on a later step.

Concurrency: every record write is conditional on its version (optimistic locking). Observation and reflection
first take a lease on the record (a flag with an expiry), so concurrent steps do not pay for the same model call
twice and a crashed holder never blocks the record for longer than the lease.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from om_lib import buffering
from om_lib import context as ctx
from om_lib import observer as obs
from om_lib import parts as om_parts
from om_lib import reflector as refl
from om_lib.buffer_engine import ThreadBuffering
from om_lib.config import OMConfig, ResolvedOMConfig
from om_lib.errors import (
    DeadlineExceededError,
    ModelError,
    ModelOutputError,
    ThreadNotFoundError,
    VersionConflictError,
)
from om_lib.ids import check_id
from om_lib.llm import Content, InlineBlob, ModelRequest
from om_lib.messages import Message, TextPart, ToolCallPart, ToolResultPart, iso
from om_lib.model_router import ModelRouter
from om_lib.ports import BlobReader, Clock, MemoryStore
from om_lib.records import Lease, ObservationGroup, OMRecord, Thread, record_key
from om_lib.resource_engine import ResourceScope
from om_lib.tokens import TokenCounter
from om_lib.work import BackgroundWork, Job

logger = logging.getLogger(__name__)

LEASE_TTL = timedelta(minutes=2)
# After a failed reflection run (its retries included), no new run starts for 30 s, doubling per failure up to 30 min:
# a model outage must not start a workflow execution on every step.
REFLECTION_RETRY_BASE = timedelta(seconds=30)
REFLECTION_RETRY_MAX = timedelta(minutes=30)
LEASE_MARGIN = timedelta(seconds=60)
MAX_COMMIT_ATTEMPTS = 4
UNOBSERVED_PAGE = 500
# Gemini accepts inline request data up to about 20 MB; stay well inside it.
MAX_INLINE_ATTACHMENT_BYTES = 12 * 1024 * 1024
# With observational memory off, the Actor gets the most recent messages (the seed's `lastMessages` default).
LAST_MESSAGES_WHEN_DISABLED = 10
# Below this much time left in a request, a due observation is handed to the worker instead of started.
MIN_SYNC_OBSERVATION_S = 1.0
# A background job may use this long (the worker Lambda's own timeout is longer).
WORKER_BUDGET_S = 600.0


@dataclass
class StepResult:
    """What the Actor should see for this step."""

    thread_id: str
    resource_id: str
    system: str
    messages: list[Message]
    parts: list[dict[str, Any]]
    record: OMRecord | None
    saved_ids: list[str] = field(default_factory=list)


@dataclass
class TurnResult:
    """What `complete_turn` saved."""

    saved: list[Message]
    parts: list[dict[str, Any]]
    scheduled: list[str] = field(default_factory=list)


class ReflectionRejectedError(ModelOutputError):
    """The reflection workflow refused to commit (empty, not smaller, or the lease was lost); memory is unchanged."""

    code = 'reflection_rejected'


@dataclass
class _Cycle:
    cycle_id: str
    started_at: datetime
    started_mono: float


class MemoryEngine:
    """Observational memory for one configuration, over injected store, model router, counter and clock."""

    def __init__(
        self,
        config: OMConfig,
        *,
        store: MemoryStore,
        router: ModelRouter,
        counter: TokenCounter,
        clock: Clock,
        blobs: BlobReader | None = None,
        time_budget_s: float = 20.0,
        id_factory: Callable[[], str] | None = None,
        work: BackgroundWork | None = None,
    ) -> None:
        self.config = config
        self.settings: ResolvedOMConfig = config.resolved()
        self.store = store
        self.router = router
        self.counter = counter
        self.clock = clock
        self.blobs = blobs
        self.time_budget_s = time_budget_s
        self._new_id = id_factory or (lambda: uuid.uuid4().hex)
        # With somewhere to send background work, reflection runs in the workflow (never inside a request) and an
        # observation that would overrun the request's time budget is deferred to the worker.
        self.work = work
        # Async buffering needs somewhere to run the background Observer/Reflector. Without it (a library user, unit
        # tests) the engine observes and reflects synchronously at the thresholds, as with `bufferTokens: false`.
        thread_scope = self.settings.enabled and self.settings.scope == 'thread' and work is not None
        self.buffering = bool(thread_scope and self.settings.async_observation_enabled)
        self.buffering_reflection = bool(thread_scope and self.settings.async_reflection_enabled)
        self._buffer = ThreadBuffering(self) if self.buffering or self.buffering_reflection else None
        # Resource scope: one memory for all of a resource's threads (om_lib/resource_engine.py).
        self._resource = ResourceScope(self) if self.settings.scope == 'resource' else None

    # ------------------------------------------------------------------------------------------------------------
    # Public operations
    # ------------------------------------------------------------------------------------------------------------
    def prepare_step(
        self, resource_id: str, thread_id: str, new_messages: Sequence[Message], *, step_number: int = 0
    ) -> StepResult:
        """Save the step's new input, update memory when due, and return the Actor's context."""
        deadline = self.clock.monotonic() + self.time_budget_s
        _check_ids(resource_id, thread_id)
        now = self.clock.now()
        incoming = [self.counter.with_token_counts(m) for m in _drop_engine_text(new_messages)]
        # Thread scope: the store can hand back the OM head with the append (one call instead of two per step).
        # Resource scope: the append lists the thread among the resource's pending ones (same write).
        appended = self.store.append_messages(
            resource_id,
            thread_id,
            incoming,
            now=now,
            include_record=self.settings.scope == 'thread',
            mark_pending=self._resource is not None and self.settings.enabled,
        )
        parts: list[dict[str, Any]] = []

        if not self.settings.enabled:
            page = self.store.list_messages(
                resource_id, thread_id, limit=LAST_MESSAGES_WHEN_DISABLED, newest_first=True
            )
            return StepResult(
                thread_id, resource_id, '', list(reversed(page.messages)), parts, None, list(appended.created_ids)
            )

        try:
            if self._resource is not None:
                return self._resource.after_append(
                    resource_id, thread_id, appended, deadline, step_number, parts, cycle_start=now
                )
            return self._after_append(resource_id, thread_id, appended, deadline, step_number, parts)
        except Exception as exc:  # noqa: BLE001 - the input is saved: trouble goes into the 200 answer (CONTRACT §2)
            logger.exception('memory update failed after the step was saved', extra={'thread_id': thread_id})
            cycle = self._start_cycle()
            parts.append(self._failed_part(cycle, 'observation', 0, exc, '', thread_id))
            raw = [m for m in appended.messages if m.role != 'system']
            return StepResult(thread_id, resource_id, '', raw, parts, None, list(appended.created_ids))

    def _after_append(
        self,
        resource_id: str,
        thread_id: str,
        appended: Any,
        deadline: float,
        step_number: int,
        parts: list[dict[str, Any]],
    ) -> StepResult:
        thread = appended.thread
        if appended.record_included and appended.record is not None:
            record = appended.record
        else:
            record = self._get_or_create_record(resource_id, thread_id)
        unobserved = self._load_unobserved(record, resource_id, thread_id)
        pending = self.counter.count_messages(unobserved)
        threshold = self._message_threshold(record)

        if self.buffering:
            assert self._buffer is not None
            record, thread, unobserved = self._buffer.step(record, thread, unobserved, deadline, parts)
        elif unobserved and pending >= threshold and not _has_pending_tool_call(unobserved):
            record, thread = self._observe(record, thread, unobserved, deadline, parts)
            unobserved = self._load_unobserved(record, resource_id, thread_id)
        record = self._reflect_or_hand_off(record, thread_id, deadline, parts)

        # The in-flight input of this step is never taken away from the Actor, even when it was just observed
        # (an oversized first message is observed at once, yet the Actor still needs to answer it).
        visible = list(unobserved)
        seen = {m.id for m in visible}
        protected = [m for m in appended.messages if m.id not in seen and m.role == 'user']
        visible = sorted([*protected, *visible], key=lambda m: m.seq or 0)

        system = self._system_text(record, thread)
        messages = visible
        if record.active_observations.strip():
            messages = [self._continuation_message(), *visible]
        parts.append(self._status_part(record, messages, thread_id, step_number))
        return StepResult(thread_id, resource_id, system, messages, parts, record, list(appended.created_ids))

    def complete_turn(self, resource_id: str, thread_id: str, outputs: Sequence[Message]) -> TurnResult:
        """Save the turn's outputs (assistant and tool messages). Idempotent per message id.

        With background work available, a due observation or reflection is scheduled now, so the next step finds
        it done instead of waiting for it.
        """
        _check_ids(resource_id, thread_id)
        incoming = [self.counter.with_token_counts(m) for m in _drop_engine_text(outputs)]
        appended = self.store.append_messages(
            resource_id,
            thread_id,
            incoming,
            now=self.clock.now(),
            mark_pending=self._resource is not None and self.settings.enabled,
        )
        scheduled: list[str] = []
        turn_parts: list[dict[str, Any]] = []  # data-om-buffering-start of what this turn queued
        if self.work is not None and self.settings.enabled:
            record = self.store.get_record(self._key(resource_id, thread_id))
            if record is not None:
                unobserved = self._load_unobserved(record, resource_id, thread_id)
                pending = self.counter.count_messages(unobserved)
                if self._resource is not None:
                    pending = self._resource.pending_tokens(record, resource_id, thread_id)
                due_at = self._message_threshold(record)
                if self._buffer is not None and self.buffering:
                    # Buffering: the turn queues the next slice. A full background observation is only for a backlog
                    # past blockAfter that activation will not cover (the next step would otherwise block on it).
                    record, queued = self._buffer.maybe_enqueue(record, thread_id, unobserved, pending, turn_parts)
                    if queued:
                        scheduled.append('buffer')
                    due_at = self.settings.block_after or due_at
                    if record.buffered_chunks:
                        due_at = max(due_at, pending + 1)
                if (
                    unobserved
                    and pending >= due_at
                    and not _has_pending_tool_call(unobserved)
                    and not _lease_active(record.observing, self.clock.now())
                ):
                    if self._submit(Job('observe', resource_id, thread_id, record.key, 'threshold')):
                        scheduled.append('observe')
                if self._buffer is not None and self.buffering_reflection:
                    if self._buffer.maybe_start_reflection(record, thread_id, turn_parts)[1]:
                        scheduled.append('reflect')
                elif self._reflection_due(record) and self._submit(
                    Job('reflect', resource_id, thread_id, record.key, 'threshold')
                ):
                    scheduled.append('reflect')
        return TurnResult(saved=list(appended.messages), parts=turn_parts, scheduled=scheduled)

    def observe_now(
        self, resource_id: str, thread_id: str, *, deadline: float | None = None, reflect: bool = True
    ) -> tuple[OMRecord, list[dict[str, Any]]]:
        """Observe every unobserved message of a thread regardless of the threshold (workers, tests, tools).

        Raises ThreadNotFoundError when the thread is gone (erased), so a late job writes nothing.
        """
        limit = deadline if deadline is not None else self.clock.monotonic() + self.time_budget_s
        if self._resource is not None:
            return self._resource.observe_all(resource_id, thread_id, limit, reflect=reflect)
        parts: list[dict[str, Any]] = []
        thread = self.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        record = self._get_or_create_record(resource_id, thread_id)
        if self._buffer is not None and record.buffered_chunks:
            # What is buffered becomes active first (no model call); only the rest is observed.
            pending = self.counter.count_messages(self._load_unobserved(record, resource_id, thread_id))
            record, thread, _ = self._buffer.activate(record, thread, pending, parts, everything=True)
        unobserved = self._load_unobserved(record, resource_id, thread_id)
        if unobserved and not _has_pending_tool_call(unobserved):
            record, _ = self._observe(record, thread, unobserved, limit, parts, can_defer=False)
        if reflect:
            record = self._reflect_or_hand_off(record, thread_id, limit, parts)
        return record, parts

    def run_job(self, job: Job, *, deadline: float | None = None) -> list[dict[str, Any]]:
        """Do one background job (the worker's entry point). Idempotent: finished or unneeded work is a no-op."""
        limit = deadline if deadline is not None else self.clock.monotonic() + WORKER_BUDGET_S
        if job.kind == 'title':
            from om_lib.titles import generate_title

            generate_title(self, job.resource_id, job.thread_id, deadline=limit)
            return []
        if job.kind == 'buffer':
            if self._buffer is None:
                return []  # buffering was switched off since the job was queued; the threshold path observes
            return self._buffer.run_buffer_job(job, limit)
        if job.kind == 'reflect' and job.reason == 'buffer':
            return self._run_buffered_reflection(job, limit)
        if job.kind == 'observe':
            _, parts = self.observe_now(job.resource_id, job.thread_id, deadline=limit, reflect=False)
            return parts
        record = self.store.get_record(job.record_key)
        parts = []
        if record is not None:
            self._maybe_reflect(record, job.thread_id, limit, parts)
        return parts

    def sweep(self, *, quiet_for: timedelta = timedelta(minutes=30), limit: int = 100) -> list[Job]:
        """The scheduled sweeper: start work for threads that went quiet with something left to do.

        A thread whose newest message is older than `quiet_for` and still has unobserved messages gets an
        observation job (a quiet thread is observed even below the threshold, so nothing said waits forever);
        a record over the reflection threshold gets a reflection job. Threads with nothing to do are cleared from
        the attention list; the others stay on it until a later sweep finds them done.
        """
        if self.work is None or not self.settings.enabled:
            return []
        now = self.clock.now()
        jobs: list[Job] = []
        for item in self.store.list_attention(quiet_since=now - quiet_for, limit=limit):
            if self.store.get_thread(item.resource_id, item.thread_id) is None:
                self.store.clear_attention(item)  # erased meanwhile
                continue
            key = self._key(item.resource_id, item.thread_id)
            record = self.store.get_record(key)
            cursor = record.cursor(item.thread_id) if record else 0
            newest = self.store.list_messages(item.resource_id, item.thread_id, limit=1, newest_first=True).messages
            pending = bool(newest) and (newest[0].seq or 0) > cursor and not _has_pending_tool_call(newest)
            observing = record is not None and _lease_active(record.observing, now)
            submitted = False
            if pending and not observing:
                jobs.append(Job('observe', item.resource_id, item.thread_id, key, 'stale'))
                submitted = True
            if record is not None and self._reflection_due(record):
                jobs.append(Job('reflect', item.resource_id, item.thread_id, key, 'threshold'))
                submitted = True
            if not submitted and not observing:
                self.store.clear_attention(item)
        return [job for job in jobs if self._submit(job)]

    # -- the reflection workflow (Step Functions: check → reflect → validate → commit; release on failure) --------
    def workflow_check(self, job: Job, owner: str) -> dict[str, Any]:
        """Is reflection due? If so take the `reflecting` lease for `owner` (the execution)."""
        record = self.store.get_record(job.record_key)
        if record is None or not self._job_due(job, record):
            return {'due': False}
        generation = record.generation
        attr = _workflow_lease(job)
        leased = self._take_lease(
            record,
            attr,
            owner,
            lambda cur: cur.generation == generation and self._job_due(job, cur.model_copy(update={attr: None})),
            # The workflow's reflect task may run for the worker's whole budget.
            deadline=self.clock.monotonic() + WORKER_BUDGET_S,
            # A buffered run takes over the running hint the step left under its cycle id.
            replaces=job.cycle_id if job.reason == 'buffer' else None,
        )
        if leased is None:
            return {'due': False}
        return {'due': True, 'generation': leased.generation, 'inputTokens': leased.observation_tokens}

    def workflow_reflect(self, job: Job, owner: str, *, deadline: float | None = None) -> dict[str, Any]:
        """Run the ladder on the log and stage the result as the record's buffered reflection.

        A model failure raises (the workflow retries with backoff, then releases). A log that cannot be shrunk
        releases the lease and remembers the stall, so the schedule does not restart it until the log changes.
        """
        record = self._held(job, owner)
        if record is None:
            return {'outcome': 'lease_lost'}
        attr = _workflow_lease(job)
        cycle = self._start_cycle()
        limit = deadline if deadline is not None else self.clock.monotonic() + WORKER_BUDGET_S
        snapshot, tokens = record.active_observations, record.observation_tokens
        line_count = len(snapshot.split('\n'))
        target, start_level, input_tokens = self.settings.observation_tokens, 0, tokens
        if job.reason == 'buffer':
            # A buffered reflection condenses the leading lines only, asking for a modest reduction (spec §12.5).
            part = buffering.reflection_slice(
                snapshot, tokens, self.settings.observation_tokens, self.settings.reflection_buffer_activation or 0.5
            )
            snapshot, line_count, input_tokens = part.text, part.line_count, part.input_tokens
            target, start_level = part.target_tokens, 1
        try:
            reflected, _ = self._run_ladder(
                snapshot, input_tokens, limit, target=target, start_level=start_level, skip_hints=start_level > 0
            )
        except refl.ReflectionNotSmallerError as exc:
            released = self._release_lease(record, attr, owner, reflection_stalled_at_tokens=tokens)
            if job.reason == 'buffer' and self._buffer is not None:
                failed = self._buffered_reflection_failed(job, released, cycle, input_tokens, str(exc))
                self._buffer.finish_background(released, attr, None, failed)
            return {'outcome': 'not_smaller', 'inputTokens': input_tokens}
        reflected_tokens = self.counter.count_observations(reflected)
        ended = None
        if job.reason == 'buffer':
            ended = om_parts.buffering_end(
                cycle_id=job.cycle_id or owner,
                operation='reflection',
                completed_at=self.clock.now(),
                duration_ms=self._elapsed_ms(cycle),
                tokens_buffered=input_tokens,
                buffered_tokens=reflected_tokens,
                observations=None,
                record_id=record.id,
                thread_id=job.thread_id,
            )

        def stage(current: OMRecord) -> OMRecord | None:
            held = getattr(current, attr)
            if held is None or held.owner != owner or current.generation != record.generation:
                return None
            update: dict[str, Any] = {
                'buffered_reflection': reflected,
                'buffered_reflection_tokens': reflected_tokens,
                'buffered_reflection_input_tokens': input_tokens,
                'reflected_line_count': line_count,
                'buffered_reflection_cycle_id': job.cycle_id,
            }
            if ended is not None:
                update['background_parts'] = buffering.keep_background_part(current.background_parts, ended)
            return current.model_copy(update=update)

        staged = self._commit(record, stage)
        if staged is None:
            return {'outcome': 'lease_lost'}
        return {'outcome': 'reflected', 'inputTokens': input_tokens, 'tokens': reflected_tokens}

    def workflow_validate(self, job: Job, owner: str) -> dict[str, Any]:
        """The staged reflection must exist, be non-empty and be strictly smaller than what it replaces."""
        record = self._held(job, owner)
        if record is None:
            raise ReflectionRejectedError('the reflecting lease was lost; another run owns this record now')
        staged = (record.buffered_reflection or '').strip()
        if not staged:
            raise ReflectionRejectedError('the staged reflection is empty; an empty reflection would erase memory')
        if (record.buffered_reflection_tokens or 0) >= (record.buffered_reflection_input_tokens or 0):
            raise ReflectionRejectedError(
                f'the staged reflection ({record.buffered_reflection_tokens} tokens) is not smaller than its input '
                f'({record.buffered_reflection_input_tokens} tokens)'
            )
        return {'valid': True, 'tokens': record.buffered_reflection_tokens}

    def workflow_commit(self, job: Job, owner: str) -> dict[str, Any]:
        """Make the staged reflection the new generation, keeping the lines appended since it was staged."""
        record = self._held(job, owner)
        if record is None:
            raise ReflectionRejectedError('the reflecting lease was lost before commit')
        if job.reason == 'buffer':
            # A buffered reflection stays staged: the step that finds observations past the threshold activates it.
            self._release_lease(record, 'buffering_reflection', owner)
            return {'outcome': 'staged', 'tokens': record.buffered_reflection_tokens}

        def compose(current: OMRecord) -> str:
            return refl.merge_buffered_reflection(
                current.buffered_reflection or '', current.active_observations, current.reflected_line_count or 0
            )

        committed = self._commit_generation(record, owner, compose)
        if committed is None:
            raise ReflectionRejectedError('the record changed generation or lease before commit')
        return {'outcome': 'committed', 'generation': committed.generation, 'tokens': committed.observation_tokens}

    def workflow_release(self, job: Job, owner: str) -> dict[str, Any]:
        """The failure path: drop the staged result and the lease; the old observations stay as they were."""
        record = self.store.get_record(job.record_key)
        if record is None:
            return {'released': False}
        attr = _workflow_lease(job)
        held = getattr(record, attr)
        failures = (record.reflection_failures or 0) + 1
        backoff = min(REFLECTION_RETRY_MAX, REFLECTION_RETRY_BASE * 2 ** min(failures - 1, 16))
        released = self._release_lease(
            record,
            attr,
            owner,
            buffered_reflection=None,
            buffered_reflection_tokens=None,
            buffered_reflection_input_tokens=None,
            reflected_line_count=None,
            buffered_reflection_cycle_id=None,
            reflection_failures=failures,
            reflection_retry_at=self.clock.now() + backoff,
        )
        if job.reason == 'buffer' and self._buffer is not None and held is not None and held.owner == owner:
            error = 'the background reflection failed; past reflection.blockAfter a step reflects synchronously'
            failed = self._buffered_reflection_failed(job, released, None, released.observation_tokens, error)
            self._buffer.finish_background(released, attr, None, failed)
        return {'released': True}

    def _buffered_reflection_failed(
        self, job: Job, record: OMRecord, cycle: _Cycle | None, tokens: int, error: str
    ) -> dict[str, Any]:
        return om_parts.buffering_failed(
            cycle_id=job.cycle_id or '',
            operation='reflection',
            failed_at=self.clock.now(),
            duration_ms=self._elapsed_ms(cycle) if cycle is not None else 0,
            tokens_attempted=tokens,
            error=error,
            record_id=record.id,
            thread_id=job.thread_id,
        )

    def _job_due(self, job: Job, record: OMRecord) -> bool:
        if job.reason == 'buffer':
            # The step that queued it marked the record (`buffering_reflection`); that mark is this job's own.
            return self._buffer is not None and self._buffer.reflection_wanted(
                record.model_copy(update={'buffering_reflection': None})
            )
        return self._reflection_due(record)

    def _run_buffered_reflection(self, job: Job, deadline: float) -> list[dict[str, Any]]:
        """The reflection workflow's steps in-process (a queue-only deployment; the local stack without SFN)."""
        owner = f'job-{self._new_id()}'
        if not self.workflow_check(job, owner).get('due'):
            return []
        try:
            if self.workflow_reflect(job, owner, deadline=deadline).get('outcome') != 'reflected':
                return []
            self.workflow_validate(job, owner)
            self.workflow_commit(job, owner)
        except Exception:
            self.workflow_release(job, owner)
            raise
        return []

    def _held(self, job: Job, owner: str) -> OMRecord | None:
        record = self.store.get_record(job.record_key)
        held = getattr(record, _workflow_lease(job)) if record is not None else None
        if record is None or held is None or held.owner != owner:
            return None
        return record

    def memory_view(self, resource_id: str, thread_id: str) -> dict[str, Any]:
        """What `GET /threads/{threadId}/memory` shows (CONTRACT §2). Raises ThreadNotFoundError."""
        thread = self.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        key = self._key(resource_id, thread_id)
        record = self.store.get_record(key)
        unobserved = (
            self._load_unobserved(record, resource_id, thread_id) if record else self._load_all(resource_id, thread_id)
        )
        pending = self.counter.count_messages(unobserved)
        return {
            'scope': self.settings.scope,
            'recordId': record.id if record else None,
            'generationCount': record.generation if record else 0,
            'observations': record.active_observations if record else '',
            'observationTokens': record.observation_tokens if record else 0,
            'pendingMessageTokens': pending,
            'thresholds': {
                'messageTokens': self._message_threshold(record) if record else self.settings.max_message_threshold(),
                'observationTokens': self.settings.observation_tokens,
            },
            'currentTask': thread.current_task,
            'suggestedResponse': thread.suggested_response,
            'lastObservedAt': iso(record.last_observed_at) if record and record.last_observed_at else None,
            'buffered': _without_projection(self._buffered_windows(record, thread_id, pending)),
        }

    # ------------------------------------------------------------------------------------------------------------
    # Records and messages
    # ------------------------------------------------------------------------------------------------------------
    def _key(self, resource_id: str, thread_id: str) -> str:
        return record_key(self.settings.scope, resource_id, thread_id)

    def _get_or_create_record(self, resource_id: str, thread_id: str) -> OMRecord:
        key = self._key(resource_id, thread_id)
        record = self.store.get_record(key)
        if record is not None:
            return record
        now = self.clock.now()
        fresh = OMRecord(
            id=self._new_id(),
            key=key,
            scope=self.settings.scope,
            resource_id=resource_id,
            thread_id=thread_id if self.settings.scope == 'thread' else None,
            created_at=now,
            updated_at=now,
        )
        try:
            return self.store.put_record(fresh, expected_version=None)
        except VersionConflictError:
            existing = self.store.get_record(key)
            if existing is None:  # pragma: no cover - created and erased in between
                raise
            return existing

    def _load_unobserved(self, record: OMRecord, resource_id: str, thread_id: str) -> list[Message]:
        """Messages after the thread's cursor, page by page; never the observed history."""
        return self._load_after(resource_id, thread_id, record.cursor(thread_id))

    def _load_all(self, resource_id: str, thread_id: str) -> list[Message]:
        return self._load_after(resource_id, thread_id, 0)

    def _load_after(self, resource_id: str, thread_id: str, after: int) -> list[Message]:
        out: list[Message] = []
        while True:
            page = self.store.list_messages(resource_id, thread_id, after_seq=after, limit=UNOBSERVED_PAGE)
            out.extend(page.messages)
            if not page.has_more or not page.messages:
                return out
            after = page.messages[-1].seq or after

    def _message_threshold(self, record: OMRecord) -> int:
        return self.settings.dynamic_message_threshold(record.observation_tokens)

    def _commit(self, record: OMRecord, change: Callable[[OMRecord], OMRecord | None]) -> OMRecord | None:
        """Apply `change` to the freshest head with a conditional write, re-reading after a lost race.

        `change` returns None when the work is no longer needed (or no longer ours); then nothing is written.
        """
        current: OMRecord | None = record
        for _ in range(MAX_COMMIT_ATTEMPTS):
            if current is None:
                return None
            updated = change(current)
            if updated is None:
                return None
            try:
                return self.store.put_record(
                    updated.model_copy(update={'updated_at': self.clock.now()}), expected_version=current.version
                )
            except VersionConflictError:
                current = self.store.get_record(record.key)
        raise VersionConflictError(record.key, current.version if current else None)

    def _take_lease(
        self,
        record: OMRecord,
        attr: str,
        owner: str,
        still_needed: Callable[[OMRecord], bool],
        *,
        deadline: float | None = None,
        replaces: str | None = None,
    ) -> OMRecord | None:
        now = self.clock.now()
        # A lease outlives the work it guards (its deadline) by a margin, so nobody takes over a live holder.
        remaining = max(0.0, deadline - self.clock.monotonic()) if deadline is not None else 0.0
        lease = Lease(owner=owner, expires_at=now + max(LEASE_TTL, timedelta(seconds=remaining) + LEASE_MARGIN))

        def take(current: OMRecord) -> OMRecord | None:
            held: Lease | None = getattr(current, attr)
            if held is not None and held.active(now) and held.owner not in (owner, replaces):
                return None  # someone else is on it
            if not still_needed(current):
                return None
            return current.model_copy(update={attr: lease})

        return self._commit(record, take)

    def _release_lease_quietly(self, record: OMRecord, attr: str, owner: str) -> None:
        try:
            self._release_lease(record, attr, owner)
        except Exception:  # noqa: BLE001 - the lease expires on its own; the original error is what matters
            logger.exception('could not release a lease', extra={'key': record.key, 'lease': attr})

    def _release_lease(self, record: OMRecord, attr: str, owner: str, **extra: Any) -> OMRecord:
        def release(current: OMRecord) -> OMRecord | None:
            held: Lease | None = getattr(current, attr)
            if held is None or held.owner != owner:
                return None
            return current.model_copy(update={attr: None, **extra})

        try:
            return self._commit(record, release) or (self.store.get_record(record.key) or record)
        except VersionConflictError:  # pragma: no cover - the lease expires on its own
            return self.store.get_record(record.key) or record

    # ------------------------------------------------------------------------------------------------------------
    # Observation
    # ------------------------------------------------------------------------------------------------------------
    def _observe(
        self,
        record: OMRecord,
        thread: Thread,
        messages: list[Message],
        deadline: float,
        parts: list[dict[str, Any]],
        *,
        can_defer: bool = True,
    ) -> tuple[OMRecord, Thread]:
        """One synchronous observation cycle over `messages` (all unobserved messages of one thread).

        With background work available (`can_defer`), an observation that would overrun the request's time budget is
        handed to the worker: the step answers at once with the raw messages and a failed part whose reason is
        `deferred`. API Gateway stops integrations at about 29 s, and a real Observer call can take longer.
        """
        thread_id = thread.id
        last_seq = messages[-1].seq or 0
        first_seq = messages[0].seq or 0
        cycle = self._start_cycle()
        tokens = self.counter.count_messages(messages)
        defer_to = self.work if can_defer else None
        if defer_to is not None and deadline - self.clock.monotonic() < MIN_SYNC_OBSERVATION_S:
            return self._defer_observation(record, thread, cycle, tokens, parts, 'no time left in this request'), thread
        leased = self._take_lease(
            record, 'observing', cycle.cycle_id, lambda cur: cur.cursor(thread_id) < last_seq, deadline=deadline
        )
        if leased is None:
            # Another request is observing (or already did): keep going with the raw messages.
            return self.store.get_record(record.key) or record, thread
        if leased.cursor(thread_id) >= first_seq:
            # Re-check after winning: a holder that finished meanwhile observed the start of this batch already.
            messages = [m for m in messages if (m.seq or 0) > leased.cursor(thread_id)]
            first_seq = messages[0].seq or 0
            tokens = self.counter.count_messages(messages)
        parts.append(
            om_parts.observation_start(
                cycle_id=cycle.cycle_id,
                operation='observation',
                started_at=cycle.started_at,
                tokens_to_observe=tokens,
                record_id=leased.id,
                thread_id=thread_id,
                thread_ids=[thread_id],
                config=self._marker_config(),
            )
        )
        try:
            parsed = self._call_observer(leased, thread, messages, tokens, deadline)
        except DeadlineExceededError as exc:
            released = self._release_lease(leased, 'observing', cycle.cycle_id)
            if defer_to is None:
                parts.append(self._failed_part(cycle, 'observation', tokens, exc, leased.id, thread_id))
                return released, thread
            return self._defer_observation(released, thread, cycle, tokens, parts, str(exc)), thread
        except ModelError as exc:
            logger.warning('observation failed', extra={'thread_id': thread_id, 'error': str(exc)})
            parts.append(self._failed_part(cycle, 'observation', tokens, exc, leased.id, thread_id))
            return self._release_lease(leased, 'observing', cycle.cycle_id), thread
        except Exception:
            # Anything else (e.g. reading an attachment back failed): free the record for others, then report.
            self._release_lease_quietly(leased, 'observing', cycle.cycle_id)
            raise

        observed_at = max(m.created_at for m in messages)
        new_text_block = parsed.observations.strip()
        if self.settings.retrieval is not None:
            new_text_block = ctx.wrap_in_observation_group(new_text_block, messages[0].id, messages[-1].id)
        group = ObservationGroup(
            id=self._new_id()[:16],
            thread_id=thread_id,
            start_id=messages[0].id,
            end_id=messages[-1].id,
            start_seq=first_seq,
            end_seq=last_seq,
            created_at=self.clock.now(),
        )

        def apply(current: OMRecord) -> OMRecord | None:
            held = current.observing
            if held is None or held.owner != cycle.cycle_id or current.cursor(thread_id) >= last_seq:
                return None  # the lease was taken over: a stale holder never writes
            existing = current.active_observations
            text = existing + ctx.message_boundary(observed_at) + new_text_block if existing.strip() else new_text_block
            last_observed = max(current.last_observed_at, observed_at) if current.last_observed_at else observed_at
            return current.model_copy(
                update={
                    'active_observations': text,
                    'observation_tokens': self.counter.count_observations(text),
                    'total_tokens_observed': current.total_tokens_observed + tokens,
                    'cursors': {**current.cursors, thread_id: last_seq},
                    'last_observed_at': last_observed,
                    'groups': (*current.groups, group),
                    'observing': None,
                    'pending_message_tokens': 0,
                    # Chunks of messages this observation covered are superseded by it.
                    'buffered_chunks': buffering.live_chunks(current.buffered_chunks, last_seq),
                    'last_buffered_at_tokens': 0,
                }
            )

        try:
            committed = self._commit(leased, apply)
        except VersionConflictError as exc:
            parts.append(self._failed_part(cycle, 'observation', tokens, exc, leased.id, thread_id, reason='conflict'))
            return self.store.get_record(record.key) or leased, thread
        if committed is None:
            err = VersionConflictError(record.key, leased.version)
            parts.append(self._failed_part(cycle, 'observation', tokens, err, leased.id, thread_id, reason='conflict'))
            return self.store.get_record(record.key) or leased, thread

        thread = self._update_thread_hints(thread, parsed, cycle, parts)
        parts.append(
            om_parts.observation_end(
                cycle_id=cycle.cycle_id,
                operation='observation',
                completed_at=self.clock.now(),
                duration_ms=self._elapsed_ms(cycle),
                tokens_observed=tokens,
                observation_tokens=self.counter.count_observations(parsed.observations),
                observations=parsed.observations,
                current_task=parsed.current_task,
                suggested_response=parsed.suggested_response,
                record_id=committed.id,
                thread_id=thread_id,
            )
        )
        return committed, thread

    def _defer_observation(
        self,
        record: OMRecord,
        thread: Thread,
        cycle: _Cycle,
        tokens: int,
        parts: list[dict[str, Any]],
        why: str,
    ) -> OMRecord:
        if self._submit(Job('observe', record.resource_id, thread.id, record.key, 'deferred')):
            error, reason = f'observation deferred to the background worker ({why})', 'deferred'
        else:
            # Not queued either: the messages stay unobserved and a later step or the sweeper picks them up.
            error, reason = f'observation postponed: {why}; the work queue is unavailable', 'error'
        parts.append(self._failed_part(cycle, 'observation', tokens, error, record.id, thread.id, reason=reason))
        return record

    def _call_observer(
        self, record: OMRecord, thread: Thread, messages: list[Message], tokens: int, deadline: float
    ) -> obs.ParsedObservations:
        s = self.settings
        context_text, truncated = obs.prepare_observer_context(
            record.active_observations,
            s.previous_observer_tokens,
            self.counter.count_string,
            buffered_reflection=record.buffered_reflection,
            reflected_line_count=record.reflected_line_count,
        )
        transcript = obs.format_messages_for_observer(
            messages, timezone=record.observed_timezone, count=self.counter.count_string
        )
        prompt = obs.build_observer_request(
            transcript=transcript,
            previous_observations=context_text,
            was_truncated=truncated,
            prior_current_task=thread.current_task,
            prior_suggested_response=thread.suggested_response,
            prior_thread_title=thread.title,
            thread_title=s.thread_title,
        )
        request = ModelRequest(
            purpose='observer',
            system=obs.build_observer_system_prompt(instruction=s.observation_instruction, thread_title=s.thread_title),
            contents=(Content('user', (prompt, *self._inline_attachments(transcript, record.resource_id))),),
            temperature=s.observer_temperature,
            max_output_tokens=s.observer_max_output_tokens,
            thinking_budget=s.observer_thinking_budget,
            source_messages=tuple(messages),
            source_observations=context_text,
        )
        # A degenerate or unusable answer gets one fresh sample, then counts as a failed call (spec §13.6).
        for attempt in range(2):
            response = self.router.generate(s.observer_model, request, input_tokens=tokens, deadline=deadline)
            parsed = obs.parse_observer_output(response.text)
            if not obs.is_unusable_observer_output(parsed):
                return parsed
            logger.warning('observer output unusable', extra={'attempt': attempt + 1, 'degenerate': parsed.degenerate})
        raise ModelOutputError('Observer produced degenerate output after retry')

    def _inline_attachments(self, transcript: obs.ObserverTranscript, resource_id: str) -> list[InlineBlob]:
        """Image bytes the Observer can see: inline data, or stored `s3://` images read back, within a size cap."""
        import base64
        import binascii

        blobs: list[InlineBlob] = []
        budget = MAX_INLINE_ATTACHMENT_BYTES
        for ref in transcript.attachments:
            if ref.kind != 'image':
                continue
            data: bytes | None = None
            if ref.data:
                try:
                    data = base64.b64decode(ref.data, validate=False)
                except (binascii.Error, ValueError):
                    data = None
            elif ref.url and ref.url.startswith('s3://') and self.blobs is not None:
                data = self.blobs.read(ref.url, max_bytes=budget, resource_id=resource_id)
            if data is None or len(data) > budget:
                continue  # the placeholder alone tells the Observer an image was there
            budget -= len(data)
            blobs.append(InlineBlob(mime_type=ref.media_type or 'image/png', data=data))
        return blobs

    def _update_thread_hints(
        self, thread: Thread, parsed: obs.ParsedObservations, cycle: _Cycle, parts: list[dict[str, Any]]
    ) -> Thread:
        # Hints are replaced by the latest output, including "nothing": stale hints must disappear (spec §2.4).
        update: dict[str, Any] = {
            'current_task': parsed.current_task,
            'suggested_response': parsed.suggested_response,
            'updated_at': self.clock.now(),
        }
        title = (parsed.thread_title or '').strip()
        renamed = self.settings.thread_title and len(title) >= 3 and title != (thread.title or '')
        if renamed:
            update['title'] = title
        try:
            updated = self.store.update_thread(thread.model_copy(update=update))
        except Exception:  # noqa: BLE001 - hints are advisory; the observation is already committed
            logger.exception('could not update thread hints', extra={'thread_id': thread.id})
            return thread
        if renamed:
            parts.append(
                om_parts.thread_update(
                    cycle_id=cycle.cycle_id,
                    thread_id=thread.id,
                    old_title=thread.title,
                    new_title=title,
                    at=self.clock.now(),
                )
            )
        return updated

    # ------------------------------------------------------------------------------------------------------------
    # Reflection
    # ------------------------------------------------------------------------------------------------------------
    def _submit(self, job: Job) -> bool:
        """Hand a job to the background; best effort (the sweeper finds what a lost job left behind)."""
        if self.work is None:
            return False
        try:
            self.work.submit(job)
        except Exception:  # noqa: BLE001 - a queue outage must not fail a request whose input is saved
            logger.exception('could not submit background work', extra={'kind': job.kind, 'key': job.record_key})
            return False
        return True

    def _reflection_due(self, record: OMRecord) -> bool:
        return (
            record.observation_tokens > self.settings.observation_tokens
            and bool(record.active_observations.strip())
            and record.reflection_stalled_at_tokens != record.observation_tokens
            and not _lease_active(record.reflecting, self.clock.now())
            and not record.reflection_backing_off(self.clock.now())
            # A staged (buffered) reflection is activated by the next step, with no model call.
            and not (self.buffering_reflection and record.buffered_reflection)
        )

    def _reflect_or_hand_off(
        self, record: OMRecord, thread_id: str, deadline: float, parts: list[dict[str, Any]]
    ) -> OMRecord:
        """Reflect inline, or (with background work) start the reflection workflow and carry on."""
        if self._buffer is not None and self.buffering_reflection:
            return self._buffer.reflection_step(record, thread_id, deadline, parts)
        if self.work is None:
            return self._maybe_reflect(record, thread_id, deadline, parts)
        if self._reflection_due(record):
            self._submit(Job('reflect', record.resource_id, thread_id, record.key, 'threshold'))
        return record

    def _maybe_reflect(
        self, record: OMRecord, thread_id: str, deadline: float, parts: list[dict[str, Any]]
    ) -> OMRecord:
        threshold = self.settings.observation_tokens
        if record.observation_tokens <= threshold or not record.active_observations.strip():
            return record
        if record.reflection_stalled_at_tokens == record.observation_tokens:
            # The last attempt could not shrink this very log: wait until it has grown (spec §12.9).
            return record
        cycle = self._start_cycle()
        leased = self._take_lease(
            record,
            'reflecting',
            cycle.cycle_id,
            lambda cur: cur.generation == record.generation and cur.observation_tokens > threshold,
            deadline=deadline,
        )
        if leased is None:
            return self.store.get_record(record.key) or record
        snapshot_text = leased.active_observations
        snapshot_tokens = leased.observation_tokens
        parts.append(
            om_parts.observation_start(
                cycle_id=cycle.cycle_id,
                operation='reflection',
                started_at=cycle.started_at,
                tokens_to_observe=snapshot_tokens,
                record_id=leased.id,
                thread_id=thread_id,
                thread_ids=[thread_id],
                config=self._marker_config(),
            )
        )

        def on_retry(info: refl.RetryInfo) -> None:
            parts.append(
                self._failed_part(
                    cycle,
                    'reflection',
                    snapshot_tokens,
                    info.error,
                    leased.id,
                    thread_id,
                    reason='not_under_target',
                    retrying=True,
                )
            )

        try:
            reflected, suggestion = self._run_ladder(snapshot_text, snapshot_tokens, deadline, on_retry)
        except refl.ReflectionNotSmallerError as exc:
            parts.append(
                self._failed_part(cycle, 'reflection', snapshot_tokens, exc, leased.id, thread_id, reason='not_smaller')
            )
            return self._release_lease(
                leased, 'reflecting', cycle.cycle_id, reflection_stalled_at_tokens=snapshot_tokens
            )
        except ModelError as exc:
            parts.append(self._failed_part(cycle, 'reflection', snapshot_tokens, exc, leased.id, thread_id))
            return self._release_lease(leased, 'reflecting', cycle.cycle_id)

        def compose(current: OMRecord) -> str:
            # Keep every line appended to the old head since the snapshot (an observation may commit meanwhile).
            appended = ''
            if current.active_observations != snapshot_text and current.active_observations.startswith(snapshot_text):
                appended = current.active_observations[len(snapshot_text) :].strip()
            return reflected + ('\n\n' + appended if appended else '')

        committed = self._commit_generation(leased, cycle.cycle_id, compose)
        if committed is None:
            err = VersionConflictError(record.key, leased.version)
            parts.append(
                self._failed_part(cycle, 'reflection', snapshot_tokens, err, leased.id, thread_id, reason='conflict')
            )
            return self.store.get_record(record.key) or leased
        parts.append(
            om_parts.observation_end(
                cycle_id=cycle.cycle_id,
                operation='reflection',
                completed_at=self.clock.now(),
                duration_ms=self._elapsed_ms(cycle),
                tokens_observed=snapshot_tokens,
                observation_tokens=committed.observation_tokens,
                observations=committed.active_observations,
                current_task=None,
                suggested_response=suggestion,
                record_id=committed.id,
                thread_id=thread_id,
            )
        )
        return committed

    def _run_ladder(
        self,
        snapshot_text: str,
        snapshot_tokens: int,
        deadline: float,
        on_retry: Callable[[refl.RetryInfo], None] | None = None,
        *,
        target: int | None = None,
        start_level: int = 0,
        skip_hints: bool = False,
    ) -> tuple[str, str | None]:
        """Run the compression ladder on a snapshot of the log; returns (reflection, suggested response).

        Raises ReflectionNotSmallerError when no attempt shrank the log, and ModelError when the model failed.
        """
        system = refl.build_reflector_system_prompt(
            obs.OBSERVER_EXTRACTION_INSTRUCTIONS
            + '\n\n'
            + obs.OBSERVER_OUTPUT_FORMAT
            + '\n\n'
            + obs.OBSERVER_GUIDELINES,
            instruction=self.settings.reflection_instruction,
        )
        retrieval = self.settings.retrieval is not None
        reflection_text = (
            ctx.render_observation_groups_for_reflection(snapshot_text) or snapshot_text if retrieval else snapshot_text
        )

        def call(user_prompt: str, level: int) -> str:
            request = ModelRequest(
                purpose='reflector',
                system=system,
                contents=(Content('user', (user_prompt,)),),
                temperature=self.settings.reflector_temperature,
                max_output_tokens=self.settings.reflector_max_output_tokens,
                thinking_budget=self.settings.reflector_thinking_budget,
                source_observations=reflection_text,
            )
            return self.router.generate(
                self.settings.reflector_model, request, input_tokens=snapshot_tokens, deadline=deadline
            ).text

        ladder = refl.run_compression_ladder(
            reflection_text,
            call=call,
            count=self.counter.count_observations,
            target=target if target is not None else self.settings.observation_tokens,
            start_level=start_level,
            skip_continuation_hints=skip_hints,
            on_retry=on_retry,
            parse=lambda text: refl.parse_reflector_output(
                text, sanitize=obs.sanitize_observation_lines, is_degenerate=obs.detect_degenerate_repetition
            ),
        )
        reflected = ladder.observations.strip()
        if retrieval:
            reflected = ctx.reconcile_observation_groups_from_reflection(reflected, snapshot_text) or reflected
        return reflected, ladder.suggested_response

    def _commit_generation(self, leased: OMRecord, owner: str, compose: Callable[[OMRecord], str]) -> OMRecord | None:
        """Make `compose(current head)` the new head generation, while the reflecting lease is still `owner`'s."""
        current: OMRecord | None = leased
        threshold = self.settings.observation_tokens
        for _ in range(MAX_COMMIT_ATTEMPTS):
            if current is None or current.reflecting is None or current.reflecting.owner != owner:
                return None
            if current.generation != leased.generation:
                return None
            text = compose(current)
            tokens = self.counter.count_observations(text)
            now = self.clock.now()
            new = current.model_copy(
                update={
                    'id': self._new_id(),
                    'generation': current.generation + 1,
                    'origin': 'reflection',
                    'created_at': now,
                    'updated_at': now,
                    'active_observations': text,
                    'observation_tokens': tokens,
                    'groups': _reflection_groups(current, self._new_id()[:16], now),
                    'reflecting': None,
                    'buffering_reflection': None,
                    'buffered_reflection': None,
                    'buffered_reflection_tokens': None,
                    'buffered_reflection_input_tokens': None,
                    'reflected_line_count': None,
                    'buffered_reflection_cycle_id': None,
                    'reflection_failures': None,
                    'reflection_retry_at': None,
                    'last_buffered_at_tokens': 0,
                    # Still over the threshold after a committed reflection: back off until the log grows.
                    'reflection_stalled_at_tokens': tokens if tokens > threshold else None,
                }
            )
            try:
                return self.store.put_generation(new, expected_version=current.version)
            except VersionConflictError:
                current = self.store.get_record(leased.key)
        return None

    # ------------------------------------------------------------------------------------------------------------
    # Context for the Actor
    # ------------------------------------------------------------------------------------------------------------
    def _system_text(self, record: OMRecord, thread: Thread) -> str:
        if not record.active_observations.strip():
            return ''
        retrieval = self.settings.retrieval
        messages = ctx.build_observation_system_messages(
            record.active_observations,
            now=self.clock.now(),
            current_task=thread.current_task,
            suggested_response=thread.suggested_response,
            retrieval=retrieval is not None,
            retrieval_scope=retrieval.scope if retrieval is not None else 'thread',
        )
        return ctx.join_system_messages(messages)

    def _continuation_message(self) -> Message:
        return Message(
            id=ctx.CONTINUATION_REMINDER_ID,
            role='user',
            created_at=datetime(1970, 1, 1, tzinfo=self.clock.now().tzinfo),
            parts=(TextPart(text=ctx.continuation_reminder_text()),),
        )

    def _status_part(
        self, record: OMRecord, messages: list[Message], thread_id: str, step_number: int
    ) -> dict[str, Any]:
        total = self.counter.count_messages(messages)
        windows = self._buffered_windows(record, thread_id, total)
        return om_parts.status(
            message_tokens=total,
            message_threshold=self._message_threshold(record),
            observation_tokens=record.observation_tokens,
            observation_threshold=self._observation_threshold_for_status(record),
            buffered_chunks=windows['observations']['chunks'],
            buffered_message_tokens=windows['observations']['messageTokens'],
            projected_message_removal=windows['observations']['projectedMessageRemoval'],
            buffered_observation_tokens=windows['observations']['observationTokens'],
            buffered_observation_status=windows['observations']['status'],
            reflection_input_tokens=windows['reflection']['inputObservationTokens'],
            reflection_output_tokens=windows['reflection']['observationTokens'],
            reflection_status=windows['reflection']['status'],
            record_id=record.id,
            thread_id=thread_id,
            step_number=step_number,
            generation_count=record.generation,
        )

    def _buffered_windows(self, record: OMRecord | None, thread_id: str, pending: int) -> dict[str, Any]:
        """The `buffered` windows of `data-om-status` and the memory view (seed 000, spec §7.10)."""
        now = self.clock.now()
        chunks = buffering.live_chunks(record.buffered_chunks, record.cursor(thread_id)) if record else ()
        message_tokens = sum(c.message_tokens for c in chunks)
        threshold = self.settings.max_message_threshold()
        running_obs = record is not None and _lease_active(record.buffering_observation, now)
        staged = bool(record and record.buffered_reflection)
        running_refl = record is not None and (
            _lease_active(record.buffering_reflection, now) or (_lease_active(record.reflecting, now) and not staged)
        )
        return {
            'observations': {
                'chunks': len(chunks),
                'messageTokens': min(message_tokens, pending),
                'projectedMessageRemoval': buffering.projected_removal(
                    chunks, self.settings.buffer_activation, threshold, pending
                ),
                'observationTokens': sum(c.token_count for c in chunks),
                'status': 'running' if running_obs else ('complete' if chunks else 'idle'),
            },
            'reflection': {
                'inputObservationTokens': (record.buffered_reflection_input_tokens or 0) if record else 0,
                'observationTokens': (record.buffered_reflection_tokens or 0) if record else 0,
                'status': 'running' if running_refl else ('complete' if staged else 'idle'),
            },
        }

    def _observation_threshold_for_status(self, record: OMRecord) -> int:
        s = self.settings
        if s.share_token_budget:
            # Under a shared budget the observations get what the messages do not use (spec §5, UI helper).
            return max(s.max_message_threshold() - self._message_threshold(record), 1000)
        return s.observation_tokens

    # ------------------------------------------------------------------------------------------------------------
    # Small helpers
    # ------------------------------------------------------------------------------------------------------------
    def _start_cycle(self) -> _Cycle:
        return _Cycle(cycle_id=self._new_id(), started_at=self.clock.now(), started_mono=self.clock.monotonic())

    def _elapsed_ms(self, cycle: _Cycle) -> int:
        return max(0, int((self.clock.monotonic() - cycle.started_mono) * 1000))

    def _marker_config(self) -> om_parts.MarkerConfig:
        return om_parts.MarkerConfig(
            message_tokens=self.settings.max_message_threshold(),
            observation_tokens=self.settings.observation_tokens,
            scope=self.settings.scope,
        )

    def _failed_part(
        self,
        cycle: _Cycle,
        operation: om_parts.OperationType,
        tokens: int,
        exc: Exception | str,
        record_id: str,
        thread_id: str,
        *,
        reason: str | None = None,
        retrying: bool = False,
    ) -> dict[str, Any]:
        if reason is None:
            reason = 'timeout' if isinstance(exc, DeadlineExceededError) else 'error'
        return om_parts.observation_failed(
            cycle_id=cycle.cycle_id,
            operation=operation,
            failed_at=self.clock.now(),
            duration_ms=self._elapsed_ms(cycle),
            tokens_attempted=tokens,
            error=exc if isinstance(exc, str) else (str(exc) or type(exc).__name__),
            record_id=record_id,
            thread_id=thread_id,
            reason=reason,
            retrying=retrying,
        )


def _check_ids(resource_id: str, thread_id: str) -> None:
    check_id('resourceId', resource_id)
    check_id('threadId', thread_id)


def _drop_engine_text(messages: Sequence[Message]) -> list[Message]:
    """Text the engine inserts (the continuation reminder) is never saved as if someone had said it."""
    reminder = ctx.continuation_reminder_text()
    return [m for m in messages if m.id != ctx.CONTINUATION_REMINDER_ID and m.text() != reminder]


def _has_pending_tool_call(messages: Sequence[Message]) -> bool:
    """A tool call in the newest message with no result yet defers observation until the result arrives."""
    if not messages:
        return False
    results = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolResultPart)}
    return any(isinstance(p, ToolCallPart) and p.tool_call_id not in results for p in messages[-1].parts)


def _reflection_groups(record: OMRecord, group_id: str, now: datetime) -> tuple[ObservationGroup, ...]:
    """After a reflection, one group per thread spans everything its earlier groups covered."""
    by_thread: dict[str, list[ObservationGroup]] = {}
    for group in record.groups:
        by_thread.setdefault(group.thread_id, []).append(group)
    merged: list[ObservationGroup] = []
    for thread_id, groups in by_thread.items():
        first = min(groups, key=lambda g: g.start_seq)
        last = max(groups, key=lambda g: g.end_seq)
        merged.append(
            ObservationGroup(
                id=f'{group_id}-{len(merged)}' if len(by_thread) > 1 else group_id,
                thread_id=thread_id,
                start_id=first.start_id,
                end_id=last.end_id,
                start_seq=first.start_seq,
                end_seq=last.end_seq,
                created_at=now,
                kind='reflection',
            )
        )
    return tuple(merged)


def _lease_active(lease: Lease | None, now: datetime) -> bool:
    return lease is not None and lease.active(now)


def _without_projection(windows: dict[str, Any]) -> dict[str, Any]:
    """The memory view's `buffered` (CONTRACT §2) is the status windows without the projection."""
    observations = {k: v for k, v in windows['observations'].items() if k != 'projectedMessageRemoval'}
    return {**windows, 'observations': observations}


def _workflow_lease(job: Job) -> str:
    """The lease a reflection workflow run holds: a buffered run must not block the synchronous last resort
    (`reflection.blockAfter`), which takes `reflecting`; a threshold run is the reflection itself."""
    return 'buffering_reflection' if job.reason == 'buffer' else 'reflecting'
