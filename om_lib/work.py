"""Background work the engine hands off: the port, and the jobs that travel through it.

In AWS an observation job is an SQS message (FIFO, grouped per record so one record's jobs run in order) and a
reflection job starts the Step Functions workflow; locally the same handlers run in-process. Jobs are idempotent: the
worker re-reads the record and does nothing when the work is no longer needed, so duplicates are harmless.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

JobKind = Literal['observe', 'reflect', 'title', 'embed', 'buffer']


@dataclass(frozen=True)
class Job:
    """One unit of background work on one record."""

    kind: JobKind
    resource_id: str
    thread_id: str
    record_key: str
    reason: str
    # A `buffer` job observes the messages up to `end_seq` (from `start_seq` when nothing was buffered since the step
    # queued it); `cycle_id` links its data-om-buffering-* parts and the chunk it makes.
    start_seq: int | None = None
    end_seq: int | None = None
    cycle_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON body used on queues and as workflow input."""
        data = asdict(self)
        body = {
            'kind': data['kind'],
            'resourceId': data['resource_id'],
            'threadId': data['thread_id'],
            'recordKey': data['record_key'],
            'reason': data['reason'],
        }
        for name, key in (('start_seq', 'startSeq'), ('end_seq', 'endSeq'), ('cycle_id', 'cycleId')):
            if data[name] is not None:
                body[key] = data[name]
        return body

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        """Parse the JSON body; raises KeyError/ValueError on a malformed one."""
        kind = data['kind']
        if kind not in ('observe', 'reflect', 'title', 'embed', 'buffer'):
            raise ValueError(f'unknown job kind {kind!r}')
        return cls(
            kind=kind,
            resource_id=str(data['resourceId']),
            thread_id=str(data['threadId']),
            record_key=str(data['recordKey']),
            reason=str(data.get('reason', '')),
            start_seq=int(data['startSeq']) if data.get('startSeq') is not None else None,
            end_seq=int(data['endSeq']) if data.get('endSeq') is not None else None,
            cycle_id=str(data['cycleId']) if data.get('cycleId') is not None else None,
        )

    @property
    def dedup_key(self) -> str:
        """Jobs with the same key within a short window are the same work (SQS FIFO de-duplication).

        A buffering job is keyed by its message range: the same slice queued twice is one job.
        """
        if self.kind == 'buffer':
            return f'buffer:{self.record_key}:{self.start_seq}-{self.end_seq}'
        return f'{self.kind}:{self.record_key}'


@runtime_checkable
class BackgroundWork(Protocol):
    """Where the engine sends work it will not do inside a request."""

    def submit(self, job: Job) -> None:
        """Queue `job` (observe → work queue, reflect → reflection workflow). At-least-once; may de-duplicate.

        Raises StorageError (retryable) when the queue or workflow service cannot be reached.
        """
        ...


class CollectingWork:
    """A BackgroundWork that just remembers jobs (unit tests; callers that run them later)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> None:
        """Remember the job."""
        self.jobs.append(job)
