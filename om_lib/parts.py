"""The streamed `data-om-*` parts (seed 000, "Streaming data parts"): one frozen dataclass per kind.

A step, a turn or a background job collects the parts it produces in a `CycleParts`; they become JSON once, at the
edge (`CycleParts.to_json`). A `CycleParts` may also carry a live `sink`: every part is handed to it the moment it is
added (the streamed chat route sends it to the browser then: observation-start before the Observer call, -end after).

Field names in JSON are the seed's (camelCase); a field that is None is left out.
Parts that background work keeps on a record until a step answers them are stored as JSON and come back as
`StoredPart`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, ClassVar, Literal

from om_lib.llm import CallUsage
from om_lib.messages import iso

OperationType = Literal['observation', 'reflection']
JsonPart = dict[str, Any]

# Why a cycle did not commit (docs/operations.md, "Failure reasons", says what each one means).
FailureReason = Literal[
    'error',
    'timeout',
    'deferred',
    'conflict',
    'not_smaller',
    'not_under_target',
    'invalid_output',
    'invalid_reflection',
    'model_unavailable',
    'busy',
]


@dataclass(frozen=True)
class MarkerConfig:
    """Snapshot of the thresholds at the time of a marker (`ObservationMarkerConfig`)."""

    message_tokens: int
    observation_tokens: int
    scope: str

    def as_json(self) -> dict[str, Any]:
        """The camelCase form used in parts."""
        return {'messageTokens': self.message_tokens, 'observationTokens': self.observation_tokens, 'scope': self.scope}


def _camel(name: str) -> str:
    head, *rest = name.split('_')
    return head + ''.join(word.title() for word in rest)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, MarkerConfig):
        return value.as_json()
    if isinstance(value, tuple):
        return list(value)
    return value


@dataclass(frozen=True, kw_only=True)
class OMPart:
    """A `data-om-*` part. Subclasses name their `TYPE` and declare their fields in the seed's order."""

    TYPE: ClassVar[str] = ''
    # What the model calls behind this outcome cost (None: no model call). Not part of the `data` clients get: the
    # lifecycle events carry it (om_lib/events.py).
    usage: CallUsage | None = field(default=None, compare=False, repr=False)

    def data(self) -> dict[str, Any]:
        """The part's `data` object: camelCase field names, None fields left out."""
        return {
            _camel(f.name): _json_value(v)
            for f in fields(self)
            if f.name != 'usage' and (v := getattr(self, f.name)) is not None
        }

    def kind(self) -> str:
        """The part's `type` (`data-om-…`)."""
        return self.TYPE

    def to_json(self) -> JsonPart:
        """`{type, data}` as sent to clients."""
        return {'type': self.kind(), 'data': self.data()}


@dataclass(frozen=True, kw_only=True)
class ObservationStart(OMPart):
    """`data-om-observation-start`: the Observer or Reflector began."""

    TYPE: ClassVar[str] = 'data-om-observation-start'
    cycle_id: str
    operation_type: OperationType
    started_at: datetime
    tokens_to_observe: int
    record_id: str
    thread_id: str
    thread_ids: tuple[str, ...]
    config: MarkerConfig


@dataclass(frozen=True, kw_only=True)
class ObservationEnd(OMPart):
    """`data-om-observation-end`: the cycle committed."""

    TYPE: ClassVar[str] = 'data-om-observation-end'
    cycle_id: str
    operation_type: OperationType
    completed_at: datetime
    duration_ms: int
    tokens_observed: int
    observation_tokens: int
    observations: str
    record_id: str
    thread_id: str
    current_task: str | None = None
    suggested_response: str | None = None
    # Doubts about the answer that was accepted (om_lib/prompts/log_check.py: `mostly_prose`, `repeated_item`, ...).
    notes: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class ObservationFailed(OMPart):
    """`data-om-observation-failed`: nothing was committed; the messages stay unobserved.

    `reason` is ours (the failure reasons table of docs/operations.md says what each one means).
    """

    TYPE: ClassVar[str] = 'data-om-observation-failed'
    cycle_id: str
    operation_type: OperationType
    failed_at: datetime
    duration_ms: int
    tokens_attempted: int
    error: str
    reason: FailureReason = 'error'
    retrying: bool = False
    observations: str = ''
    record_id: str
    thread_id: str


@dataclass(frozen=True, kw_only=True)
class ThreadUpdate(OMPart):
    """`data-om-thread-update`: the Observer renamed the thread."""

    TYPE: ClassVar[str] = 'data-om-thread-update'
    cycle_id: str
    thread_id: str
    old_title: str | None = None
    new_title: str
    timestamp: datetime


