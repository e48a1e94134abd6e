"""The one writer of OM records: creation, optimistic-version commits, leases and new generations.

Every write of a record goes through here (the step, the workers, the reflection workflow, deletes and clones), so
the concurrency rules live in one place:

- a write is conditional on the head's `version` (the store raises VersionConflictError when it moved); a lost race
  re-reads the head and re-applies the change, a bounded number of times;
- a change is a function of the freshest head that may decline (return None) when the work is no longer needed or
  no longer ours, and then nothing is written;
- a lease is an owner plus an expiry on the record: whoever holds it may do the slow part (a model call) and commit;
  a lease outlives the work it guards by a margin, and an expired one may be taken over, so a crashed holder never
  blocks the record for long;
- a new generation (reflection, reset) keeps the old head readable as history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from om_lib.errors import VersionConflictError
from om_lib.ports import Clock, MemoryStore
from om_lib.records import Lease, OMRecord, Scope, record_key

logger = logging.getLogger(__name__)

LeaseName = Literal['observing', 'reflecting', 'buffering_observation', 'buffering_reflection']
Change = Callable[[OMRecord], OMRecord | None]

MAX_COMMIT_ATTEMPTS = 4
# A lease lasts at least this long, and outlives the deadline of the work it guards by LEASE_MARGIN.
LEASE_TTL = timedelta(minutes=2)
LEASE_MARGIN = timedelta(seconds=60)


class RecordWriter:
    """Conditional writes of OM records over a `MemoryStore`."""

    def __init__(self, store: MemoryStore, clock: Clock, new_id: Callable[[], str]) -> None:
        self.store = store
        self.clock = clock
        self.new_id = new_id

    # -- reading and creating ------------------------------------------------------------------------------------
    def head(self, key: str) -> OMRecord | None:
        """The key's current head (None when there is none)."""
        return self.store.get_record(key)

    def fresh(self, record: OMRecord) -> OMRecord:
        """The freshest head of `record`'s key, or `record` itself when it is gone."""
        return self.store.get_record(record.key) or record

    def get_or_create(self, scope: Scope, resource_id: str, thread_id: str) -> OMRecord:
        """The head of the scope's key for this thread, created empty when missing (a lost creation race reads the
        winner's)."""
        key = record_key(scope, resource_id, thread_id)
        record = self.store.get_record(key)
        if record is not None:
            return record
        now = self.clock.now()
        fresh = OMRecord(
            id=self.new_id(),
            key=key,
            scope=scope,
            resource_id=resource_id,
            thread_id=thread_id if scope == 'thread' else None,
            created_at=now,
            updated_at=now,
        )
        return self.create(fresh)

    def create(self, record: OMRecord) -> OMRecord:
        """Write a key's first record; when one exists already, return that one instead."""
        try:
            return self.store.put_record(record, expected_version=None)
        except VersionConflictError:
            existing = self.store.get_record(record.key)
            if existing is None:  # pragma: no cover - created and erased in between
                raise
            return existing

    # -- committing ----------------------------------------------------------------------------------------------
    def commit(self, record: OMRecord, change: Change) -> OMRecord | None:
        """Apply `change` to the freshest head with a conditional write, re-reading after a lost race.

        Returns the written head, or None when `change` declined (nothing written). Raises VersionConflictError when
        every attempt lost its race.
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

    def try_commit(self, record: OMRecord, change: Change) -> OMRecord | None:
        """`commit`, with a lost race (every attempt) answered as None: for bookkeeping that may be lost."""
        try:
            return self.commit(record, change)
        except VersionConflictError:
            logger.warning('record write lost every race', extra={'key': record.key})
            return None

    def commit_generation(self, record: OMRecord, build: Change) -> OMRecord | None:
        """Make `build(current head)` the next generation (the old head stays readable), re-reading after a lost race.

        `build` returns the new head with `generation = current.generation + 1`, or None to write nothing.
        """
        current: OMRecord | None = record
        for _ in range(MAX_COMMIT_ATTEMPTS):
            if current is None:
                return None
            new = build(current)
            if new is None:
                return None
            try:
                return self.store.put_generation(new, expected_version=current.version)
            except VersionConflictError:
                current = self.store.get_record(record.key)
        raise VersionConflictError(record.key, current.version if current else None)

    def next_generation(self, current: OMRecord, **update: Any) -> OMRecord:
        """`current` as the next generation's head: a new id and times, `generation + 1`, then `update` applied."""
        now = self.clock.now()
        base: dict[str, Any] = {
            'id': self.new_id(),
            'generation': current.generation + 1,
            'created_at': now,
            'updated_at': now,
        }
        return current.model_copy(update=base | update)

    # -- leases ----------------------------------------------------------------------------------------------------
    def lease_for(self, owner: str, *, hold_s: float = 0.0) -> Lease:
        """A lease for `owner` that outlives `hold_s` seconds of work by the margin (and lasts at least LEASE_TTL)."""
        expires = self.clock.now() + max(LEASE_TTL, timedelta(seconds=max(0.0, hold_s)) + LEASE_MARGIN)
        return Lease(owner=owner, expires_at=expires)

    def take_lease(
        self,
        record: OMRecord,
        name: LeaseName,
        owner: str,
        still_needed: Callable[[OMRecord], bool],
        *,
        hold_s: float = 0.0,
        replaces: str | None = None,
    ) -> OMRecord | None:
        """Take lease `name` for `owner` while `still_needed(head)`; None when someone else holds it or the work is
        no longer needed. `replaces` names a hint owner this lease may take over (a queued job's running mark)."""
        now = self.clock.now()
        lease = self.lease_for(owner, hold_s=hold_s)

        def take(current: OMRecord) -> OMRecord | None:
            held: Lease | None = getattr(current, name)
            if held is not None and held.active(now) and held.owner not in (owner, replaces):
                return None  # someone else is on it
            if not still_needed(current):
                return None
            return current.model_copy(update={name: lease})

        return self.commit(record, take)

    def release_lease(self, record: OMRecord, name: LeaseName, owner: str, **extra: Any) -> OMRecord:
        """Drop lease `name` if `owner` still holds it, applying `extra` in the same write; returns the fresh head."""

        def release(current: OMRecord) -> OMRecord | None:
            held: Lease | None = getattr(current, name)
            if held is None or held.owner != owner:
                return None
            return current.model_copy(update={name: None, **extra})

        return self.try_commit(record, release) or self.fresh(record)

    def release_quietly(self, record: OMRecord, name: LeaseName, owner: str) -> None:
        """`release_lease` on a failure path: an error here is logged, never raised over the original one."""
        try:
            self.release_lease(record, name, owner)
        except Exception:  # noqa: BLE001 - the lease expires on its own; the original error is what matters
            logger.exception('could not release a lease', extra={'key': record.key, 'lease': name})


def lease_active(lease: Lease | None, now: Any) -> bool:
    """Is there a lease, and has it not expired?"""
    return lease is not None and lease.active(now)
