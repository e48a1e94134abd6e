"""The one observation pipeline: "observe these messages" (reference spec §9, §10.3, §17.4).

    backlogs ──► ObserverCall (prompt, model, parse, validate) ──► commit ──► cursors, text, hints, parts
                                                                  └─► or a buffered chunk (async buffering)

- **Which messages** and **how results map back** are the scope's (`ThreadStrategy`, `ResourceStrategy`): a thread
  backlog is the thread's messages after its cursor; in resource scope the Observer may see several threads at once,
  and each thread's result goes into its own `<thread id>` section of the shared log.
- **The answer must account for its input.** A cursor moves past a message only when a committed observation covers
  it. An Observer answer that leaves a thread out (no section for it) never counts as having observed it: that thread
  is asked again on its own (a single-thread call needs no sections); what still fails stays unobserved and is
  reported with `data-om-observation-failed`.
- **Callers**: the step (synchronous observation at the threshold, or past `blockAfter`), the worker's observe job
  (everything pending, below the threshold too) and the worker's buffer job (one slice, stored as a chunk). They
  differ only in which backlogs they pass and where the result goes.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from om_lib.context import context as ctx
from om_lib.errors import (
    DeadlineExceededError,
    ModelError,
    ModelOutputError,
    ModelUnavailableError,
    VersionConflictError,
)
from om_lib.llm import CallUsage, Content, InlineBlob, ModelRequest, total_usage
from om_lib.messages import Message, time_of
from om_lib.observation import resource_scope as rs
from om_lib.observation.buffering import live_chunks
from om_lib.parts import CycleParts, FailureReason, ObservationEnd, ThreadUpdate
from om_lib.prompts import observer as obs
from om_lib.prompts.log_check import answer_notes
from om_lib.records import BufferedChunk, ObservationGroup, OMRecord, Thread
from om_lib.runtime.record_writer import lease_active
from om_lib.runtime.runtime import Cycle, Runtime, has_pending_tool_call
from om_lib.work import Job

logger = logging.getLogger(__name__)

# Below this much time left in a request, a due observation is handed to the worker instead of started.
MIN_SYNC_OBSERVATION_S = 1.0
# Gemini accepts inline request data up to about 20 MB; stay well inside it.
MAX_INLINE_ATTACHMENT_BYTES = 12 * 1024 * 1024
MAX_PARALLEL_BATCHES = 4


# ---------------------------------------------------------------------------------------------------------------------
# What goes in and what comes out
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backlog:
    """One thread's unobserved messages (after its cursor), in arrival order.

    `import_id` marks messages imported from elsewhere (`POST /threads/{id}/memory/observe`): they are not stored in
    the thread, so their observations move no cursor; they are recorded as one `import` group of that id, which
    makes the same import a no-op the second time.
    """

    thread_id: str
    messages: tuple[Message, ...]
    tokens: int
    import_id: str | None = None

    @property
    def first_seq(self) -> int:
        """The first message's sequence number (0 when empty)."""
        return self.messages[0].seq or 0 if self.messages else 0

    @property
    def last_seq(self) -> int:
        """The last message's sequence number (0 when empty)."""
        return self.messages[-1].seq or 0 if self.messages else 0

    @property
    def observed_at(self) -> datetime:
        """The newest message time: where the observation's boundary is dated."""
        return max(time_of(m) for m in self.messages)

    def after(self, cursor: int, rt: Runtime) -> Backlog | None:
        """The part after `cursor` (None when nothing is left)."""
        if not self.messages or self.first_seq > cursor or self.import_id is not None:
            return self
        rest = tuple(m for m in self.messages if (m.seq or 0) > cursor)
        return Backlog(self.thread_id, rest, rt.counter.count_messages(rest)) if rest else None


def backlog_of(thread_id: str, messages: Sequence[Message], rt: Runtime) -> Backlog:
    """A backlog of `messages` (system messages are the host's, never observed)."""
    kept = tuple(m for m in messages if m.role != 'system')
    return Backlog(thread_id, kept, rt.counter.count_messages(kept))


@dataclass(frozen=True)
class ThreadObservation:
    """What the Observer wrote for one backlog, checked to cover it, and what its calls cost."""

    backlog: Backlog
    parsed: obs.ParsedObservations
    usage: CallUsage | None = None


