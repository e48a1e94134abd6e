"""Background work: the worker's jobs, the scheduled sweep, and observing a thread on demand.

Jobs are idempotent: each re-reads the record and does nothing when the work is no longer needed, so a redelivered
or duplicated job is harmless. They call the same observation pipeline and reflection path as the step.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from om_lib import titles
from om_lib.background import keep_background_parts
from om_lib.errors import ThreadNotFoundError
from om_lib.observation import backlog_of
from om_lib.parts import CycleParts
from om_lib.record_writer import lease_active
from om_lib.records import OMRecord, record_key
from om_lib.reflection import WORKER_BUDGET_S
from om_lib.rooms import MemoryRooms
from om_lib.runtime import has_pending_tool_call
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
        if job.kind == 'reflect' and job.reason == 'buffer':
            self.reflection.run_in_process(job, limit)
            return CycleParts()
        if job.kind == 'observe':
            record, parts = self.observe_now(job.resource_id, job.thread_id, deadline=limit, reflect=False)
        else:
            parts = CycleParts()
            found = rt.store.get_record(job.record_key)
            if found is None:
                return parts
            record = self.reflection.reflect_now(found, job.thread_id, limit, parts).record
        # The client hears about it on its next step (om_lib/background.py).
        keep_background_parts(rt, record, parts)
        return parts

    def observe_now(
        self, resource_id: str, thread_id: str, *, deadline: float | None = None, reflect: bool = True
    ) -> tuple[OMRecord, CycleParts]:
        """Observe every unobserved message of a thread (in resource scope: of every pending thread) regardless of the
        threshold: the worker's observe job, and tools and tests.

        Raises ThreadNotFoundError when the thread is gone (erased), so a late job writes nothing.
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
                record, [backlog_of(thread_id, unobserved, rt)], limit, parts, can_defer=False
            )
        if reflect:
            record = self._reflect_or_hand_off(record, thread_id, limit, parts)
        return self.archive.enforce(record, thread_id, parts), parts

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