@dataclass(frozen=True)
class BufferedWindows:
    """The `buffered` windows of `data-om-status` and of the memory view (seed 000, spec §7.10)."""

    chunks: int = 0
    message_tokens: int = 0
    projected_message_removal: int = 0
    observation_tokens: int = 0
    observation_status: str = 'idle'
    reflection_input_tokens: int = 0
    reflection_output_tokens: int = 0
    reflection_status: str = 'idle'

    def as_json(self, *, projection: bool = True) -> dict[str, Any]:
        """`{observations: {...}, reflection: {...}}`; the memory view leaves the projection out."""
        observations: dict[str, Any] = {'chunks': self.chunks, 'messageTokens': self.message_tokens}
        if projection:
            observations['projectedMessageRemoval'] = self.projected_message_removal
        observations |= {'observationTokens': self.observation_tokens, 'status': self.observation_status}
        return {
            'observations': observations,
            'reflection': {
                'inputObservationTokens': self.reflection_input_tokens,
                'observationTokens': self.reflection_output_tokens,
                'status': self.reflection_status,
            },
        }


@dataclass(frozen=True, kw_only=True)
class Status(OMPart):
    """`data-om-status`: the memory's windows, emitted on every step."""

    TYPE: ClassVar[str] = 'data-om-status'
    message_tokens: int
    message_threshold: int
    observation_tokens: int
    observation_threshold: int
    buffered: BufferedWindows = field(default_factory=BufferedWindows)
    record_id: str
    thread_id: str
    step_number: int
    generation_count: int

    def data(self) -> dict[str, Any]:
        """The seed's nested `windows` shape."""
        return {
            'windows': {
                'active': {
                    'messages': {'tokens': self.message_tokens, 'threshold': self.message_threshold},
                    'observations': {'tokens': self.observation_tokens, 'threshold': self.observation_threshold},
                },
                'buffered': self.buffered.as_json(),
            },
            'recordId': self.record_id,
            'threadId': self.thread_id,
            'stepNumber': self.step_number,
            'generationCount': self.generation_count,
        }


@dataclass(frozen=True, kw_only=True)
class BufferingStart(OMPart):
    """`data-om-buffering-start`: background buffering of an observation or reflection was started."""

    TYPE: ClassVar[str] = 'data-om-buffering-start'
    cycle_id: str
    operation_type: OperationType
    started_at: datetime
    tokens_to_buffer: int
    record_id: str
    thread_id: str
    thread_ids: tuple[str, ...]
    config: MarkerConfig


@dataclass(frozen=True, kw_only=True)
class BufferingEnd(OMPart):
    """`data-om-buffering-end`: the buffered content is stored, not yet active."""

    TYPE: ClassVar[str] = 'data-om-buffering-end'
    cycle_id: str
    operation_type: OperationType
    completed_at: datetime
    duration_ms: int
    tokens_buffered: int
    buffered_tokens: int
    record_id: str
    thread_id: str
    observations: str | None = None


@dataclass(frozen=True, kw_only=True)
class BufferingFailed(OMPart):
    """`data-om-buffering-failed`: background buffering failed (the threshold path observes those messages).

    `observations` is the seed's "any partial content" (a failed call has none: '').
    """

    TYPE: ClassVar[str] = 'data-om-buffering-failed'
    cycle_id: str
    operation_type: OperationType
    failed_at: datetime
    duration_ms: int
    tokens_attempted: int
    error: str
    observations: str = ''
    record_id: str
    thread_id: str
    reason: FailureReason = 'error'


@dataclass(frozen=True, kw_only=True)
class Activation(OMPart):
    """`data-om-activation`: buffered observations or a buffered reflection became active (no model call)."""

    TYPE: ClassVar[str] = 'data-om-activation'
    cycle_id: str
    operation_type: OperationType
    activated_at: datetime
    chunks_activated: int
    tokens_activated: int
    observation_tokens: int
    messages_activated: int
    generation_count: int
    record_id: str
    thread_id: str
    config: MarkerConfig
    # What started it: `threshold`, `ttl` (the thread was idle past `activateAfterIdle`) or `provider_change` (the
    # Actor's model changed since the last step); the fields after it are the reference's, set for those triggers.
    triggered_by: str = 'threshold'
    observations: str | None = None
    # Unix milliseconds of the last reply the idle time is measured from (`ttl`).
    last_activity_at: int | None = None
    # How long the thread had been idle, in milliseconds (`ttl`).
    ttl_expired_ms: int | None = None
    # The idle time in force, in milliseconds (`ttl`).
    activate_after_idle: int | None = None
    # The Actor models before and now (`provider_change`), as `provider/model`.
    previous_model: str | None = None
    current_model: str | None = None


@dataclass(frozen=True, kw_only=True)
class ObservationsArchived(OMPart):
    """`data-om-observations-archived`: the log passed its bound (`observation.archive.afterTokens`), so its oldest
    observation groups moved into the archive (no model call); recall's `mode: "observations"` pages them back."""

    TYPE: ClassVar[str] = 'data-om-observations-archived'
    cycle_id: str
    archived_at: datetime
    groups_archived: int
    tokens_archived: int
    observation_tokens: int
    after_tokens: int
    archived_groups_total: int
    archived_tokens_total: int
    generation_count: int
    record_id: str
    thread_id: str


