"""The one reflection path: condense the observation log into a new generation (reference spec §12, §15).

    log snapshot ──► draft (the compression ladder: prompt, model, parse) ──► new generation
                                                └─► or staged on the record (workflow, async buffering)

Callers: the step (synchronously at `observationTokens`, or past `reflection.blockAfter`), the reflection workflow's
tasks (check → reflect → validate → commit, release on failure; Step Functions in AWS, in-process locally) and
async buffering (a background draft of the leading lines, activated later without a model call). Every commit keeps
the lines appended to the log since the snapshot, and never makes the log empty or larger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from om_lib.context import context as ctx
from om_lib.context.idle import ActivationTrigger
from om_lib.errors import ModelError, ModelOutputError, VersionConflictError
from om_lib.llm import CallUsage, Content, ModelRequest, Usage, total_usage
from om_lib.observation import buffering as buf
from om_lib.observation.background import finish_background
from om_lib.parts import (
    Activation,
    BufferingEnd,
    BufferingFailed,
    CycleParts,
    FailureReason,
    ObservationEnd,
    ObservationFailed,
)
from om_lib.prompts import observer as obs
from om_lib.prompts import reflector as refl
from om_lib.prompts.log_check import reflection_notes, reflection_problem
from om_lib.records import NO_STAGED_REFLECTION, Lease, ModelUsage, ObservationGroup, OMRecord
from om_lib.runtime.record_writer import LeaseName, lease_active
from om_lib.runtime.runtime import Cycle, Runtime
from om_lib.work import Job

logger = logging.getLogger(__name__)

# After a failed reflection run (its retries included), no new run starts for 30 s, doubling per failure up to 30 min:
# a model outage must not start a workflow execution on every step.
REFLECTION_RETRY_BASE = timedelta(seconds=30)
REFLECTION_RETRY_MAX = timedelta(minutes=30)
# A background job (a workflow task) may use this long (the worker Lambda's own timeout is longer).
WORKER_BUDGET_S = 600.0
# How long a queued background reflection counts as "running" in status answers (a hint, never a lock).
RUNNING_HINT_TTL = timedelta(minutes=2)
# Below this much time left in a request, a due synchronous reflection is handed to the workflow instead.
MIN_SYNC_REFLECTION_S = 2.0
# Ladder retries for these reasons are about size (`not_under_target`); the others mean "not an observation log".
SIZE_REASONS = frozenset({'over_target', 'not_smaller'})
# A workflow run's lease covers its tasks and the retries between them (5 + 10 + 20 s of backoff, model calls).
WORKFLOW_LEASE_S = 300.0
NOT_SMALLER_ERROR = 'no reflection was smaller than the observations it condenses; they were kept as they are'


class ReflectionRejectedError(ModelOutputError):
    """The reflection workflow refused to commit (empty, not smaller, or the lease was lost); memory is unchanged."""

    code = 'reflection_rejected'


@dataclass(frozen=True)
class ReflectionDraft:
    """A reflection the model wrote for a snapshot of the log, not committed yet."""

    text: str
    tokens: int
    suggested_response: str | None
    input_tokens: int
    # Doubts about the accepted answer (om_lib/prompts/log_check.py), counted and kept for the memory view.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReflectionOutcome:
    """What one synchronous reflection did: `committed`, `busy` (another holder reflects), `failed` or `not_due`."""

    record: OMRecord
    status: Literal['committed', 'busy', 'failed', 'not_due']


def workflow_lease(job: Job) -> LeaseName:
    """The lease a reflection workflow run holds: a buffered run must not block the synchronous last resort
    (`reflection.blockAfter`), which takes `reflecting`; a threshold run is the reflection itself."""
    return 'buffering_reflection' if job.reason == 'buffer' else 'reflecting'


class Reflection:
    """Reflection for one configuration (see module docstring). `buffered`: async buffering of reflection is on."""

    def __init__(self, rt: Runtime, *, buffered: bool) -> None:
        self.rt = rt
        self.buffered = buffered

    # -- when --------------------------------------------------------------------------------------------------------
    def due(self, record: OMRecord) -> bool:
        """Is a threshold reflection due (and not stalled, running, backing off or already staged)?"""
        now = self.rt.clock.now()
        return (
            record.observation_tokens > self.rt.settings.observation_tokens
            and bool(record.active_observations.strip())
            and record.reflection_stalled_at_tokens != record.observation_tokens
            and not lease_active(record.reflecting, now)
            and not record.reflection_backing_off(now)
            # A staged (buffered) reflection is activated by the next step, with no model call.
            and not (self.buffered and record.buffered_reflection)
        )

    def buffered_wanted(self, record: OMRecord) -> bool:
        """Observations reached `observationTokens × reflection.bufferActivation` and nothing is staged or running."""
        s = self.rt.settings
        ratio = s.reflection_buffer_activation
        now = self.rt.clock.now()
        return bool(
            self.buffered
            and ratio
            and record.active_observations.strip()
            and record.buffered_reflection is None
            and record.observation_tokens >= s.observation_tokens * ratio
            and record.reflection_stalled_at_tokens != record.observation_tokens
            and not lease_active(record.reflecting, now)
            and not lease_active(record.buffering_reflection, now)
            and not record.reflection_backing_off(now)
        )

    # -- the model ---------------------------------------------------------------------------------------------------
    def draft(
        self,
        snapshot: str,
        tokens: int,
        deadline: float,
        *,
        target: int | None = None,
        start_level: int = 0,
        skip_hints: bool = False,
        on_retry: Callable[[refl.RetryInfo], None] | None = None,
        spent: list[CallUsage] | None = None,
    ) -> ReflectionDraft:
        """Run the compression ladder on a snapshot of the log; each answer's usage is added to `spent`.

        Raises ReflectionNotSmallerError when no attempt shrank the log, and ModelError when the model failed.
        """
        s = self.rt.settings
        system = refl.build_reflector_system_prompt(
            obs.OBSERVER_EXTRACTION_INSTRUCTIONS
            + '\n\n'
            + obs.OBSERVER_OUTPUT_FORMAT
            + '\n\n'
            + obs.OBSERVER_GUIDELINES,
            instruction=s.reflection_instruction,
        )
        retrieval = s.retrieval is not None
        text = ctx.render_observation_groups_for_reflection(snapshot) or snapshot if retrieval else snapshot
        # Message boundaries date each batch for the Actor's prompt cache; the Reflector rewrites the whole text and
        # writes none back, and its lines keep their own dates and times: it reads (and is billed for) no boundary.
        text = ctx.BOUNDARY_RE.sub('\n\n', text).strip()

        def call(user_prompt: str, level: int) -> str:
            request = ModelRequest(
                purpose='reflector',
                system=system,
                contents=(Content('user', (user_prompt,)),),
                temperature=s.reflector_temperature,
                max_output_tokens=s.reflector_max_output_tokens,
                thinking_budget=s.reflector_thinking_budget,
                source_observations=text,
            )
            response = self.rt.router.generate(s.reflector_model, request, input_tokens=tokens, deadline=deadline)
            if spent is not None:
                spent.append(CallUsage.of(response))
            return response.text

        ladder = refl.run_compression_ladder(
            text,
            call=call,
            count=self.rt.counter.count_observations,
            target=target if target is not None else s.observation_tokens,
            start_level=start_level,
            skip_continuation_hints=skip_hints,
            on_retry=on_retry,
            parse=lambda raw: refl.parse_reflector_output(
                raw, sanitize=obs.sanitize_observation_lines, is_degenerate=obs.detect_degenerate_repetition
            ),
            # Every attempt must still be an observation log that keeps the log's span, or it is never committed.
            check=lambda reflected: reflection_problem(reflected, text),
        )
        reflected = ladder.observations.strip()
        # Group markup comes from the log's own groups (reconciled), never from tags the model wrote.
        reconciled = ctx.reconcile_observation_groups_from_reflection(reflected, snapshot) if retrieval else None
        reflected = reconciled if reconciled is not None else ctx.strip_group_tags(reflected).strip()
        if not reflected.strip():
            raise refl.InvalidReflectionError(
                'the reflection held nothing but group tags; an empty log would erase memory'
            )
        reflected_tokens = self.rt.counter.count_observations(reflected)
        source_tokens = self.rt.counter.count_observations(snapshot)
        if reflected_tokens >= source_tokens:
            # Counted as the Actor sees it (group headers included), the result must still be smaller than what it
            # replaces: a reflection never commits a larger log.
            raise refl.ReflectionNotSmallerError(
                f'the reflection ({reflected_tokens} tokens) is not smaller than the observations it condenses '
                f'({source_tokens} tokens)',
                original_tokens=source_tokens,
                smallest_tokens=reflected_tokens,
            )
        return ReflectionDraft(
            text=reflected,
            tokens=reflected_tokens,
            suggested_response=ladder.suggested_response,
            input_tokens=tokens,
            notes=reflection_notes(ladder.observations, text),
        )

    # -- committing --------------------------------------------------------------------------------------------------
    def commit_generation(
        self, leased: OMRecord, owner: str, compose: Callable[[OMRecord], str], lease: LeaseName = 'reflecting'
    ) -> OMRecord | None:
        """Make `compose(current head)` the new head generation, while lease `lease` is still `owner`'s."""
        rt = self.rt
        threshold = rt.settings.observation_tokens
        group_id = rt.new_id()[:16]

        def build(current: OMRecord) -> OMRecord | None:
            held = getattr(current, lease)
            if held is None or held.owner != owner or current.generation != leased.generation:
                return None
            text = compose(current)
            tokens = rt.counter.count_observations(text)
            return rt.writer.next_generation(
                current,
                origin='reflection',
                active_observations=text,
                observation_tokens=tokens,
                groups=reflection_groups(current, group_id, rt.clock.now()),
                reflecting=None,
                buffering_reflection=None,
                **NO_STAGED_REFLECTION,
                reflection_failures=None,
                reflection_retry_at=None,
                last_buffered_at_tokens=0,
                # Still over the threshold after a committed reflection: back off until the log grows.
                reflection_stalled_at_tokens=tokens if tokens > threshold else None,
            )

        try:
            return rt.writer.commit_generation(leased, build)
        except VersionConflictError:
            return None

    # -- synchronous reflection ----------------------------------------------------------------------------------------
    def reflect_now(
        self, record: OMRecord, thread_id: str, deadline: float, parts: CycleParts, *, asked: bool = False
    ) -> ReflectionOutcome:
        """Reflect inside this request (sync mode, `reflection.blockAfter`, a library user without a queue).

        `asked`: a client asked for it (`POST …/memory/reflect`): below the threshold too, and regardless of a
        recent failure; a log a reflection made that has not grown since is not reflected again (`not_due`).
        """
        rt = self.rt
        threshold = -1 if asked else rt.settings.observation_tokens
        if record.observation_tokens <= threshold or not record.active_observations.strip():
            return ReflectionOutcome(record, 'not_due')
        if asked and just_reflected(record):
            return ReflectionOutcome(record, 'not_due')
        # The stall and the backoff hold back reflections the memory starts by itself, not one a client asked for.
        if not asked and record.reflection_stalled_at_tokens == record.observation_tokens:
            # The last attempt could not shrink this very log: wait until it has grown (spec §12.9).
            return ReflectionOutcome(record, 'not_due')
        if not asked and record.reflection_backing_off(rt.clock.now()):
            # A run failed recently (a background one included): no step asks the model again before the backoff
            # ends; past the archive bound, the oldest groups move to the archive instead (no model call).
            return ReflectionOutcome(record, 'not_due')
        cycle = rt.start_cycle()
        leased = rt.writer.take_lease(
            record,
            'reflecting',
            cycle.cycle_id,
            lambda cur: cur.generation == record.generation and cur.observation_tokens > threshold,
        )
        if leased is None:
            fresh = rt.writer.fresh(record)
            busy = lease_active(fresh.reflecting, rt.clock.now()) and fresh.generation == record.generation
            return ReflectionOutcome(fresh, 'busy' if busy else 'not_due')
        snapshot_text, snapshot_tokens = leased.active_observations, leased.observation_tokens
        parts.add(rt.start_part(cycle, 'reflection', snapshot_tokens, leased.id, thread_id))

        def on_retry(info: refl.RetryInfo) -> None:
            parts.add(
                rt.failed_part(
                    cycle,
                    'reflection',
                    snapshot_tokens,
                    info.error,
                    leased.id,
                    thread_id,
                    # Too big, or not an observation log at all (a refusal, prose, a loop, nothing).
                    reason='not_under_target'
                    if info.reason in ('over_target', 'not_smaller')
                    else 'invalid_reflection',
                    retrying=True,
                )
            )

        spent: list[CallUsage] = []

        def failed(exc: Exception, reason: FailureReason | None, *, stall: bool, back_off: bool) -> ReflectionOutcome:
            # Nothing committed: report it, and release the lease with what holds the next attempt back.
            parts.add(
                rt.failed_part(
                    cycle,
                    'reflection',
                    snapshot_tokens,
                    exc,
                    leased.id,
                    thread_id,
                    reason=reason,
                    usage=total_usage(spent),
                )
            )
            held_back: dict[str, Any] = self._backoff(leased) if back_off else {}
            if stall:
                held_back['reflection_stalled_at_tokens'] = snapshot_tokens
            released = rt.writer.release_lease(leased, 'reflecting', cycle.cycle_id, **held_back)
            return ReflectionOutcome(released, 'failed')

        try:
            with rt.writer.holding(leased, 'reflecting', cycle.cycle_id):
                draft = self.draft(snapshot_text, snapshot_tokens, deadline, on_retry=on_retry, spent=spent)
        except refl.ReflectionNotSmallerError as exc:
            # The log cannot shrink: it waits until it has grown (no backoff; the stall holds it).
            return failed(exc, 'not_smaller', stall=True, back_off=False)
        except ModelError as exc:
            # Memory stays as it was; like a failed run, the next attempt waits (30 s doubling). An answer that was
            # not an observation log (a refusal, an essay, a loop, nothing) says so (`invalid_reflection`), and
            # the very same log is not offered to the model again: it waits for the log to change too.
            answered = isinstance(exc, ModelOutputError)
            return failed(exc, 'invalid_reflection' if answered else None, stall=answered, back_off=True)
        except Exception:
            rt.writer.release_quietly(leased, 'reflecting', cycle.cycle_id)
            raise

        def compose(current: OMRecord) -> str:
            # Keep every line appended to the old head since the snapshot (an observation may commit meanwhile).
            appended = ''
            if current.active_observations != snapshot_text and current.active_observations.startswith(snapshot_text):
                appended = current.active_observations[len(snapshot_text) :].strip()
            return draft.text + ('\n\n' + appended if appended else '')

        committed = self.commit_generation(leased, cycle.cycle_id, compose)
        if committed is None:
            parts.add(
                rt.failed_part(
                    cycle,
                    'reflection',
                    snapshot_tokens,
                    'the reflecting lease was lost before commit; another writer won',
                    leased.id,
                    thread_id,
                    reason='conflict',
                    usage=total_usage(spent),
                )
            )
            return ReflectionOutcome(rt.writer.fresh(leased), 'failed')
        parts.add(
            ObservationEnd(
                cycle_id=cycle.cycle_id,
                operation_type='reflection',
                completed_at=rt.clock.now(),
                duration_ms=rt.elapsed_ms(cycle),
                tokens_observed=snapshot_tokens,
                observation_tokens=committed.observation_tokens,
                observations=committed.active_observations,
                suggested_response=draft.suggested_response,
                record_id=committed.id,
                thread_id=thread_id,
                notes=draft.notes or None,
                usage=total_usage(spent),
            )
        )
        if draft.notes:
            rt.remember_notes(committed.resource_id, thread_id, 'reflection', draft.notes, draft.text[:300])
        return ReflectionOutcome(committed, 'committed')

    # -- async buffering of reflection (spec §12.4–§12.6) --------------------------------------------------------------
    def wait_for_other(
        self, busy: ReflectionOutcome, thread_id: str, deadline: float, parts: CycleParts
    ) -> tuple[OMRecord, bool]:
        """After `reflect_now` said `busy` (the workflow or a concurrent request holds this log's reflection lease):
        wait for that holder, keeping time for a reflection of our own. `(fresh head, True)` once it is done; when it
        is not done within the budget, a `busy` failure part and `(the head as it is, False)`."""
        rt = self.rt
        fresh = rt.wait_for_release(busy.record, 'reflecting', deadline, reserve_s=MIN_SYNC_REFLECTION_S)
        if fresh is not None:
            return fresh, True
        parts.add(
            rt.failed_part(
                None,
                'reflection',
                busy.record.observation_tokens,
                'another worker is reflecting this memory and did not finish within this request',
                busy.record.id,
                thread_id,
                reason='busy',
            )
        )
        return rt.writer.fresh(busy.record), False

    def start_buffered(self, record: OMRecord, thread_id: str, parts: CycleParts) -> tuple[OMRecord, bool]:
        """Start a background reflection through the workflow when due; marks the record so it starts once."""
        rt = self.rt
        if not self.buffered_wanted(record):
            return record, False
        cycle = rt.start_cycle('buffer-refl-')
        hint = Lease(owner=cycle.cycle_id, expires_at=rt.clock.now() + RUNNING_HINT_TTL)
        wanted = self.buffered_wanted

        def mark(current: OMRecord) -> OMRecord | None:
            if current.generation != record.generation or not wanted(current):
                return None
            return current.model_copy(update={'buffering_reflection': hint})

        marked = rt.writer.try_commit(record, mark)
        if marked is None:
            return rt.writer.fresh(record), False
        job = Job('reflect', record.resource_id, thread_id, record.key, 'buffer', cycle_id=cycle.cycle_id)
        if not rt.submit(job):
            return marked, False
        slice_ = self._buffered_slice(marked)
        parts.add(rt.buffering_start_part(cycle, 'reflection', slice_.input_tokens, marked.id, thread_id))
        return marked, True

    def buffered_step(
        self,
        record: OMRecord,
        thread_id: str,
        deadline: float,
        parts: CycleParts,
        *,
        trigger: ActivationTrigger | None = None,
    ) -> OMRecord:
        """A step with buffered reflection: activate a staged reflection past the threshold (or below it, on a
        `trigger`: `reflection.activateAfterIdle` / `activateOnProviderChange`); reflect synchronously past
        `reflection.blockAfter` with nothing staged; else start a background one when due."""
        rt = self.rt
        s = rt.settings
        over = record.observation_tokens > s.observation_tokens and bool(record.active_observations.strip())
        if (over or trigger is not None) and record.buffered_reflection:
            activated = self.activate_staged(record, thread_id, parts, trigger=None if over else trigger)
            if activated is not None:
                # Still past the start point: the next background reflection starts now (spec §12.4).
                return self.start_buffered(activated, thread_id, parts)[0]
            record = rt.writer.fresh(record)
        block_after = s.reflection_block_after
        if (
            over
            and not record.buffered_reflection
            and block_after is not None
            and record.observation_tokens >= block_after
            and rt.left(deadline) >= MIN_SYNC_REFLECTION_S
        ):
            # The last resort: reflect inside this request (a running background reflection holds its own lease;
            # this one supersedes it).
            return self.reflect_now(record, thread_id, deadline, parts).record
        return self.start_buffered(record, thread_id, parts)[0]

    def activate_staged(
        self, record: OMRecord, thread_id: str, parts: CycleParts, *, trigger: ActivationTrigger | None = None
    ) -> OMRecord | None:
        """Make the staged reflection the new generation, keeping every line appended since (no model call).
        `trigger`: why it happens below the threshold (idle time, a model change); None: the threshold."""
        rt = self.rt
        before = record.observation_tokens
        owner = f'activate-{rt.new_id()}'
        now = rt.clock.now()
        lease = Lease(owner=owner, expires_at=now + RUNNING_HINT_TTL)

        def take(current: OMRecord) -> OMRecord | None:
            if lease_active(current.reflecting, now):
                return None
            if lease_active(current.buffering_reflection, now):
                return None  # staged by a run that has not validated and released it yet
            if not current.buffered_reflection or current.generation != record.generation:
                return None
            return current.model_copy(update={'reflecting': lease})

        leased = rt.writer.try_commit(record, take)
        if leased is None:
            return None
        committed = self.commit_generation(leased, owner, _merge_staged)
        if committed is None:
            rt.writer.release_quietly(leased, 'reflecting', owner)
            return None
        if committed.reflection_stalled_at_tokens is not None:
            # A buffered reflection covers only the leading lines, so a log still over the threshold is expected:
            # the next background reflection covers more. (A reflection that cannot shrink its slice still stalls.)
            committed = (
                rt.writer.try_commit(
                    committed, lambda cur: cur.model_copy(update={'reflection_stalled_at_tokens': None})
                )
                or committed
            )
        parts.add(
            Activation(
                cycle_id=leased.buffered_reflection_cycle_id or owner,
                operation_type='reflection',
                activated_at=rt.clock.now(),
                chunks_activated=1,
                tokens_activated=before,
                observation_tokens=committed.observation_tokens,
                messages_activated=0,
                generation_count=committed.generation,
                observations=committed.active_observations,
                record_id=committed.id,
                thread_id=thread_id,
                config=rt.marker_config(),
                **(trigger.part_fields() if trigger is not None else {}),  # type: ignore[arg-type]
            )
        )
        return committed

    def _buffered_slice(self, record: OMRecord) -> buf.ReflectionSlice:
        s = self.rt.settings
        return buf.reflection_slice(
            record.active_observations,
            record.observation_tokens,
            s.observation_tokens,
            s.reflection_buffer_activation or 0.5,
        )

    # -- the reflection workflow (Step Functions: check → reflect → validate → commit; release on failure) -------------
    def check(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """Is reflection due? If so take the run's lease for `owner` (the execution).

        Every workflow task reports the parts it makes into `parts` (the reflection function publishes them) besides
        keeping them on the record for the client's next step."""
        rt = self.rt
        parts = CycleParts() if parts is None else parts
        record = rt.store.get_record(job.record_key)
        if record is None or not self._job_due(job, record):
            return {'due': False}
        generation = record.generation
        name = workflow_lease(job)
        leased = rt.writer.take_lease(
            record,
            name,
            owner,
            lambda cur: cur.generation == generation and self._job_due(job, cur.model_copy(update={name: None})),
            # The lease spans the workflow's tasks (separate invocations, with retries between them); the reflect task
            # renews it while the model works.
            ttl_s=WORKFLOW_LEASE_S,
            # A buffered run takes over the running hint the step left under its cycle id.
            replaces=job.cycle_id if job.reason == 'buffer' else None,
        )
        if leased is None:
            return {'due': False}
        if job.reason != 'buffer':  # a buffered run is announced with buffering parts (the step's, then the tasks')
            start = rt.start_part(
                Cycle(owner, rt.clock.now(), rt.clock.monotonic()),
                'reflection',
                leased.observation_tokens,
                leased.id,
                job.thread_id,
            )
            finish_background(rt, leased, name, None, start)
            parts.add(start)
        return {'due': True, 'generation': leased.generation, 'inputTokens': leased.observation_tokens}

    def stage(
        self, job: Job, owner: str, *, deadline: float | None = None, parts: CycleParts | None = None
    ) -> dict[str, Any]:
        """Run the ladder on the log and stage the result as the record's buffered reflection.

        A model failure raises (the workflow retries with backoff, then releases). A log that cannot be shrunk
        releases the lease and remembers the stall, so the schedule does not restart it until the log changes.
        """
        rt = self.rt
        parts = CycleParts() if parts is None else parts
        record = self._held(job, owner)
        if record is None:
            return {'outcome': 'lease_lost'}
        name = workflow_lease(job)
        cycle = rt.start_cycle()
        limit = deadline if deadline is not None else rt.clock.monotonic() + WORKER_BUDGET_S
        snapshot, tokens = record.active_observations, record.observation_tokens
        line_count = len(snapshot.split('\n'))
        target, start_level, input_tokens = rt.settings.observation_tokens, 0, tokens
        if job.reason == 'buffer':
            # A buffered reflection condenses the leading lines only, asking for a modest reduction (spec §12.5).
            part = self._buffered_slice(record)
            # The slice's real size (not the per-line estimate): validation compares the draft with it.
            snapshot, line_count, input_tokens = part.text, part.line_count, rt.counter.count_observations(part.text)
            target, start_level = part.target_tokens, 1
        spent: list[CallUsage] = []
        try:
            with rt.writer.holding(record, name, owner, ttl_s=WORKFLOW_LEASE_S):
                draft = self.draft(
                    snapshot,
                    input_tokens,
                    limit,
                    target=target,
                    start_level=start_level,
                    skip_hints=start_level > 0,
                    spent=spent,
                )
        except refl.ReflectionNotSmallerError as exc:
            released = rt.writer.release_lease(record, name, owner, reflection_stalled_at_tokens=tokens)
            error = str(exc) if job.reason == 'buffer' else NOT_SMALLER_ERROR
            self._run_failed(job, owner, released, cycle, input_tokens, error, 'not_smaller', parts, total_usage(spent))
            return {'outcome': 'not_smaller', 'inputTokens': input_tokens}
        except ModelOutputError as exc:
            # The model answered, with something that is not an observation log (every level): keep the current
            # generation, back off, wait for the log to change (the same input would get the same answers), and tell
            # the next step why. Not raised: a workflow retry would only ask again.
            released = rt.writer.release_lease(
                record, name, owner, **self._backoff(record), reflection_stalled_at_tokens=tokens
            )
            self._run_failed(
                job, owner, released, cycle, input_tokens, str(exc), 'invalid_reflection', parts, total_usage(spent)
            )
            return {'outcome': 'invalid_reflection', 'inputTokens': input_tokens, 'error': str(exc)}
        usage = total_usage(spent)
        ended = None
        made: BufferingEnd | None = None
        if job.reason == 'buffer':
            made = BufferingEnd(
                cycle_id=job.cycle_id or owner,
                operation_type='reflection',
                completed_at=rt.clock.now(),
                duration_ms=rt.elapsed_ms(cycle),
                tokens_buffered=input_tokens,
                buffered_tokens=draft.tokens,
                record_id=record.id,
                thread_id=job.thread_id,
                usage=usage,
            )
            ended = made.to_json()

        def stage(current: OMRecord) -> OMRecord | None:
            held = getattr(current, name)
            if held is None or held.owner != owner or current.generation != record.generation:
                return None
            update: dict[str, Any] = {
                'buffered_reflection': draft.text,
                'buffered_reflection_tokens': draft.tokens,
                'buffered_reflection_input_tokens': input_tokens,
                'reflected_line_count': line_count,
                'buffered_reflection_cycle_id': job.cycle_id,
                # Reported by the commit task (a threshold run's end part); a buffered run reports it now.
                'buffered_reflection_usage': _stored_usage(usage) if job.reason != 'buffer' else None,
            }
            if ended is not None:
                update['background_parts'] = buf.keep_background_part(current.background_parts, ended)
            return current.model_copy(update=update)

        if rt.writer.commit(record, stage) is None:
            return {'outcome': 'lease_lost'}
        if made is not None:
            parts.add(made)
        if draft.notes:
            rt.remember_notes(record.resource_id, job.thread_id, 'reflection', draft.notes, draft.text[:300])
        return {'outcome': 'reflected', 'inputTokens': input_tokens, 'tokens': draft.tokens, 'notes': list(draft.notes)}

    def validate(self, job: Job, owner: str) -> dict[str, Any]:
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
        covered = '\n'.join(record.active_observations.split('\n')[: record.reflected_line_count or 0])
        problem = reflection_problem(staged, covered or record.active_observations)
        if problem is not None:
            raise ReflectionRejectedError(f'the staged reflection may not replace the log: {problem}')
        return {'valid': True, 'tokens': record.buffered_reflection_tokens}

    def commit_staged(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """Make the staged reflection the new generation, keeping the lines appended since it was staged."""
        rt = self.rt
        parts = CycleParts() if parts is None else parts
        record = self._held(job, owner)
        if record is None:
            raise ReflectionRejectedError('the reflecting lease was lost before commit')
        if job.reason == 'buffer':
            # A buffered reflection stays staged: the step that finds observations past the threshold activates it.
            rt.writer.release_lease(record, 'buffering_reflection', owner)
            return {'outcome': 'staged', 'tokens': record.buffered_reflection_tokens}
        committed = self.commit_generation(record, owner, _merge_staged)
        if committed is None:
            raise ReflectionRejectedError('the record changed generation or lease before commit')
        ended = ObservationEnd(
            cycle_id=owner,
            operation_type='reflection',
            completed_at=rt.clock.now(),
            duration_ms=0,  # the tasks run in separate invocations; the execution's history has the timings
            tokens_observed=record.buffered_reflection_input_tokens or 0,
            observation_tokens=committed.observation_tokens,
            observations=committed.active_observations,
            record_id=committed.id,
            thread_id=job.thread_id,
            usage=_call_usage(record.buffered_reflection_usage),
        )
        finish_background(rt, committed, workflow_lease(job), None, ended)
        parts.add(ended)
        return {
            'outcome': 'committed',
            'generation': committed.generation,
            'inputTokens': ended.tokens_observed,
            'tokens': committed.observation_tokens,
        }

    def release(self, job: Job, owner: str, parts: CycleParts | None = None) -> dict[str, Any]:
        """The failure path: drop the staged result and the lease; the old observations stay as they were."""
        rt = self.rt
        parts = CycleParts() if parts is None else parts
        record = rt.store.get_record(job.record_key)
        if record is None:
            return {'released': False}
        name = workflow_lease(job)
        held = getattr(record, name)
        released = rt.writer.release_lease(
            record,
            name,
            owner,
            **NO_STAGED_REFLECTION,
            **self._backoff(record),
        )
        if held is not None and held.owner == owner:
            if job.reason == 'buffer':
                error = 'the background reflection failed; past reflection.blockAfter a step reflects synchronously'
            else:
                error = 'the reflection workflow failed; the previous observations were kept'
            # A model that kept failing: what the staged attempt cost, if one was staged, is reported here.
            usage = _call_usage(record.buffered_reflection_usage)
            self._run_failed(job, owner, released, None, released.observation_tokens, error, 'error', parts, usage)
        return {'released': True}

    def run_in_process(self, job: Job, deadline: float, parts: CycleParts | None = None) -> None:
        """The workflow's tasks in-process (a queue-only deployment; the local stack without Step Functions)."""
        owner = f'job-{self.rt.new_id()}'
        parts = CycleParts() if parts is None else parts
        if not self.check(job, owner, parts).get('due'):
            return
        try:
            if self.stage(job, owner, deadline=deadline, parts=parts).get('outcome') != 'reflected':
                return
            self.validate(job, owner)
            self.commit_staged(job, owner, parts)
        except Exception:
            self.release(job, owner, parts)
            raise

    def _backoff(self, record: OMRecord) -> dict[str, Any]:
        """After a failed run (its retries included): no new run for 30 s, doubling per failure up to 30 min, so a
        model outage does not start a reflection on every step. A committed generation forgets it."""
        failures = (record.reflection_failures or 0) + 1
        wait = min(REFLECTION_RETRY_MAX, REFLECTION_RETRY_BASE * 2 ** min(failures - 1, 16))
        return {'reflection_failures': failures, 'reflection_retry_at': self.rt.clock.now() + wait}

    def _run_failed(
        self,
        job: Job,
        owner: str,
        record: OMRecord,
        cycle: Cycle | None,
        tokens: int,
        error: str,
        reason: FailureReason,
        parts: CycleParts,
        usage: CallUsage | None = None,
    ) -> None:
        """A workflow run failed: keep its failed part for the client's next step (a buffered run's under the step's
        cycle id, a run's own under the execution's name, its start's cycle) and remember it for `recentFailures`."""
        rt = self.rt
        failed: BufferingFailed | ObservationFailed
        if job.reason == 'buffer':
            failed = replace(self._buffering_failed(job, record, cycle, tokens, error, reason), usage=usage)
        else:
            failed = rt.failed_part(
                cycle, 'reflection', tokens, error, record.id, job.thread_id, reason=reason, usage=usage
            )
            failed = replace(failed, cycle_id=owner)
        finish_background(rt, record, workflow_lease(job), None, failed)
        parts.add(failed)
        rt.remember_failures(job.resource_id, job.thread_id, [failed])

    def _buffering_failed(
        self,
        job: Job,
        record: OMRecord,
        cycle: Cycle | None,
        tokens: int,
        error: str,
        reason: FailureReason = 'error',
    ) -> BufferingFailed:
        return BufferingFailed(
            cycle_id=job.cycle_id or '',
            operation_type='reflection',
            failed_at=self.rt.clock.now(),
            duration_ms=self.rt.elapsed_ms(cycle),
            tokens_attempted=tokens,
            error=error,
            record_id=record.id,
            thread_id=job.thread_id,
            reason=reason,
        )

    def _job_due(self, job: Job, record: OMRecord) -> bool:
        if job.reason == 'buffer':
            # The step that queued it marked the record (`buffering_reflection`); that mark is this job's own.
            return self.buffered_wanted(record.model_copy(update={'buffering_reflection': None}))
        return self.due(record)

    def _held(self, job: Job, owner: str) -> OMRecord | None:
        record = self.rt.store.get_record(job.record_key)
        held = getattr(record, workflow_lease(job)) if record is not None else None
        if record is None or held is None or held.owner != owner:
            return None
        return record


def _stored_usage(usage: CallUsage | None) -> ModelUsage | None:
    """A draft's usage as the record keeps it until the commit task reports it."""
    if usage is None:
        return None
    u = usage.usage
    return ModelUsage(
        model=usage.model,
        calls=usage.calls,
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        cache_read_tokens=u.cache_read_tokens,
        cache_write_tokens=u.cache_write_tokens,
    )


def _call_usage(stored: ModelUsage | None) -> CallUsage | None:
    if stored is None:
        return None
    return CallUsage(
        model=stored.model,
        calls=stored.calls,
        usage=Usage(stored.input_tokens, stored.output_tokens, stored.cache_read_tokens, stored.cache_write_tokens),
    )


def _merge_staged(current: OMRecord) -> str:
    return refl.merge_buffered_reflection(
        current.buffered_reflection or '', current.active_observations, current.reflected_line_count or 0
    )


def just_reflected(record: OMRecord) -> bool:
    """Was the head made by a reflection, with nothing observed since (reflecting it again would only condense the
    condensed)?"""
    return record.origin == 'reflection' and record.observation_tokens == record.initial_observation_tokens


def reflection_groups(record: OMRecord, group_id: str, now: datetime) -> tuple[ObservationGroup, ...]:
    """After a reflection, one group per thread spans everything its earlier groups covered. Import groups stay as
    they are: they name messages that are not in the thread, and keep the same import from being observed twice."""
    by_thread: dict[str, list[ObservationGroup]] = {}
    for group in record.groups:
        if group.kind != 'import':
            by_thread.setdefault(group.thread_id, []).append(group)
    kept = [g for g in record.groups if g.kind == 'import']
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
    return (*kept, *merged)