@dataclass(frozen=True)
class ThreadFailure:
    """A backlog the Observer did not cover, and why (it stays unobserved); `usage`: calls that answered uselessly."""

    backlog: Backlog
    error: Exception
    reason: FailureReason
    usage: CallUsage | None = None


def imported(backlog: Backlog, record: OMRecord) -> bool:
    """Has this import been observed into `record` already (its group is there, for this thread)?"""
    return backlog.import_id is not None and any(
        g.kind == 'import' and g.id == backlog.import_id and g.thread_id == backlog.thread_id for g in record.groups
    )


def still_needed(backlog: Backlog, record: OMRecord) -> bool:
    """Does `record` still lack what `backlog` would add (messages past the cursor, or an import not yet made)?"""
    if backlog.import_id is not None:
        return not imported(backlog, record)
    return record.cursor(backlog.thread_id) < backlog.last_seq


@dataclass
class ObserverOutcome:
    """The Observer's answers for a set of backlogs: each backlog is either observed or failed, never both."""

    observed: list[ThreadObservation] = field(default_factory=list)
    failed: list[ThreadFailure] = field(default_factory=list)

    def merge(self, other: ObserverOutcome) -> None:
        """Add another call's outcome."""
        self.observed.extend(other.observed)
        self.failed.extend(other.failed)


# ---------------------------------------------------------------------------------------------------------------------
# Scope strategies
# ---------------------------------------------------------------------------------------------------------------------
class ScopeStrategy(Protocol):
    """What differs between thread and resource scope: call grouping, where results go, bookkeeping."""

    def plan_calls(self, backlogs: Sequence[Backlog]) -> list[list[Backlog]]:
        """The Observer calls to make: each inner list is one call's backlogs."""
        ...

    def compose(self, text: str, observation: ThreadObservation, record: OMRecord) -> str:
        """The log after adding one thread's new observations."""
        ...

    def after_commit(self, record: OMRecord, observed: Sequence[ThreadObservation]) -> None:
        """Bookkeeping outside the record once observations are committed."""
        ...


class ThreadStrategy:
    """Thread scope: one thread, one call; observations are appended after a dated message boundary."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def plan_calls(self, backlogs: Sequence[Backlog]) -> list[list[Backlog]]:
        """One call per thread (thread scope has one)."""
        return [[b] for b in backlogs]

    def compose(self, text: str, observation: ThreadObservation, record: OMRecord) -> str:
        """Append after a message boundary, wrapped in an observation group when retrieval is on."""
        block = ctx.strip_group_tags(observation.parsed.observations).strip()
        backlog = observation.backlog
        # Imported messages are not stored, so there is nothing for recall to page back: no group markup.
        if self.rt.settings.retrieval is not None and backlog.import_id is None:
            block = ctx.wrap_in_observation_group(
                block,
                ctx.group_range(backlog.first_seq, backlog.last_seq),
                group_id=ctx.group_id_for(backlog.first_seq),
            )
        if not text.strip():
            return block
        return text + ctx.message_boundary(backlog.observed_at) + block

    def after_commit(self, record: OMRecord, observed: Sequence[ThreadObservation]) -> None:
        """Nothing outside the record."""


class ResourceStrategy:
    """Resource scope: several threads per call (batched by tokens), each result in its thread's section."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def codec(self, resource_id: str) -> rs.ThreadIdCodec:
        """The thread ids the Observer and the Actor see (obscured unless `obscureThreadIds: false`)."""
        return rs.ThreadIdCodec(resource_id, obscure=self.rt.settings.obscure_thread_ids)

    def plan_calls(self, backlogs: Sequence[Backlog]) -> list[list[Backlog]]:
        """Batches of at most `maxTokensPerBatch` tokens, in the given (selection) order."""
        loads = [rs.ThreadLoad(b.thread_id, b.tokens, None) for b in backlogs]
        by_id = {b.thread_id: b for b in backlogs}
        return [
            [by_id[x.thread_id] for x in batch]
            for batch in rs.batch_threads(loads, self.rt.settings.max_tokens_per_batch)
        ]

    def compose(self, text: str, observation: ThreadObservation, record: OMRecord) -> str:
        """Replace or append the thread's `<thread id>` section (tail-only merge)."""
        backlog = observation.backlog
        section = rs.wrap_with_thread_tag(
            self.codec(record.resource_id).shown(backlog.thread_id), observation.parsed.observations
        )
        return rs.replace_or_append_thread_section(text, section, backlog.observed_at)

    def after_commit(self, record: OMRecord, observed: Sequence[ThreadObservation]) -> None:
        """Observed threads leave the resource's pending index (unless newer messages arrived meanwhile)."""
        for item in observed:
            if item.backlog.import_id is not None:
                continue  # imported messages are not the thread's pending ones
            self.rt.store.clear_pending(
                record.resource_id, item.backlog.thread_id, observed_through=item.backlog.last_seq
            )

    def select(self, backlogs: Sequence[Backlog], threshold: int | None) -> list[Backlog]:
        """The threads one cycle observes: oldest-first until the threshold is covered (all with `None`)."""
        by_id = {b.thread_id: b for b in backlogs}
        loads = [rs.ThreadLoad(b.thread_id, b.tokens, time_of(b.messages[0])) for b in backlogs]
        target = threshold if threshold is not None else sum(x.tokens for x in loads)
        return [by_id[x.thread_id] for x in rs.select_threads(loads, target, now=self.rt.clock.now())]