@dataclass(frozen=True, kw_only=True)
class Scheduled(OMPart):
    """`data-om-scheduled`: background operations this request queued (`buffer`, `observe`, `reflect`, `title`)."""

    TYPE: ClassVar[str] = 'data-om-scheduled'
    operations: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ActorFailed(OMPart):
    """`data-om-actor-failed`: the chat Actor did not answer; the user's message is saved."""

    TYPE: ClassVar[str] = 'data-om-actor-failed'
    error: str
    message: str = 'the Actor model did not answer; the message is saved, retry it with the same id'
    retryable: bool
    model: str | None = None

    def data(self) -> dict[str, Any]:
        """`model` is always present (null when unknown)."""
        return {'error': self.error, 'message': self.message, 'retryable': self.retryable, 'model': self.model}


@dataclass(frozen=True, kw_only=True)
class ReplyUnsaved(OMPart):
    """`data-om-reply-unsaved`: the Actor's reply is returned but could not be saved (send it to `/turns`)."""

    TYPE: ClassVar[str] = 'data-om-reply-unsaved'
    error: str
    retryable: bool


@dataclass(frozen=True, kw_only=True)
class SemanticRecallFailed(OMPart):
    """`data-om-semantic-recall-failed`: similar earlier messages could not be looked up for this request."""

    TYPE: ClassVar[str] = 'data-om-semantic-recall-failed'
    error: str
    retryable: bool


@dataclass(frozen=True, kw_only=True)
class StoredPart(OMPart):
    """A part that background work stored on a record as JSON, answered by a later step as it was stored."""

    type: str
    stored: dict[str, Any]

    def kind(self) -> str:
        """The stored part's type."""
        return self.type

    def data(self) -> dict[str, Any]:
        """A copy of the stored data (the record's own stays as stored)."""
        return dict(self.stored)

    @property
    def cycle_id(self) -> str:
        """The cycle the stored part belongs to ('' when it names none)."""
        return str(self.stored.get('cycleId', ''))

    @classmethod
    def from_json(cls, part: JsonPart) -> StoredPart:
        """Wrap a stored `{type, data}` part."""
        return cls(type=str(part['type']), stored=dict(part['data']))


def with_observations(part: BufferingEnd, observations: str) -> BufferingEnd:
    """A copy of a buffering-end part with its `observations` text set (stored parts leave it to the chunk)."""
    return replace(part, observations=observations)


FAILED_TYPES = frozenset({ObservationFailed.TYPE, BufferingFailed.TYPE})


PartSink = Callable[['OMPart'], None]


@dataclass
class CycleParts:
    """The `data-om-*` parts one step, turn or job produced, in order.

    `sink`, when set, is called with each part as it is added (a live listener: the streamed chat route). It must not
    raise: a listener that went away (a closed connection) must not fail the work that reports to it.
    """

    items: list[OMPart] = field(default_factory=list)
    sink: PartSink | None = field(default=None, repr=False, compare=False)

    def add(self, part: OMPart) -> None:
        """Append one part (and hand it to the live sink)."""
        self.items.append(part)
        if self.sink is not None:
            self.sink(part)

    def extend(self, parts: Iterable[OMPart]) -> None:
        """Append several parts."""
        for part in parts:
            self.add(part)

    def preview(self, part: OMPart) -> None:
        """Hand `part` to the live sink only, not to the collected parts: a first look (the memory's windows as the
        step found them) that a later part of the same kind replaces. Without a sink, nothing happens."""
        if self.sink is not None:
            self.sink(part)

    @property
    def live(self) -> bool:
        """Whether a live sink listens (work done only for it, like a preview, can be skipped otherwise)."""
        return self.sink is not None

    def failures(self) -> list[dict[str, Any]]:
        """The `data` of every observation-failed and buffering-failed part (stored ones included)."""
        return [p.data() for p in self.items if p.kind() in FAILED_TYPES]

    def to_json(self) -> list[JsonPart]:
        """Every part as `{type, data}`."""
        return [p.to_json() for p in self.items]

    def made_here(self) -> list[JsonPart]:
        """The parts this step, turn or job made itself, as `{type, data}`: not the ones background work kept for it
        (`StoredPart`), which the worker or workflow that made them has counted already."""
        return [p.to_json() for p in self.own()]

    def own(self) -> list[OMPart]:
        """The parts this step, turn or job made itself (see `made_here`), as made (with their model usage)."""
        return [p for p in self.items if not isinstance(p, StoredPart)]

    def __iter__(self) -> Iterator[OMPart]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)
