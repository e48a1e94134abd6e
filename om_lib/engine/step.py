"""The step and the turn: what happens around every Actor call (reference spec §7, §8).

`prepare` saves the step's new input first, then loads only the unobserved messages (by cursor), observes when they
pass `messageTokens`, reflects when observations pass `observationTokens`, and returns what the Actor should see.
`complete_turn` saves the turn's outputs and queues background work that is due, so the next step finds it done.

Modes:
- **synchronous** (`observation.bufferTokens: false`, or no work queue): the step at the threshold observes before
  it answers, and reflects the same way, within the request's time budget; a cycle the budget cannot hold goes to the
  worker (`deferred`). A background run that is still going is waited for (bounded by the budget), so the Actor is
  never handed an oversized window because of it;
- **buffered** (thread scope, the default): background chunks activate at the threshold with no model call; the step
  observes synchronously only past `blockAfter` (`om_lib/observation/buffered.py`).

A failing model never loses a message: the step still answers, with a `data-om-observation-failed` part, and the
backlog is observed on a later step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from om_lib.context.idle import ActivationTrigger, IdleActivation, activation_trigger
from om_lib.engine import actor_context as actor
from om_lib.engine.rooms import MemoryRooms
from om_lib.ids import check_id
from om_lib.messages import Message, now_of, time_of
from om_lib.observation.background import deliver_background_parts
from om_lib.observation.observation import MIN_SYNC_OBSERVATION_S, backlog_of
from om_lib.parts import CycleParts
from om_lib.ports import AppendResult
from om_lib.records import OMRecord, Thread
from om_lib.reflection.reflection import MIN_SYNC_REFLECTION_S
from om_lib.runtime.record_writer import lease_active
from om_lib.runtime.runtime import before_step_input, has_pending_tool_call
from om_lib.work import Job

logger = logging.getLogger(__name__)

# How far back a step looks for the thread's last reply when none is unobserved (idle time is measured from it).
LAST_REPLY_LOOKBACK = 20


@dataclass
class StepResult:
    """What the Actor should see for this step."""

    thread_id: str
    resource_id: str
    system: str
    messages: list[Message]
    parts: CycleParts
    record: OMRecord | None
    saved_ids: list[str] = field(default_factory=list)


@dataclass
class TurnResult:
    """What `complete_turn` saved, and what it queued."""

    saved: list[Message]
    parts: CycleParts
    scheduled: list[str] = field(default_factory=list)


class Steps(MemoryRooms):
    """Steps and turns over the pipeline, reflection, buffering and (resource scope) the resource view."""

    # -- the step ------------------------------------------------------------------------------------------------------
    def prepare(
        self,
        resource_id: str,
        thread_id: str,
        new_messages: Sequence[Message],
        *,
        step_number: int = 0,
        parts: CycleParts | None = None,
        actor_model: str | None = None,
    ) -> StepResult:
        """Save the step's new input, update memory when due, and return the Actor's context.

        `parts`: the collector to report into (with its live sink, if any); a new one by default.
        `actor_model`: the model the caller's Actor runs for this step (`provider/model`), when it says: it decides
        the `"auto"` idle time, and a change of it activates what is buffered (om_lib/context/idle.py).
        """
        rt = self.rt
        deadline = rt.deadline()
        check_ids(resource_id, thread_id)
        now = rt.clock.now()
        enabled = rt.settings.enabled
        incoming = [rt.counter.with_token_counts(m) for m in actor.drop_engine_text(new_messages)]
        # Thread scope: the store hands back the OM head with the append (one call instead of two per step).
        # Resource scope: the append lists the thread among the resource's pending ones (same write).
        appended = rt.store.append_messages(
            resource_id,
            thread_id,
            incoming,
            now=now,
            include_record=rt.settings.scope == 'thread',
            mark_pending=self.resource is not None and enabled,
        )
        parts = CycleParts() if parts is None else parts
        saved = list(appended.created_ids)
        if not enabled:
            return StepResult(thread_id, resource_id, '', self._last_messages(appended), parts, None, saved)
        try:
            if self.resource is not None:
                result = self._resource_step(appended, deadline, step_number, parts, cycle_start=now)
            else:
                result = self._thread_step(appended, deadline, step_number, parts, actor_model)
        except Exception as exc:  # noqa: BLE001 - the input is saved: trouble goes into the 200 answer (CONTRACT §2)
            logger.exception('memory update failed after the step was saved', extra={'thread_id': thread_id})
            parts.add(rt.failed_part(None, 'observation', 0, exc, '', thread_id))
            raw = [m for m in appended.messages if m.role != 'system']
            result = StepResult(thread_id, resource_id, '', raw, parts, None, saved)
        rt.remember_failures(resource_id, thread_id, parts)
        return result

    def _last_messages(self, appended: AppendResult) -> list[Message]:
        """Without observational memory: the thread's `lastMessages` newest messages (seed 003), and always the
        step's own input (`lastMessages: false` loads no history at all)."""
        rt = self.rt
        limit = rt.settings.last_messages
        thread = appended.thread
        recent: list[Message] = []
        if limit > 0:
            page = rt.store.list_messages(thread.resource_id, thread.id, limit=limit, newest_first=True)
            recent = list(reversed(page.messages))
        shown = {m.id for m in recent}
        own = [m for m in appended.messages if m.id not in shown and m.role != 'system']
        return sorted([*recent, *own], key=lambda m: m.seq or 0)

    def _thread_step(
        self,
        appended: AppendResult,
        deadline: float,
        step_number: int,
        parts: CycleParts,
        actor_model: str | None = None,
    ) -> StepResult:
        rt = self.rt
        thread = appended.thread
        resource_id, thread_id = thread.resource_id, thread.id
        record = appended.record if appended.record_included and appended.record is not None else None
        record = record or rt.writer.get_or_create('thread', resource_id, thread_id)
        unobserved = rt.load_after(resource_id, thread_id, record.cursor(thread_id))
        threshold = rt.message_threshold(record)
        if parts.live:  # a live listener sees the windows as the step found them, before any memory work
            shown = actor.visible_messages(rt, record, unobserved, appended.messages)
            parts.preview(actor.status_part(rt, record, shown, thread_id, step_number))
        reflection_trigger = None
        if self.buffering is not None:
            s = rt.settings
            trigger = self._idle_trigger(s.observation_idle, record, unobserved, appended, actor_model)
            reflection_trigger = self._idle_trigger(s.reflection_idle, record, unobserved, appended, actor_model)
            record = self._remember_actor_model(record, actor_model)
            record, thread, unobserved = self.buffering.step(
                record, thread, unobserved, deadline, parts, step_input=appended.messages, trigger=trigger
            )
        else:
            record = deliver_background_parts(rt, record, parts)
            # Due once what came before the new input reaches the threshold: the input itself cannot be observed in
            # this step (the Actor answers it), and observing a smaller slice early would only mean more calls.
            observable = before_step_input(unobserved, appended.messages)
            due = rt.counter.count_messages(observable) >= threshold and not has_pending_tool_call(unobserved)
            if due:
                backlog = backlog_of(thread_id, observable, rt)
                record = self.pipeline.observe(record, [backlog], deadline, parts, due_at=threshold)
                thread = rt.store.get_thread(resource_id, thread_id) or thread
                unobserved = rt.load_after(resource_id, thread_id, record.cursor(thread_id))
        record = self._reflect(record, thread_id, deadline, parts, trigger=reflection_trigger)
        # Past its bound (reflection failed, or cannot keep up), the log's oldest groups are archived: no model call.
        record = self.archive.enforce(record, thread_id, parts)
        messages = actor.visible_messages(rt, record, unobserved, appended.messages)
        parts.add(actor.status_part(rt, record, messages, thread_id, step_number))
        system = actor.system_text(rt, record, thread, now=now_of(appended.messages, rt.clock.now()))
        return StepResult(thread_id, resource_id, system, messages, parts, record, list(appended.created_ids))

    def _resource_step(
        self, appended: AppendResult, deadline: float, step_number: int, parts: CycleParts, *, cycle_start: datetime
    ) -> StepResult:
        """`cycle_start`: when this step began (before its own input was saved); reflection waits only for messages
        older than that."""
        rt = self.rt
        view = self.resource
        assert view is not None
        thread: Thread = appended.thread
        resource_id, thread_id = thread.resource_id, thread.id
        record = rt.writer.get_or_create('resource', resource_id, thread_id)
        record = deliver_background_parts(rt, record, parts)
        snap = view.snapshot(record, thread_id)
        threshold = rt.message_threshold(record)
        if parts.live:  # a live listener sees the windows as the step found them, before any memory work
            shown = actor.visible_messages(rt, record, snap.current.messages, appended.messages)
            others = sum(b.tokens for b in snap.others)
            parts.preview(actor.status_part(rt, record, shown, thread_id, step_number, other_tokens=others))
        # This thread's own new input stays out of this cycle (it is observed with the turn that answers it), and
        # does not count towards it either (as in a thread-scope step).
        own = before_step_input(snap.current.messages, appended.messages)
        backlogs = [b for t, b in snap.backlogs.items() if t != thread_id]
        if own:
            backlogs.append(backlog_of(thread_id, own, rt))
        observable = sum(b.tokens for b in backlogs)
        if observable >= threshold and not has_pending_tool_call(snap.current.messages):
            chosen = view.strategy.select(backlogs, threshold)
            if chosen:
                record = self.pipeline.observe(record, chosen, deadline, parts, due_at=threshold)
                snap = view.snapshot(record, thread_id)
                thread = rt.store.get_thread(resource_id, thread_id) or thread
        if self.reflection.due(record) and view.reflection_may_start(resource_id, cycle_start):
            record = self._reflect(record, thread_id, deadline, parts)
        record = self.archive.enforce(record, thread_id, parts)
        messages = actor.visible_messages(rt, record, snap.current.messages, appended.messages)
        # The status counts every thread's unobserved tokens: this thread's messages and the other threads' backlogs.
        others = sum(b.tokens for b in snap.others)
        parts.add(actor.status_part(rt, record, messages, thread_id, step_number, other_tokens=others))
        now = now_of(appended.messages, rt.clock.now())
        system = actor.system_text(rt, record, thread, now=now, other_conversations=snap.blocks)
        return StepResult(thread_id, resource_id, system, messages, parts, record, list(appended.created_ids))

    def _reflect(
        self,
        record: OMRecord,
        thread_id: str,
        deadline: float,
        parts: CycleParts,
        *,
        trigger: ActivationTrigger | None = None,
    ) -> OMRecord:
        """Reflect when due: buffered reflection when it is on; else within this request (waiting for a running
        reflection, bounded by the budget), or through the workflow when the budget cannot hold it."""
        rt = self.rt
        if self.reflection.buffered:
            return self.reflection.buffered_step(record, thread_id, deadline, parts, trigger=trigger)
        if not self._reflection_pending(record):
            return record
        for _ in range(2):
            if rt.left(deadline) < MIN_SYNC_REFLECTION_S:
                if self.reflection.due(record):
                    rt.submit(Job('reflect', record.resource_id, thread_id, record.key, 'threshold'))
                return record
            outcome = self.reflection.reflect_now(record, thread_id, deadline, parts)
            if outcome.status != 'busy':
                return outcome.record
            # Another holder (the workflow, a concurrent step) is reflecting this very log: wait for its result.
            record, released = self.reflection.wait_for_other(outcome, thread_id, deadline, parts)
            if not released:
                return record
            if not self._reflection_pending(record):
                return record
        return record

    def _idle_trigger(
        self,
        setting: IdleActivation,
        record: OMRecord,
        unobserved: Sequence[Message],
        appended: AppendResult,
        actor_model: str | None,
    ) -> ActivationTrigger | None:
        """Does idle time or a model change call for activating what is buffered now (om_lib/context/idle.py)?"""
        if not setting.enabled or not (record.buffered_chunks or record.buffered_reflection):
            return None
        rt = self.rt
        own = {m.id for m in appended.messages}
        replies = [m for m in unobserved if m.role == 'assistant' and m.id not in own]
        last_reply = replies[-1] if replies else self._last_reply_before(appended)
        return activation_trigger(
            setting,
            now=now_of(appended.messages, rt.clock.now()),
            last_reply_at=time_of(last_reply) if last_reply is not None else None,
            current_model=actor_model,
            previous_model=record.actor_model,
        )

    def _last_reply_before(self, appended: AppendResult) -> Message | None:
        """The thread's newest assistant message before the step's input (a few messages back, at most)."""
        seqs = [m.seq for m in appended.messages if m.seq]
        before = min(seqs) if seqs else None
        thread = appended.thread
        page = self.rt.store.list_messages(
            thread.resource_id, thread.id, before_seq=before, limit=LAST_REPLY_LOOKBACK, newest_first=True
        )
        return next((m for m in page.messages if m.role == 'assistant'), None)

    def _remember_actor_model(self, record: OMRecord, actor_model: str | None) -> OMRecord:
        """Keep the Actor model this step said it runs, when it changed (only where a change activates anything)."""
        s = self.rt.settings
        watching = s.observation_idle.on_provider_change or s.reflection_idle.on_provider_change
        if not watching or not actor_model or actor_model == record.actor_model:
            return record
        # Best effort: a lost write means the next step notices the same change again.
        return (
            self.rt.writer.try_commit(record, lambda cur: cur.model_copy(update={'actor_model': actor_model})) or record
        )

    def _reflection_pending(self, record: OMRecord) -> bool:
        """Over the threshold with a reflection due, or one running elsewhere that this step should wait for."""
        over = record.observation_tokens > self.rt.settings.observation_tokens
        return self.reflection.due(record) or (over and lease_active(record.reflecting, self.rt.clock.now()))

    # -- the turn ------------------------------------------------------------------------------------------------------
    def complete_turn(
        self, resource_id: str, thread_id: str, outputs: Sequence[Message], *, parts: CycleParts | None = None
    ) -> TurnResult:
        """Save the turn's outputs (assistant and tool messages). Idempotent per message id.

        With background work available, a due observation or reflection is queued now, so the next step finds it
        done instead of waiting for it. `parts`: the collector to report into (a new one by default).
        """
        rt = self.rt
        check_ids(resource_id, thread_id)
        enabled = rt.settings.enabled
        incoming = [rt.counter.with_token_counts(m) for m in actor.drop_engine_text(outputs)]
        appended = rt.store.append_messages(
            resource_id, thread_id, incoming, now=rt.clock.now(), mark_pending=self.resource is not None and enabled
        )
        parts = CycleParts() if parts is None else parts
        scheduled: list[str] = []
        if rt.work is None or not enabled:
            return TurnResult(list(appended.messages), parts, scheduled)
        # A thread saved through turns only is observed too (its record is created here, once).
        record = rt.writer.get_or_create(rt.settings.scope, resource_id, thread_id)
        unobserved = rt.load_after(resource_id, thread_id, record.cursor(thread_id))
        pending = rt.counter.count_messages(unobserved)
        if self.resource is not None:
            pending = self.resource.snapshot(record, thread_id).pending
        due_at = rt.message_threshold(record)
        if self.buffering is not None:
            # Buffering: the turn queues the next slice. A full background observation is only for a backlog past
            # blockAfter that activation will not cover (the next step would otherwise block on it).
            record, queued = self.buffering.maybe_enqueue(record, thread_id, unobserved, pending, parts)
            if queued:
                scheduled.append('buffer')
            due_at = int(rt.settings.block_after or due_at)
            if record.buffered_chunks:
                due_at = max(due_at, pending + 1)
        if (
            unobserved
            and pending >= due_at
            and not has_pending_tool_call(unobserved)
            and not lease_active(record.observing, rt.clock.now())
            and rt.submit(Job('observe', resource_id, thread_id, record.key, 'threshold'))
        ):
            scheduled.append('observe')
        if self.reflection.buffered:
            if self.reflection.start_buffered(record, thread_id, parts)[1]:
                scheduled.append('reflect')
        elif self.reflection.due(record) and rt.submit(Job('reflect', resource_id, thread_id, record.key, 'threshold')):
            scheduled.append('reflect')
        return TurnResult(list(appended.messages), parts, scheduled)


def check_ids(resource_id: str, thread_id: str) -> None:
    """Refuse ids outside the id grammar (om_lib/ids.py) before anything is written."""
    check_id('resourceId', resource_id)
    check_id('threadId', thread_id)


__all__ = ['MIN_SYNC_OBSERVATION_S', 'StepResult', 'Steps', 'TurnResult']