# ---------------------------------------------------------------------------------------------------------------------
# The Observer call
# ---------------------------------------------------------------------------------------------------------------------
class ObserverCall:
    """One Observer request over one or more backlogs: prompt, model call, parse, and the coverage check."""

    def __init__(self, rt: Runtime, strategy: ScopeStrategy) -> None:
        self.rt = rt
        self.strategy = strategy

    def run(
        self, record: OMRecord, backlogs: Sequence[Backlog], deadline: float, *, previous: str | None = None
    ) -> ObserverOutcome:
        """Observe `backlogs` (one call, or one per planned batch in parallel). Never raises a model error: a failed
        call is a `ThreadFailure` per backlog. `previous` replaces the record's log as the Observer's context."""
        batches = self.strategy.plan_calls(backlogs)
        if len(batches) == 1:
            return self._run_batch(record, batches[0], deadline, previous)
        outcome = ObserverOutcome()
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_BATCHES, len(batches))) as pool:
            for result in pool.map(lambda batch: self._run_batch(record, batch, deadline, previous), batches):
                outcome.merge(result)
        return outcome

    def _run_batch(
        self, record: OMRecord, batch: list[Backlog], deadline: float, previous: str | None
    ) -> ObserverOutcome:
        if not isinstance(self.strategy, ResourceStrategy):
            return self._single(record, batch[0], deadline, previous)
        outcome = ObserverOutcome()
        usages: list[CallUsage] = []
        try:
            covered = self._multi(record, batch, deadline, previous, usages)
        except (ModelError, DeadlineExceededError) as exc:
            logger.warning('observation batch failed', extra={'threads': len(batch), 'error': str(exc)})
            spent, whole = total_usage(usages), sum(b.tokens for b in batch)
            outcome.failed.extend(
                ThreadFailure(b, exc, _reason(exc), spent.share(b.tokens, whole) if spent else None) for b in batch
            )
            return outcome
        spent = total_usage(usages)
        whole = sum(b.tokens for b in batch)
        for backlog in batch:
            parsed = covered.get(backlog.thread_id)
            # One call observed the batch: its usage is split by each conversation's share of the input.
            share = spent.share(backlog.tokens, whole) if spent is not None else None
            if parsed is not None:
                outcome.observed.append(ThreadObservation(backlog, parsed, share))
            elif len(batch) > 1:
                # The answer left this thread out: ask about it alone (a single-thread batch needs no sections).
                logger.info('observer answer did not cover a thread; observing it alone')
                outcome.merge(self._run_batch(record, [backlog], deadline, previous))
            else:
                error = ModelOutputError('the Observer wrote no observations for this conversation')
                outcome.failed.append(ThreadFailure(backlog, error, 'invalid_output', share))
        return outcome

    # -- one thread ------------------------------------------------------------------------------------------------
    def _single(self, record: OMRecord, backlog: Backlog, deadline: float, previous: str | None) -> ObserverOutcome:
        s = self.rt.settings
        thread = self.rt.store.get_thread(record.resource_id, backlog.thread_id)
        context_text, truncated = self._context(record, previous)
        transcript = obs.format_messages_for_observer(
            list(backlog.messages),
            timezone=record.observed_timezone,
            count=self.rt.counter.count_string,
            temporal_gap_s=s.temporal_gap_s,
        )
        prompt = obs.build_observer_request(
            transcript=transcript,
            previous_observations=context_text,
            was_truncated=truncated,
            prior_current_task=thread.current_task if thread else None,
            prior_suggested_response=thread.suggested_response if thread else None,
            prior_thread_title=thread.title if thread else None,
            thread_title=s.thread_title,
        )
        request = ModelRequest(
            purpose='observer',
            system=obs.build_observer_system_prompt(instruction=s.observation_instruction, thread_title=s.thread_title),
            contents=(Content('user', (prompt, *self._inline_attachments(transcript, record.resource_id))),),
            temperature=s.observer_temperature,
            max_output_tokens=s.observer_max_output_tokens,
            thinking_budget=s.observer_thinking_budget,
            source_messages=backlog.messages,
            source_observations=context_text,
        )
        usages: list[CallUsage] = []
        try:
            # An unusable answer (empty, a loop, a refusal, prose) gets one fresh sample, then counts as a failed call
            # (spec §13.6): it never becomes memory.
            problem = ''
            for attempt in range(2):
                response = self.rt.router.generate(
                    s.observer_model, request, input_tokens=backlog.tokens, deadline=deadline
                )
                usages.append(CallUsage.of(response))
                parsed = obs.parse_observer_output(response.text)
                if not obs.is_unusable_observer_output(parsed):
                    return ObserverOutcome(observed=[ThreadObservation(backlog, parsed, total_usage(usages))])
                problem = obs.observer_output_problem(parsed) or 'the answer has neither tags nor observation lines'
                logger.warning('observer output unusable', extra={'attempt': attempt + 1, 'problem': problem})
            raise ModelOutputError(f'the Observer answered twice without usable observations: {problem}')
        except (ModelError, DeadlineExceededError) as exc:
            logger.warning('observation failed', extra={'thread_id': backlog.thread_id, 'error': str(exc)})
            return ObserverOutcome(failed=[ThreadFailure(backlog, exc, _reason(exc), total_usage(usages))])

    # -- several threads (resource scope) ------------------------------------------------------------------------
    def _multi(
        self, record: OMRecord, batch: list[Backlog], deadline: float, previous: str | None, usages: list[CallUsage]
    ) -> dict[str, obs.ParsedObservations]:
        """The batch's answer per real thread id, for the threads it covers (a section each). Raises ModelError.
        Each answer's usage is added to `usages` (also when the batch then fails)."""
        s = self.rt.settings
        assert isinstance(self.strategy, ResourceStrategy)
        codec = self.strategy.codec(record.resource_id)
        context_text, truncated = self._context(record, previous)
        inputs: list[obs.ThreadInput] = []
        image_index = file_index = 1
        for backlog in batch:
            thread = self.rt.store.get_thread(record.resource_id, backlog.thread_id)
            transcript = obs.format_messages_for_observer(
                list(backlog.messages),
                timezone=record.observed_timezone,
                count=self.rt.counter.count_string,
                first_image_index=image_index,
                first_file_index=file_index,
                temporal_gap_s=s.temporal_gap_s,
            )
            image_index += sum(1 for a in transcript.attachments if a.kind == 'image')
            file_index += sum(1 for a in transcript.attachments if a.kind == 'file')
            inputs.append(
                (
                    codec.shown(backlog.thread_id),
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
        for attempt in range(2):
            response = self.rt.router.generate(
                s.observer_model, request, input_tokens=sum(b.tokens for b in batch), deadline=deadline
            )
            usages.append(CallUsage.of(response))
            parsed = obs.parse_multi_thread_observer_output(response.text, shown_ids)
            if len(batch) == 1 and not parsed[shown_ids[0]].covered and not parsed[shown_ids[0]].degenerate:
                # One conversation in, so an answer without sections can only be about it.
                alone = obs.parse_observer_output(response.text)
                if not obs.is_unusable_observer_output(alone):
                    parsed = {shown_ids[0]: alone}
            if not any(p.degenerate for p in parsed.values()):
                by_real = {b.thread_id: parsed[codec.shown(b.thread_id)] for b in batch}
                # A section that is not an observation log covers nothing: that thread is asked about alone.
                return {tid: p for tid, p in by_real.items() if p.covered and obs.observer_output_problem(p) is None}
            logger.warning('observer output degenerate', extra={'attempt': attempt + 1})
        raise ModelOutputError('the Observer produced degenerate output after a retry')

    # -- shared pieces ---------------------------------------------------------------------------------------------
    def _context(self, record: OMRecord, previous: str | None) -> tuple[str, bool]:
        text, truncated = obs.prepare_observer_context(
            record.active_observations if previous is None else previous,
            self.rt.settings.previous_observer_tokens,
            self.rt.counter.count_string,
            buffered_reflection=record.buffered_reflection if previous is None else None,
            reflected_line_count=record.reflected_line_count if previous is None else None,
        )
        # The Observer needs the observations, not the group tags recall uses (and must not echo them back).
        return ctx.strip_group_tags(text), truncated

    def _inline_attachments(self, transcript: obs.ObserverTranscript, resource_id: str) -> list[InlineBlob]:
        """Image bytes the Observer can see: inline data, or stored `s3://` images read back, within a size cap."""
        blobs: list[InlineBlob] = []
        budget = MAX_INLINE_ATTACHMENT_BYTES
        allowed = self.rt.settings.observe_attachments
        for ref in transcript.attachments:
            if ref.kind != 'image' or not attachment_observed(ref.media_type, allowed):
                continue  # the placeholder alone tells the Observer an attachment was there
            data: bytes | None = None
            if ref.data:
                try:
                    data = base64.b64decode(ref.data, validate=False)
                except (binascii.Error, ValueError):
                    data = None
            elif ref.url and ref.url.startswith('s3://') and self.rt.blobs is not None:
                data = self.rt.blobs.read(ref.url, max_bytes=budget, resource_id=resource_id)
            if data is None or len(data) > budget:
                continue  # the placeholder alone tells the Observer an image was there
            budget -= len(data)
            blobs.append(InlineBlob(mime_type=ref.media_type or 'image/png', data=data))
        return blobs


def attachment_observed(media_type: str | None, allowed: bool | tuple[str, ...]) -> bool:
    """Is an attachment of `media_type` sent to the Observer (`observation.observeAttachments`)?

    Patterns match case-insensitively: exact (`application/pdf`), a whole type (`image/*`) or everything (`*`); an
    attachment whose type is unknown matches only `*`. What is not sent keeps its placeholder in the transcript, and
    stays in the thread for the Actor.
    """
    if isinstance(allowed, bool):
        return allowed
    kind = (media_type or '').strip().lower()
    for pattern in allowed:
        if pattern == '*' or pattern == kind or (pattern.endswith('/*') and kind.startswith(pattern[:-1])):
            return True
    return False


def _reason(exc: Exception) -> FailureReason:
    if isinstance(exc, DeadlineExceededError):
        return 'timeout'
    if isinstance(exc, ModelOutputError):
        return 'invalid_output'
    if isinstance(exc, ModelUnavailableError):
        return 'model_unavailable'
    return 'error'


# ---------------------------------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------------------------------
class ObservationPipeline:
    """Observe backlogs and commit what the Observer covered (see module docstring)."""

    def __init__(self, rt: Runtime, strategy: ThreadStrategy | ResourceStrategy) -> None:
        self.rt = rt
        self.strategy = strategy
        self.call = ObserverCall(rt, strategy)

    # -- observe now -----------------------------------------------------------------------------------------------
    def observe(
        self,
        record: OMRecord,
        backlogs: Sequence[Backlog],
        deadline: float,
        parts: CycleParts,
        *,
        can_defer: bool = True,
        due_at: int | None = None,
    ) -> OMRecord:
        """Observe `backlogs` now; returns the freshest record.

        With background work available (`can_defer`), a cycle that would overrun the request's time budget is handed
        to the worker: the answer carries a failed part whose reason is `deferred` (API Gateway stops integrations at
        about 29 s, and a real Observer call can take longer).

        When another holder has the `observing` lease: without `due_at` (background jobs) nothing happens here. With
        `due_at` (a step that must not hand the Actor an oversized window), the step waits for the holder, bounded by
        its budget; once the holder is done it observes what is left if that is still at least `due_at` tokens. If the
        budget runs out first, a failed part with reason `busy` says so: the messages stay in context, unobserved.
        """
        rt = self.rt
        while True:
            record, busy = self._observe_once(record, backlogs, deadline, parts, can_defer=can_defer)
            if not busy or due_at is None:
                return record
            held = record.observing
            fresh = rt.wait_for_release(record, 'observing', deadline, reserve_s=MIN_SYNC_OBSERVATION_S)
            if fresh is None:
                tokens = sum(b.tokens for b in backlogs)
                owner = held.owner if held is not None else 'another worker'
                parts.add(
                    rt.failed_part(
                        None,
                        'observation',
                        tokens,
                        f'another worker ({owner}) is observing this memory and did not finish within this request; '
                        'these messages stay in context and are observed when it finishes',
                        record.id,
                        backlogs[0].thread_id if backlogs else '',
                        reason='busy',
                    )
                )
                return rt.writer.fresh(record)
            record = fresh
            backlogs = [rest for b in backlogs if (rest := b.after(fresh.cursor(b.thread_id), rt))]
            if sum(b.tokens for b in backlogs) < due_at:
                return fresh

    def _observe_once(
        self, record: OMRecord, backlogs: Sequence[Backlog], deadline: float, parts: CycleParts, *, can_defer: bool
    ) -> tuple[OMRecord, bool]:
        """One cycle; returns the freshest record and whether another holder had the lease (nothing was done)."""
        rt = self.rt
        # A call still waiting for its result is not observed yet; imported history has no result to wait for.
        ready = [b for b in backlogs if b.messages and (b.import_id or not has_pending_tool_call(b.messages))]
        if not ready:
            return record, False
        cycle = rt.start_cycle()
        anchor = ready[0].thread_id
        tokens = sum(b.tokens for b in ready)
        can_defer = can_defer and rt.work is not None
        if can_defer and rt.left(deadline) < MIN_SYNC_OBSERVATION_S:
            self._defer(record, anchor, cycle, tokens, parts, 'no time left in this request')
            return record, False

        def needed(cur: OMRecord) -> bool:
            return any(still_needed(b, cur) for b in ready)

        leased = rt.writer.take_lease(record, 'observing', cycle.cycle_id, needed)
        if leased is None:
            fresh = rt.writer.fresh(record)
            busy = lease_active(fresh.observing, rt.clock.now()) and needed(fresh)
            return fresh, busy
        # Re-check after winning: a holder that finished meanwhile may have observed part of these backlogs.
        ready = [
            trimmed
            for b in ready
            if (trimmed := b.after(leased.cursor(b.thread_id), rt)) is not None and still_needed(trimmed, leased)
        ]
        if not ready:  # pragma: no cover - the lease is only taken while something is left
            return rt.writer.release_lease(leased, 'observing', cycle.cycle_id), False
        thread_ids = tuple(b.thread_id for b in ready)
        for b in ready:
            parts.add(rt.start_part(cycle, 'observation', b.tokens, leased.id, b.thread_id, thread_ids))
        try:
            with rt.writer.holding(leased, 'observing', cycle.cycle_id):
                outcome = self.call.run(leased, ready, deadline)
        except Exception:
            # Anything but a model failure (e.g. reading an attachment back failed): free the record, then report.
            rt.writer.release_quietly(leased, 'observing', cycle.cycle_id)
            raise
        committed = self._commit(leased, cycle.cycle_id, outcome.observed) if outcome.observed else None
        if committed is None:
            # Nothing was written (every call failed, or the lease was taken over): every backlog stays unobserved.
            lost = LeaseLostError()
            outcome.failed.extend(ThreadFailure(o.backlog, lost, 'conflict') for o in outcome.observed)
            outcome.observed = []
            committed = rt.writer.release_lease(leased, 'observing', cycle.cycle_id)
        timed_out = [f for f in outcome.failed if f.reason == 'timeout']
        deferred = (
            can_defer
            and bool(timed_out)
            and rt.submit(Job('observe', record.resource_id, timed_out[0].backlog.thread_id, record.key, 'deferred'))
        )
        for failure in outcome.failed:
            error: Exception | str = failure.error
            reason: FailureReason = failure.reason
            if deferred and failure.reason == 'timeout':
                error, reason = f'observation deferred to the background worker ({failure.error})', 'deferred'
            parts.add(
                rt.failed_part(
                    cycle,
                    'observation',
                    failure.backlog.tokens,
                    error,
                    leased.id,
                    failure.backlog.thread_id,
                    reason=reason,
                    usage=failure.usage,
                )
            )
        if outcome.observed:
            self.strategy.after_commit(committed, outcome.observed)
            for item in outcome.observed:
                self._after_observed(committed, cycle, item, parts)
        return committed, False

    def _commit(self, leased: OMRecord, owner: str, observed: Sequence[ThreadObservation]) -> OMRecord | None:
        """Write what the Observer covered while the lease is still `owner`'s; cursors move for covered threads only."""
        rt = self.rt
        ordered = sorted(observed, key=lambda o: time_of(o.backlog.messages[0]))
        now = rt.clock.now()

        def apply(current: OMRecord) -> OMRecord | None:
            held = current.observing
            if held is None or held.owner != owner:
                return None  # the lease was taken over: a stale holder never writes
            text = current.active_observations
            cursors = dict(current.cursors)
            groups = list(current.groups)
            chunks = current.buffered_chunks
            last_observed = current.last_observed_at
            observed_tokens = 0
            only_imports = all(o.backlog.import_id is not None for o in ordered)
            pending_tokens = current.pending_message_tokens if only_imports else 0
            for item in ordered:
                backlog = item.backlog
                if not still_needed(backlog, current.model_copy(update={'cursors': cursors})):
                    continue  # observed (or imported) meanwhile
                text = self.strategy.compose(text, item, current)
                if backlog.import_id is not None:
                    # Imported messages are not in the thread: no cursor moves, and nothing pending is observed.
                    groups.append(
                        ObservationGroup(
                            id=backlog.import_id,
                            thread_id=backlog.thread_id,
                            start_id=backlog.messages[0].id,
                            end_id=backlog.messages[-1].id,
                            start_seq=0,
                            end_seq=0,
                            created_at=now,
                            kind='import',
                        )
                    )
                    observed_tokens += backlog.tokens
                    continue
                cursors[backlog.thread_id] = backlog.last_seq
                groups.append(
                    ObservationGroup(
                        id=ctx.group_id_for(backlog.first_seq),
                        thread_id=backlog.thread_id,
                        start_id=backlog.messages[0].id,
                        end_id=backlog.messages[-1].id,
                        start_seq=backlog.first_seq,
                        end_seq=backlog.last_seq,
                        created_at=now,
                    )
                )
                chunks = supersede_chunks(chunks, backlog.thread_id, backlog.last_seq)
                last_observed = max(last_observed, backlog.observed_at) if last_observed else backlog.observed_at
                observed_tokens += backlog.tokens
            if observed_tokens == 0:
                return None
            return current.model_copy(
                update={
                    'active_observations': text,
                    'observation_tokens': rt.counter.count_observations(text),
                    'total_tokens_observed': current.total_tokens_observed + observed_tokens,
                    'cursors': cursors,
                    'last_observed_at': last_observed,
                    'groups': tuple(groups),
                    'observing': None,
                    'pending_message_tokens': pending_tokens,
                    'buffered_chunks': chunks,
                    'last_buffered_at_tokens': 0
                    if chunks != current.buffered_chunks
                    else current.last_buffered_at_tokens,
                }
            )

        try:
            return rt.writer.commit(leased, apply)
        except VersionConflictError:
            return None

    def _after_observed(self, record: OMRecord, cycle: Cycle, item: ThreadObservation, parts: CycleParts) -> None:
        parsed = item.parsed
        notes = answer_notes(parsed.observations)
        # Imported history is older than the conversation: its task, suggestion and title are not the thread's now.
        thread = (
            self.rt.store.get_thread(record.resource_id, item.backlog.thread_id)
            if item.backlog.import_id is None
            else None
        )
        if thread is not None:
            update_thread_hints(
                self.rt,
                thread,
                current_task=parsed.current_task,
                suggested_response=parsed.suggested_response,
                title=parsed.thread_title,
                cycle_id=cycle.cycle_id,
                parts=parts,
                replace_hints=True,
            )
        parts.add(
            ObservationEnd(
                cycle_id=cycle.cycle_id,
                operation_type='observation',
                completed_at=self.rt.clock.now(),
                duration_ms=self.rt.elapsed_ms(cycle),
                tokens_observed=item.backlog.tokens,
                observation_tokens=self.rt.counter.count_observations(parsed.observations),
                observations=parsed.observations,
                current_task=parsed.current_task,
                suggested_response=parsed.suggested_response,
                record_id=record.id,
                thread_id=item.backlog.thread_id,
                notes=notes or None,
                usage=item.usage,
            )
        )
        if notes:
            self.rt.remember_notes(
                record.resource_id, item.backlog.thread_id, 'observation', notes, parsed.observations[:300]
            )

    def _defer(self, record: OMRecord, thread_id: str, cycle: Cycle, tokens: int, parts: CycleParts, why: str) -> None:
        reason: FailureReason
        if self.rt.submit(Job('observe', record.resource_id, thread_id, record.key, 'deferred')):
            error, reason = f'observation deferred to the background worker ({why})', 'deferred'
        else:
            # Not queued either: the messages stay unobserved and a later step or the sweeper picks them up.
            error, reason = f'observation postponed: {why}; the work queue is unavailable', 'error'
        parts.add(self.rt.failed_part(cycle, 'observation', tokens, error, record.id, thread_id, reason=reason))

    # -- buffer a slice ----------------------------------------------------------------------------------------------
    def buffer_slice(
        self, record: OMRecord, backlog: Backlog, deadline: float, *, cycle_id: str, previous: str
    ) -> tuple[BufferedChunk | ThreadFailure | None, CallUsage | None]:
        """Observe one slice for async buffering (no commit here): the chunk to store, the failure, or None when the
        Observer found nothing worth keeping, with what the calls cost. `previous` is what the Observer sees as
        already known (the active log plus the chunks buffered before this one), so the new chunk does not repeat
        it."""
        rt = self.rt
        outcome = self.call.run(record, [backlog], deadline, previous=previous)
        if outcome.failed:
            return outcome.failed[0], outcome.failed[0].usage
        parsed = outcome.observed[0].parsed
        usage = outcome.observed[0].usage
        text = ctx.strip_group_tags(parsed.observations).strip()
        if not text:
            return None, usage
        # (In retrieval mode activation wraps the chunk in its observation group.)
        chunk = BufferedChunk(
            id=f'ombuf-{rt.new_id()}',
            cycle_id=cycle_id,
            thread_id=backlog.thread_id,
            observations=text,
            token_count=rt.counter.count_observations(text),
            message_ids=tuple(m.id for m in backlog.messages),
            message_tokens=backlog.tokens,
            start_seq=backlog.first_seq,
            end_seq=backlog.last_seq,
            last_observed_at=backlog.observed_at,
            created_at=rt.clock.now(),
            current_task=parsed.current_task,
            suggested_response=parsed.suggested_response,
            thread_title=parsed.thread_title,
        )
        return chunk, usage


class LeaseLostError(Exception):
    """The observing lease was taken over (or every commit attempt lost its race) before the commit."""

    def __init__(self) -> None:
        super().__init__('the observing lease was lost before commit; another writer won')


def supersede_chunks(
    chunks: tuple[BufferedChunk, ...], thread_id: str, observed_through: int
) -> tuple[BufferedChunk, ...]:
    """Buffered chunks of `thread_id` that an observation through `observed_through` did not make obsolete."""
    mine = [c for c in chunks if c.thread_id == thread_id]
    if not mine:
        return chunks
    others = tuple(c for c in chunks if c.thread_id != thread_id)
    return (*others, *live_chunks(mine, observed_through))


def update_thread_hints(
    rt: Runtime,
    thread: Thread,
    *,
    current_task: str | None,
    suggested_response: str | None,
    title: str | None,
    cycle_id: str,
    parts: CycleParts,
    replace_hints: bool,
) -> Thread:
    """Write the continuation hints (and a proposed title, when `observation.threadTitle` is on) to the thread.

    `replace_hints`: the latest output replaces the hints, "nothing" included (stale hints must disappear, spec
    §2.4); otherwise hints are written only when there are some (activation keeps the thread's own).
    """
    update: dict[str, object] = {}
    if replace_hints or current_task or suggested_response:
        update = {'current_task': current_task, 'suggested_response': suggested_response}
    clean = (title or '').strip()
    wants_title = rt.settings.thread_title and len(clean) >= 3
    if not update and not wants_title:
        return thread
    # The thread as it is now (a client may have renamed it while the Observer ran): the write replaces it whole, and
    # a title a client set (pinned) is never replaced.
    thread = rt.store.get_thread(thread.resource_id, thread.id) or thread
    renamed = wants_title and clean != (thread.title or '') and not thread.title_pinned
    if renamed:
        update['title'] = clean
    if not update:
        return thread
    try:
        updated = rt.store.update_thread(thread.model_copy(update={**update, 'updated_at': rt.clock.now()}))
    except Exception:  # noqa: BLE001 - hints are advisory; the observation is already committed
        logger.exception('could not update thread hints', extra={'thread_id': thread.id})
        return thread
    if renamed:
        parts.add(
            ThreadUpdate(
                cycle_id=cycle_id,
                thread_id=thread.id,
                old_title=thread.title,
                new_title=clean,
                timestamp=rt.clock.now(),
            )
        )
    return updated
