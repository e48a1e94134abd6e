"""The one writer of OM records: creation, optimistic-version commits, leases and new generations.

Every write of a record goes through here (the step, the workers, the reflection workflow, deletes and clones), so
the concurrency rules live in one place:

- a write is conditional on the head's `version` (the store raises VersionConflictError when it moved); a lost race
  re-reads the head and re-applies the change, a bounded number of times;
- a change is a function of the freshest head that may decline (return None) when the work is no longer needed or
  no longer ours, and then nothing is written;
- a lease is an owner plus an expiry on the record: whoever holds it may do the slow part (a model call) and commit.
  It lasts about one model call (`lease_ttl`, 60 s) and a live holder renews it while it works (`holding`), so a
  holder that died stops blocking the record within one lease period, and an expired lease may be taken over;
- a new generation (reflection, reset) keeps the old head readable as history (until messages it observed are
  deleted: `om_lib.history.forgetting`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Literal

from om_lib.errors import VersionConflictError
from om_lib.ports import Clock, MemoryStore
from om_lib.records import Lease, OMRecord, Scope, record_key

logger = logging.getLogger(__name__)

LeaseName = Literal['observing', 'reflecting', 'buffering_observation', 'buffering_reflection']
Change = Callable[[OMRecord], OMRecord | None]

MAX_COMMIT_ATTEMPTS = 4
# A lease lasts about one model call; a live holder renews it every third of that while it works.
DEFAULT_LEASE_TTL_S = 60.0


class RecordWriter:
    """Conditional writes of OM records over a `MemoryStore`."""

    def __init__(
        self,
        store: MemoryStore,
        clock: Clock,
        new_id: Callable[[], str],
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self.store = store
        self.clock = clock
        self.new_id = new_id
        self.lease_ttl_s = lease_ttl_s

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
        new = current.model_copy(update=base | update)
        return new.model_copy(update={'initial_observation_tokens': new.observation_tokens})

    # -- leases ----------------------------------------------------------------------------------------------------
    def lease_for(self, owner: str, *, ttl_s: float | None = None) -> Lease:
        """A lease for `owner` that expires `ttl_s` from now (the writer's lease period by default)."""
        return Lease(owner=owner, expires_at=self.clock.now() + timedelta(seconds=ttl_s or self.lease_ttl_s))

    def take_lease(
        self,
        record: OMRecord,
        name: LeaseName,
        owner: str,
        still_needed: Callable[[OMRecord], bool],
        *,
        ttl_s: float | None = None,
        replaces: str | None = None,
    ) -> OMRecord | None:
        """Take lease `name` for `owner` while `still_needed(head)`; None when someone else holds it or the work is
        no longer needed. `replaces` names a hint owner this lease may take over (a queued job's running mark).
        `ttl_s` overrides the lease period (a workflow's lease spans several Lambda invocations)."""
        now = self.clock.now()
        lease = self.lease_for(owner, ttl_s=ttl_s)

        def take(current: OMRecord) -> OMRecord | None:
            held: Lease | None = getattr(current, name)
            if held is not None and held.active(now) and held.owner not in (owner, replaces):
                return None  # someone else is on it
            if not still_needed(current):
                return None
            return current.model_copy(update={name: lease})

        return self.commit(record, take)

    @contextmanager
    def holding(self, record: OMRecord, name: LeaseName, owner: str, *, ttl_s: float | None = None) -> Iterator[None]:
        """Renew `owner`'s lease `name` every third of its period while the block runs (the model call): a live
        holder keeps the record, a dead one loses it within one lease period. Renewal stops at the first write that
        finds the lease released or taken over; a failed renewal is logged, never raised into the work."""
        period = ttl_s or self.lease_ttl_s
        stop = threading.Event()

        def extend(current: OMRecord) -> OMRecord | None:
            held = getattr(current, name)
            if held is None or held.owner != owner:
                stop.set()
                return None
            return current.model_copy(update={name: self.lease_for(owner, ttl_s=period)})

        def renew() -> None:
            while not stop.wait(period / 3):
                try:
                    self.commit(record, extend)
                except Exception:  # noqa: BLE001 - the holder's own commit decides; the lease may just expire
                    logger.exception('could not renew a lease', extra={'key': record.key, 'lease': name})

        renewer = threading.Thread(target=renew, name=f'lease-{name}', daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join(timeout=5)

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


def lease_active(lease: Lease | None, now: datetime) -> bool:
    """Is there a lease, and has it not expired?"""
    return lease is not None and lease.active(now)
