"""Background work: the worker's jobs, the scheduled sweep, and the operations a client runs on demand.

Jobs are idempotent: each re-reads the record and does nothing when the work is no longer needed, so a redelivered
or duplicated job is harmless. They call the same observation pipeline and reflection path as the step.

On demand (`POST /threads/{id}/memory/observe | reflect | buffer`): observe now (the thread's unobserved messages, or
messages imported from elsewhere, observed without being stored), reflect now, buffer now. Each is idempotent (a
second call finds nothing left to do), waits for another holder of the lease within the request's budget, and answers
with the parts it made.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import timedelta

from om_lib.engine.rooms import MemoryRooms
from om_lib.errors import BufferingDisabledError, ImportTooLargeError, ThreadNotFoundError
from om_lib.history import titles
from om_lib.messages import Message, iso
from om_lib.observation import buffering as buf
from om_lib.observation.background import keep_background_parts
from om_lib.observation.observation import Backlog, backlog_of
from om_lib.parts import BufferingFailed, CycleParts
from om_lib.records import OMRecord, Thread, record_key
from om_lib.reflection.reflection import WORKER_BUDGET_S
from om_lib.runtime.record_writer import lease_active
from om_lib.runtime.runtime import has_pending_tool_call
from om_lib.work import Job

logger = logging.getLogger(__name__)

# The sweeper observes a thread once it has been quiet this long with unobserved messages (below the threshold too),
# so nothing said waits forever for the conversation to reach `messageTokens`.
QUIET_AFTER = timedelta(minutes=30)


class Jobs(MemoryRooms):
    """The worker's entry points over the pipeline, reflection, buffering and (resource scope) the resource view."""

    def run(self, job: Job, *, deadline: float | None = None) -> CycleParts:
        """Do one background job. Raises ThreadNotFoundError when its thread is gone (erased): a late job writes
        nothing."""
        parts = self._run(job, deadline)
        if not _workflow_in_process(job):  # the workflow's tasks remember their failures where they make them
            self.rt.remember_failures(job.resource_id, job.thread_id, parts)
        return parts

    def _run(self, job: Job, deadline: float | None) -> CycleParts:
        rt = self.rt
        limit = deadline if deadline is not None else rt.clock.monotonic() + WORKER_BUDGET_S
        if job.kind == 'title':
            titles.generate_title(rt, job.resource_id, job.thread_id, deadline=limit)
            return CycleParts()
        if job.kind == 'buffer':
            if self.buffering is None:
                return CycleParts()  # buffering was switched off since the job was queued; the threshold observes
            return self.buffering.run_buffer_job(job, limit)
        if _workflow_in_process(job):
            parts = CycleParts()
            self.reflection.run_in_process(job, limit, parts)
            return parts
        if job.kind == 'observe':
            record, parts = self.observe_now(job.resource_id, job.thread_id, deadline=limit, reflect=False)
        else:
            parts = CycleParts()
            found = rt.store.get_record(job.record_key)
            if found is None:
                return parts
            record = self.reflection.reflect_now(found, job.thread_id, limit, parts).record
        # The client hears about it on its next step (om_lib/observation/background.py).
        keep_background_parts(rt, record, parts)
        return parts

    def observe_now(
        self,
        resource_id: str,
        thread_id: str,
        *,
        deadline: float | None = None,
        reflect: bool = True,
        wait: bool = False,
    ) -> tuple[OMRecord, CycleParts]:
        """Observe every unobserved message of a thread (in resource scope: of every pending thread) regardless of the
        threshold: the worker's observe job, a client's `POST …/memory/observe`, tools and tests.

        `wait`: another holder of the lease is waited for (within the budget), then what it left is observed; without
        it a thread-scope job leaves the work to that holder. Raises ThreadNotFoundError when the thread is gone
        (erased), so a late job writes nothing.
        """
        rt = self.rt
        limit = deadline if deadline is not None else rt.deadline()
        parts = CycleParts()
        thread = rt.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        cycle_start = rt.clock.now()
        if self.resource is not None:
            record = rt.writer.get_or_create('resource', resource_id, thread_id)
            backlogs = self.resource.backlogs(record, resource_id, current=thread_id)
            if backlogs:
                chosen = self.resource.strategy.select(list(backlogs.values()), None)
                # Another holder's run is waited for, then what it left is observed: a job never just gives up.
                record = self.pipeline.observe(record, chosen, limit, parts, can_defer=False, due_at=1)
            if reflect and self.reflection.due(record) and self.resource.reflection_may_start(resource_id, cycle_start):
                record = self._reflect_or_hand_off(record, thread_id, limit, parts)
            return self.archive.enforce(record, thread_id, parts), parts
        record = rt.writer.get_or_create('thread', resource_id, thread_id)
        if self.buffering is not None:
            # What is buffered becomes active first (no model call); only the rest is observed.
            record = self.buffering.activate_everything(record, thread, parts)
        unobserved = rt.load_after(resource_id, thread_id, record.cursor(thread_id))
        if unobserved and not has_pending_tool_call(unobserved):
            record = self.pipeline.observe(
                record,
                [backlog_of(thread_id, unobserved, rt)],
                limit,
                parts,
                can_defer=False,
                due_at=1 if wait else None,
            )
        if reflect:
            record = self._reflect_or_hand_off(record, thread_id, limit, parts)
        return self.archive.enforce(record, thread_id, parts), parts

    # -- on demand ---------------------------------------------------------------------------------------------------
    def observe_imported(
        self, resource_id: str, thread_id: str, messages: Sequence[Message], *, deadline: float | None = None
    ) -> tuple[OMRecord, CycleParts]:
        """Observe messages imported from elsewhere (another system's history, with their own dates) into the thread's
        memory without storing them: no cursor moves, the thread's messages stay as they are, and the import is
        recorded as one `import` observation group, so the same import twice is observed once.

        One Observer call must hold them: more than `observation.messageTokens` is refused (ImportTooLargeError), to
        be sent in parts, oldest first. Raises ThreadNotFoundError for a thread that does not exist.
        """
        rt = self.rt
        limit = deadline if deadline is not None else rt.deadline()
        self._thread(resource_id, thread_id)
        kept = [rt.counter.with_token_counts(m) for m in messages if m.role != 'system']
        parts = CycleParts()
        if not kept:
            return rt.writer.get_or_create(rt.settings.scope, resource_id, thread_id), parts
        backlog = Backlog(thread_id, tuple(kept), rt.counter.count_messages(kept), import_id=import_id(kept))
        cap = rt.settings.max_message_threshold()
        if backlog.tokens > cap:
            raise ImportTooLargeError(
                f'the imported messages hold {backlog.tokens} tokens and one import may hold at most {cap} '
                '(observation.messageTokens, what one Observer call observes): send them in smaller parts, oldest '
                'first; nothing was observed'
            )
        cycle_start = rt.clock.now()
        record = rt.writer.get_or_create(rt.settings.scope, resource_id, thread_id)
        # A concurrent holder is waited for; the import is then made unless that holder made this very one.
        record = self.pipeline.observe(record, [backlog], limit, parts, can_defer=False, due_at=1)
        if self.resource is not None:
            if self.reflection.due(record) and self.resource.reflection_may_start(resource_id, cycle_start):
                record = self._reflect_or_hand_off(record, thread_id, limit, parts)
        else:
            record = self._reflect_or_hand_off(record, thread_id, limit, parts)
        return self.archive.enforce(record, thread_id, parts), parts

    def reflect_asked(
        self, resource_id: str, thread_id: str, *, deadline: float | None = None
    ) -> tuple[OMRecord | None, CycleParts]:
        """Reflect the memory now, below the threshold too (`POST …/memory/reflect`). A log a reflection made that has
        not grown since is left alone, so a retried request reflects once; a reflection another holder runs is waited
        for (within the budget) instead of run twice."""
        rt = self.rt
        limit = deadline if deadline is not None else rt.deadline()
        self._thread(resource_id, thread_id)
        parts = CycleParts()
        record = rt.store.get_record(record_key(rt.settings.scope, resource_id, thread_id))
        if record is None:
            return None, parts
        for _ in range(2):
            outcome = self.reflection.reflect_now(record, thread_id, limit, parts, asked=True)
            if outcome.status != 'busy':
                record = outcome.record
                break
            record, released = self.reflection.wait_for_other(outcome, thread_id, limit, parts)
            if not released:
                return record, parts
        return self.archive.enforce(record, thread_id, parts), parts

    def buffer_asked(
        self, resource_id: str, thread_id: str, *, deadline: float | None = None
    ) -> tuple[OMRecord, CycleParts]:
        """Buffer the thread's unbuffered messages now, as one chunk (`POST …/memory/buffer`): the Observer runs in
        this request and the chunk waits for activation like any other. Nothing unbuffered: nothing happens. A
        buffering job already running for the thread is not doubled: the answer says `busy`.

        Raises BufferingDisabledError where nothing is buffered (resource scope, `bufferTokens: false`, no work
        queue), ThreadNotFoundError for a thread that does not exist.
        """
        rt = self.rt
        if self.buffering is None:
            raise BufferingDisabledError(
                "this memory buffers nothing (scope: 'resource', observation.bufferTokens: false, or no work queue): "
                'observe instead (POST /threads/{threadId}/memory/observe)'
            )
        limit = deadline if deadline is not None else rt.deadline()
        self._thread(resource_id, thread_id)
        parts = CycleParts()
        record = rt.writer.get_or_create('thread', resource_id, thread_id)
        cursor = record.cursor(thread_id)
        start = buf.slice_start(cursor, buf.live_chunks(record.buffered_chunks, cursor))
        messages = [m for m in rt.load_after(resource_id, thread_id, start - 1) if m.role != 'system']
        if messages and has_pending_tool_call(messages):
            messages = messages[:-1]  # a call still waiting for its result is buffered with its result
        if not messages:
            return record, parts
        tokens = rt.counter.count_messages(messages)
        cycle = rt.start_cycle('buffer-obs-')
        if lease_active(record.buffering_observation, rt.clock.now()):
            parts.add(
                BufferingFailed(
                    cycle_id=cycle.cycle_id,
                    operation_type='observation',
                    failed_at=rt.clock.now(),
                    duration_ms=0,
                    tokens_attempted=tokens,
                    error='a buffering job is already running for this thread; its chunk is reported on a later step',
                    record_id=record.id,
                    thread_id=thread_id,
                    reason='busy',
                )
            )
            return record, parts
        job = Job(
            'buffer',
            resource_id,
            thread_id,
            record.key,
            'asked',
            start_seq=start,
            end_seq=messages[-1].seq or start,
            cycle_id=cycle.cycle_id,
        )
        parts.add(rt.buffering_start_part(cycle, 'observation', tokens, record.id, thread_id))
        parts.extend(self.buffering.run_buffer_job(job, limit, announce=False))
        return rt.writer.fresh(record), parts

    def _thread(self, resource_id: str, thread_id: str) -> Thread:
        thread = self.rt.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        return thread

    def _reflect_or_hand_off(self, record: OMRecord, thread_id: str, deadline: float, parts: CycleParts) -> OMRecord:
        if self.reflection.buffered:
            return self.reflection.buffered_step(record, thread_id, deadline, parts)
        if self.rt.work is None:
            return self.reflection.reflect_now(record, thread_id, deadline, parts).record
        if self.reflection.due(record):
            self.rt.submit(Job('reflect', record.resource_id, thread_id, record.key, 'threshold'))
        return record

    def sweep(self, *, quiet_for: timedelta = QUIET_AFTER, limit: int = 100) -> list[Job]:
        """The scheduled sweeper: start work for threads that went quiet with something left to do.

        A thread whose newest message is older than `quiet_for` and still has unobserved messages gets an
        observation job (a quiet thread is observed even below the threshold, so nothing said waits forever);
        a record over the reflection threshold gets a reflection job. Threads with nothing to do are cleared from
        the attention list; the others stay on it until a later sweep finds them done.
        """
        rt = self.rt
        if rt.work is None or not rt.settings.enabled:
            return []
        now = rt.clock.now()
        jobs: list[Job] = []
        for item in rt.store.list_attention(quiet_since=now - quiet_for, limit=limit):
            if rt.store.get_thread(item.resource_id, item.thread_id) is None:
                rt.store.clear_attention(item)  # erased meanwhile
                continue
            key = record_key(rt.settings.scope, item.resource_id, item.thread_id)
            record = rt.store.get_record(key)
            cursor = record.cursor(item.thread_id) if record else 0
            newest = rt.store.list_messages(item.resource_id, item.thread_id, limit=1, newest_first=True).messages
            pending = bool(newest) and (newest[0].seq or 0) > cursor and not has_pending_tool_call(newest)
            observing = record is not None and lease_active(record.observing, now)
            submitted = False
            if pending and not observing:
                jobs.append(Job('observe', item.resource_id, item.thread_id, key, 'stale'))
                submitted = True
            if record is not None and self.reflection.due(record):
                jobs.append(Job('reflect', item.resource_id, item.thread_id, key, 'threshold'))
                submitted = True
            if not submitted and not observing:
                rt.store.clear_attention(item)
        return [job for job in jobs if rt.submit(job)]


def _workflow_in_process(job: Job) -> bool:
    """A buffered reflection job runs the workflow's tasks in this process."""
    return job.kind == 'reflect' and job.reason == 'buffer'


def import_id(messages: Sequence[Message]) -> str:
    """The import group id of these messages: the same messages (role, content and date, whatever their ids) make the
    same id. It names no thread: the group's thread says whose import it is, so a clone that carried it (under its own
    thread) recognises the same history sent to it again."""
    digest = hashlib.sha256()
    for message in messages:
        digest.update(f'\x00{message.role}\x00{message.content_hash()}\x00{iso(message.created_at)}'.encode())
    return f'import-{digest.hexdigest()[:24]}'
