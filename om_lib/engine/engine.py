"""`MemoryEngine`: observational memory for one configuration, composed from its rooms.

    MemoryEngine ─► Steps (step, turn) ─┐
                 └► Jobs (worker, sweep)├─► ObservationPipeline (observe these messages) ─► RecordWriter ─► store
                    Reflection ─────────┘   Reflection (condense the log)                  ─┘
                    ObservationBuffering (async buffering), ResourceView (resource scope reads)

The engine builds them over one `Runtime` (settings and ports) and exposes the operations the service and the
workers call. Each room calls down, never back up. Concurrency: every record write is conditional on its version
(optimistic locking), and observation and reflection first take a lease on the record (an owner with an expiry), so
concurrent steps do not pay for the same model call twice and a crashed holder never blocks the record for long.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal

from om_lib.config import OMConfig, ResolvedOMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine import actor_context as actor
from om_lib.engine.jobs import QUIET_AFTER, Jobs
from om_lib.engine.step import StepResult, Steps, TurnResult
from om_lib.errors import ThreadNotFoundError
from om_lib.messages import Message, iso
from om_lib.models.model_router import ModelRouter
from om_lib.observation.buffered import ObservationBuffering
from om_lib.observation.observation import ObservationPipeline, ResourceStrategy, ThreadStrategy
from om_lib.observation.resource_scope import reveal_thread_ids
from om_lib.observation.resource_view import ResourceView
from om_lib.parts import CycleParts
from om_lib.ports import BlobReader, Clock, MemoryStore
from om_lib.records import OMRecord, Thread, record_key
from om_lib.reflection.reflection import Reflection, ReflectionRejectedError
from om_lib.runtime.record_writer import DEFAULT_LEASE_TTL_S, RecordWriter
from om_lib.runtime.runtime import Runtime
from om_lib.work import BackgroundWork, Job

__all__ = ['MemoryEngine', 'OmStatus', 'ReflectionRejectedError', 'StepResult', 'TurnResult']

# How many kept failures `GET /memory` shows (`recentFailures`).
RECENT_FAILURES = 20
OmStatus = Literal['observed', 'buffered', 'unobserved']


class MemoryEngine:
    """Observational memory for one configuration, over injected store, model router, counter and clock.

    With `work` (somewhere to send background work) the engine buffers observations in the background (thread scope,
    `bufferTokens` on), hands observations that would overrun a request's budget to the worker, and runs reflection in
    the workflow when reflection is buffered. Without it (a library user, unit tests) everything runs in the request,
    as with `bufferTokens: false`.
    """

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
        sleep: Callable[[float], None] | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        sweep_interval_s: float | None = None,
    ) -> None:
        self.config = config
        # How often the scheduled sweeper runs (None: no sweeper, or not known here); only said in `memory_view`.
        self.sweep_interval_s = sweep_interval_s
        self.settings: ResolvedOMConfig = config.resolved()
        new_id = id_factory or (lambda: uuid.uuid4().hex)
        self.rt = Runtime(
            settings=self.settings,
            store=store,
            router=router,
            counter=counter,
            clock=clock,
            writer=RecordWriter(store, clock, new_id, lease_ttl_s=lease_ttl_s),
            new_id=new_id,
            blobs=blobs,
            work=work,
            time_budget_s=time_budget_s,
            sleep=sleep or time.sleep,
        )
        s = self.settings
        resource_scope = s.scope == 'resource'
        strategy = ResourceStrategy(self.rt) if resource_scope else ThreadStrategy(self.rt)
        self.pipeline = ObservationPipeline(self.rt, strategy)
        # Async buffering needs somewhere to run the background Observer/Reflector; resource scope has none (as in the
        # reference). Without it the engine observes and reflects at the thresholds, as with `bufferTokens: false`.
        thread_buffering = s.enabled and not resource_scope and work is not None
        self.buffering = (
            ObservationBuffering(self.rt, self.pipeline) if thread_buffering and s.async_observation_enabled else None
        )
        self.reflection = Reflection(self.rt, buffered=bool(thread_buffering and s.async_reflection_enabled))
        self.resource = ResourceView(self.rt, strategy) if isinstance(strategy, ResourceStrategy) else None
        self.steps = Steps(self.rt, self.pipeline, self.reflection, buffering=self.buffering, resource=self.resource)
        self.jobs = Jobs(self.rt, self.pipeline, self.reflection, buffering=self.buffering, resource=self.resource)

    # -- ports, for the service ------------------------------------------------------------------------------------
    @property
    def store(self) -> MemoryStore:
        """The store."""
        return self.rt.store

    @property
    def router(self) -> ModelRouter:
        """The model router."""
        return self.rt.router

    @property
    def counter(self) -> TokenCounter:
        """The token counter."""
        return self.rt.counter

    @property
    def clock(self) -> Clock:
        """The clock."""
        return self.rt.clock

    @property
    def blobs(self) -> BlobReader | None:
        """Reads stored attachments back."""
        return self.rt.blobs

    @property
    def work(self) -> BackgroundWork | None:
        """Where background work goes (None: everything runs in the request)."""
        return self.rt.work

    @work.setter
    def work(self, work: BackgroundWork | None) -> None:
        # Only where jobs go: buffering and workflow reflection are chosen when the engine is built.
        self.rt.work = work

    @property
    def time_budget_s(self) -> float:
        """A request's time budget."""
        return self.rt.time_budget_s

    # -- the step and the turn -------------------------------------------------------------------------------------
    def prepare_step(
        self,
        resource_id: str,
        thread_id: str,
        new_messages: Sequence[Message],
        *,
        step_number: int = 0,
        parts: CycleParts | None = None,
        actor_model: str | None = None,
    ) -> StepResult:
        """Save the step's new input, update memory when due, and return the Actor's context (om_lib/engine/step.py)."""
        return self.steps.prepare(
            resource_id, thread_id, new_messages, step_number=step_number, parts=parts, actor_model=actor_model
        )

    def complete_turn(
        self, resource_id: str, thread_id: str, outputs: Sequence[Message], *, parts: CycleParts | None = None
    ) -> TurnResult:
        """Save the turn's outputs; queue background work that is due (om_lib/engine/step.py)."""
        return self.steps.complete_turn(resource_id, thread_id, outputs, parts=parts)

    # -- background --------------------------------------------------------------------------------------------------
    def observe_now(
        self,
        resource_id: str,
        thread_id: str,
        *,
        deadline: float | None = None,
        reflect: bool = True,
        wait: bool = False,
    ) -> tuple[OMRecord, CycleParts]:
        """Observe every unobserved message now, below the threshold too (om_lib/engine/jobs.py)."""
        return self.jobs.observe_now(resource_id, thread_id, deadline=deadline, reflect=reflect, wait=wait)

    def observe_imported(
        self, resource_id: str, thread_id: str, messages: Sequence[Message]
    ) -> tuple[OMRecord, CycleParts]:
        """Observe messages imported from elsewhere without storing them (om_lib/engine/jobs.py)."""
        return self.jobs.observe_imported(resource_id, thread_id, messages)

    def reflect_asked(self, resource_id: str, thread_id: str) -> tuple[OMRecord | None, CycleParts]:
        """Reflect now, below the threshold too (om_lib/engine/jobs.py)."""
        return self.jobs.reflect_asked(resource_id, thread_id)

    def buffer_asked(self, resource_id: str, thread_id: str) -> tuple[OMRecord, CycleParts]:
        """Buffer the unbuffered messages now (om_lib/engine/jobs.py)."""
        return self.jobs.buffer_asked(resource_id, thread_id)

    def run_job(self, job: Job, *, deadline: float | None = None) -> CycleParts:
        """Do one background job (the worker's entry point; om_lib/engine/jobs.py)."""
        return self.jobs.run(job, deadline=deadline)

    def sweep(self, *, quiet_for: timedelta = QUIET_AFTER, limit: int = 100) -> list[Job]:
        """The scheduled sweeper (om_lib/engine/jobs.py)."""
        return self.jobs.sweep(quiet_for=quiet_for, limit=limit)

    # -- the reflection workflow's tasks (om_lib/reflection/reflection.py); the client hears of a run on its next step
    def workflow_check(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """Is reflection due? If so take the run's lease for `owner`. Each task reports the parts it made in `parts`."""
        return self.reflection.check(job, owner, parts)

    def workflow_reflect(
        self, job: Job, owner: str, parts: CycleParts | None = None, *, deadline: float | None = None
    ) -> dict[str, Any]:
        """Draft the reflection and stage it on the record."""
        return self.reflection.stage(job, owner, deadline=deadline, parts=parts)

    def workflow_validate(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """Refuse a staged reflection that is empty or not smaller."""
        return self.reflection.validate(job, owner)

    def workflow_commit(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """Make the staged reflection the new generation."""
        return self.reflection.commit_staged(job, owner, parts)

    def workflow_release(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """The failure path: drop what was staged and the lease."""
        return self.reflection.release(job, owner, parts)

    # -- reading -------------------------------------------------------------------------------------------------------
    def memory_view(self, resource_id: str, thread_id: str) -> dict[str, Any]:
        """What `GET /threads/{threadId}/memory` shows (CONTRACT §2). Raises ThreadNotFoundError."""
        rt = self.rt
        thread = rt.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        record = rt.store.get_record(record_key(self.settings.scope, resource_id, thread_id))
        unobserved = rt.load_after(resource_id, thread_id, record.cursor(thread_id) if record else 0)
        pending = rt.counter.count_messages(unobserved)
        s = self.settings
        # Failures and notes share one store list; read enough of it for both.
        kept = rt.store.recent_failures(
            resource_id, thread_id if s.scope == 'thread' else None, limit=3 * RECENT_FAILURES
        )
        archived = record.archived if record else ()
        return {
            'scope': s.scope,
            'recordId': record.id if record else None,
            'generationCount': record.generation if record else 0,
            'observations': self._with_real_thread_ids(record) if record else '',
            'observationTokens': record.observation_tokens if record else 0,
            'pendingMessageTokens': pending,
            # The thresholds in force now: under `shareTokenBudget` they move with the observations' size.
            'thresholds': {
                'messageTokens': rt.message_threshold(record),
                'observationTokens': rt.observation_threshold(record) if record else s.observation_tokens,
                # Where async buffering stops waiting and observes (reflects) in the request; None when it is off.
                'blockAfter': {'observation': s.block_after, 'reflection': s.reflection_block_after},
            },
            'currentTask': thread.current_task,
            'suggestedResponse': thread.suggested_response,
            'lastObservedAt': iso(record.last_observed_at) if record and record.last_observed_at else None,
            'buffered': actor.buffered_windows(rt, record, thread_id, pending).as_json(projection=False),
            'upcoming': self._upcoming(record, thread, pending),
            'recentFailures': [
                {
                    'operationType': f.operation_type,
                    'reason': f.reason,
                    'message': f.message,
                    'at': iso(f.at),
                    'threadId': f.thread_id,
                    'background': f.background,
                }
                for f in [f for f in kept if not f.note][:RECENT_FAILURES]
            ],
            'recentNotes': [
                {
                    'operationType': f.operation_type,
                    'note': f.reason,
                    'message': f.message,
                    'at': iso(f.at),
                    'threadId': f.thread_id,
                }
                for f in [f for f in kept if f.note][:RECENT_FAILURES]
            ],
            'archive': {
                'afterTokens': s.archive.after_tokens,
                'keepTokens': s.archive.keep_tokens,
                'tokens': sum(g.tokens for g in archived),
                'groups': [
                    {
                        'id': g.id,
                        'threadId': g.thread_id,
                        'range': g.range,
                        'observations': g.observations,
                        'tokens': g.tokens,
                        'archivedAt': iso(g.archived_at),
                        'generation': g.generation,
                    }
                    for g in reversed(archived)
                ],
            },
        }

    def _upcoming(self, record: OMRecord | None, thread: Thread, pending: int) -> dict[str, Any]:
        """When memory will act next: the tokens still to come before the Observer and the Reflector run, and when the
        sweeper observes this thread if nothing more is said (it observes a quiet thread below the threshold too)."""
        rt, s = self.rt, self.settings
        message_threshold = rt.message_threshold(record)
        observation_threshold = rt.observation_threshold(record) if record else s.observation_tokens
        observation_tokens = record.observation_tokens if record else 0
        quiet_at = thread.updated_at + QUIET_AFTER if pending and s.enabled else None
        every = self.sweep_interval_s
        return {
            'observation': {'tokensLeft': max(0, message_threshold - pending) if s.enabled else None},
            'reflection': {'tokensLeft': max(0, observation_threshold - observation_tokens) if s.enabled else None},
            'quietSweep': {
                'quietAfterSeconds': int(QUIET_AFTER.total_seconds()),
                'intervalSeconds': every,
                'quietAt': iso(quiet_at) if quiet_at else None,
                'sweptBy': iso(quiet_at + timedelta(seconds=every)) if quiet_at and every else None,
            },
        }

    def message_statuses(self, resource_id: str, thread_id: str, messages: Sequence[Message]) -> list[OmStatus]:
        """Where each message stands in memory: `observed` (at or before the thread's cursor), `buffered` (inside a
        chunk waiting to activate) or `unobserved`."""
        record = self.rt.store.get_record(record_key(self.settings.scope, resource_id, thread_id))
        cursor = record.cursor(thread_id) if record else 0
        chunks = [c for c in record.buffered_chunks if c.thread_id == thread_id] if record else []
        out: list[OmStatus] = []
        for message in messages:
            seq = message.seq or 0
            if seq and seq <= cursor:
                out.append('observed')
            elif any(c.start_seq <= seq <= c.end_seq for c in chunks):
                out.append('buffered')
            else:
                out.append('unobserved')
        return out

    def generations_view(self, resource_id: str, thread_id: str, *, limit: int = 10) -> dict[str, Any]:
        """What `GET /threads/{threadId}/memory/generations` shows: the memory's generations, newest first (the live
        one first, marked `current`). Resource scope lists the resource's memory. Raises ThreadNotFoundError."""
        rt = self.rt
        if rt.store.get_thread(resource_id, thread_id) is None:
            raise ThreadNotFoundError(thread_id)
        key = record_key(self.settings.scope, resource_id, thread_id)
        found = rt.store.list_generations(key, limit=limit + 1)
        head = found[0] if found else None
        return {
            'scope': self.settings.scope,
            'recordId': head.id if head else None,
            'generations': [
                _generation_json(r, self._with_real_thread_ids(r), current=r is head) for r in found[:limit]
            ],
            'hasMore': len(found) > limit,
        }

    def _with_real_thread_ids(self, record: OMRecord) -> str:
        """The record's observations as readers see them: in resource scope the `<thread id>` sections name the real
        thread ids, not the obscured ids the Observer was shown."""
        if record.scope != 'resource' or not self.settings.obscure_thread_ids:
            return record.active_observations
        return reveal_thread_ids(record.active_observations, record.resource_id, record.observed_thread_ids())


def generation_trigger(record: OMRecord) -> str:
    """What made a generation: `initial` (the first), `reflection` (the Reflector condensed the one before),
    `archive` (the log passed its bound and its oldest groups were archived), or `reset` (observed messages were
    deleted, or a thread erased from a resource's memory; the rest is observed again)."""
    if record.origin in ('reflection', 'archive'):
        return record.origin
    return 'initial' if record.generation == 0 else 'reset'


def _generation_json(record: OMRecord, observations: str, *, current: bool) -> dict[str, Any]:
    return {
        'generation': record.generation,
        'recordId': record.id,
        'current': current,
        'trigger': generation_trigger(record),
        'createdAt': iso(record.created_at),
        'observations': observations,
        'observationTokens': record.observation_tokens,
        # What the generation started with (after the reflection or reset that made it); None before it was kept.
        'initialObservationTokens': record.initial_observation_tokens,
    }
