"""Stored state of observational memory: threads, OM records (one head per key, older generations kept),
observation groups and buffered chunks.

Cursors are message sequence numbers (the server's arrival order), never client clocks: `cursors[thread_id]` is the
highest `seq` of that thread that the record has observed. Thread scope has one entry; resource scope one per
thread, so a thread's progress moves only when its own observation commits.
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Scope = Literal['thread', 'resource']


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra='ignore')


class Thread(_Model):
    """A conversation, owned by exactly one resource."""

    id: str
    resource_id: str
    title: str | None = None
    # A title set through the API (`PATCH /threads/{id}`) is pinned: the Observer's suggestions and generated titles
    # never replace it. Clearing the title un-pins it.
    title_pinned: bool = False
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Continuation hints written by the Observer (thread records carry them in both scopes, seed 004).
    current_task: str | None = None
    suggested_response: str | None = None


class Lease(_Model):
    """An in-flight flag that expires, so a crashed worker never leaves a record stuck."""

    owner: str
    expires_at: datetime

    def active(self, now: datetime) -> bool:
        """True while the lease has not expired."""
        return now < self.expires_at


class ObservationGroup(_Model):
    """Which messages one block of observations came from (kept for deletion, cloning and recall)."""

    id: str
    thread_id: str
    start_id: str
    end_id: str
    start_seq: int
    end_seq: int
    created_at: datetime
    # `import`: observations of messages imported from elsewhere (`POST …/memory/observe` with messages). They are not
    # stored in the thread: the group names them by their ids only (`start_seq`/`end_seq` 0), and its id makes the
    # same import a no-op the second time.
    kind: Literal['observation', 'reflection', 'import'] = 'observation'


class ArchivedGroup(_Model):
    """One observation group (or a piece of one, or observations outside any group) moved out of the active log into
    the archive when the log passed its bound (`observation.archive`). Nothing is lost: recall pages it back."""

    id: str
    # The thread its messages belong to (None for text outside any thread's section in resource scope).
    thread_id: str | None
    # The messages it came from (`#12:#19`; '' when the observations named none, e.g. a reflection of older text).
    range: str = ''
    start_seq: int | None = None
    end_seq: int | None = None
    observations: str
    tokens: int
    archived_at: datetime
    # The generation it was moved out of.
    generation: int


class ModelUsage(_Model):
    """What model calls cost, kept on a record between the task that made them and the one that reports them (the
    reflection workflow stages a draft in one task and commits it in another)."""

    model: str
    calls: int = 1
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class BufferedChunk(_Model):
    """Observations computed in the background and not yet shown to the Actor."""

    id: str
    cycle_id: str
    thread_id: str
    observations: str
    token_count: int
    message_ids: tuple[str, ...]
    message_tokens: int
    start_seq: int
    end_seq: int
    last_observed_at: datetime
    created_at: datetime
    current_task: str | None = None
    suggested_response: str | None = None
    thread_title: str | None = None


def record_key(scope: Scope, resource_id: str, thread_id: str | None) -> str:
    """The lookup key of a record: `thread:<resource>/<thread>` or `resource:<resource>`."""
    if scope == 'resource':
        return f'resource:{resource_id}'
    if not thread_id:
        raise ValueError("observational memory (scope: 'thread') requires a threadId")
    return f'thread:{resource_id}/{thread_id}'


class OMRecord(_Model):
    """One generation of a key's observational memory. The head (highest generation) is the live one."""

    id: str
    key: str
    scope: Scope
    resource_id: str
    thread_id: str | None
    generation: int = 0
    # `archive`: the generation the archive bound made (the oldest groups moved out, no model call).
    origin: Literal['initial', 'reflection', 'archive'] = 'initial'
    created_at: datetime
    updated_at: datetime
    # Optimistic lock: every write of the head is conditional on this value; stores bump it.
    version: int = 0

    active_observations: str = ''
    observation_tokens: int = 0
    # The observation tokens this generation started with (after the reflection or reset that made it), for the
    # generations timeline; None on the first generation and on records written before it was kept.
    initial_observation_tokens: int | None = None
    total_tokens_observed: int = 0
    pending_message_tokens: int = 0
    cursors: dict[str, int] = Field(default_factory=dict)
    last_observed_at: datetime | None = None
    groups: tuple[ObservationGroup, ...] = ()
    # Observation groups moved out of the active log past the archive bound, oldest first (recall's "observations").
    archived: tuple[ArchivedGroup, ...] = ()

    buffered_chunks: tuple[BufferedChunk, ...] = ()
    last_buffered_at_tokens: int = 0
    buffered_reflection: str | None = None
    buffered_reflection_tokens: int | None = None
    buffered_reflection_input_tokens: int | None = None
    reflected_line_count: int | None = None
    # The `buffer-refl-…` cycle that staged `buffered_reflection`: its activation part carries the same id.
    buffered_reflection_cycle_id: str | None = None
    # What the Reflector calls behind the staged reflection cost (reported when the workflow commits it).
    buffered_reflection_usage: ModelUsage | None = None
    # `data-om-buffering-end`/`-failed` parts of background work, kept until a step answers them (newest last,
    # bounded): the worker has no client to tell.
    background_parts: tuple[dict[str, Any], ...] = ()
    # Message deletions that reached this memory (om_lib.history.forgetting): background work that read messages before
    # one (a buffering job) finds it moved and throws its result away, which may hold a deleted message.
    deletions: int = 0

    observing: Lease | None = None
    reflecting: Lease | None = None
    buffering_observation: Lease | None = None
    buffering_reflection: Lease | None = None

    # Backoff after a reflection that could not shrink the log: the observation-token count it left behind.
    # Threshold-triggered reflection is skipped while the count is unchanged (spec §12.9, reference #14109).
    reflection_stalled_at_tokens: int | None = None
    # Backoff after failed reflection workflow runs (a model outage): how many in a row, and no new run before when.
    reflection_failures: int | None = None
    reflection_retry_at: datetime | None = None
    observed_timezone: str = 'UTC'
    # The Actor model the last step said it runs (`provider/model`), to notice a change (`activateOnProviderChange`).
    actor_model: str | None = None

    def reflection_backing_off(self, now: datetime) -> bool:
        """Did a reflection run fail recently enough that no new one should start yet?"""
        return self.reflection_retry_at is not None and now < self.reflection_retry_at

    def cursor(self, thread_id: str) -> int:
        """The last observed `seq` of a thread (0 when nothing was observed)."""
        return self.cursors.get(thread_id, 0)

    def observed_thread_ids(self) -> set[str]:
        """Every thread whose observations this memory holds: those with a cursor, and those with only imported history
        (an import moves no cursor; its group names the thread). In resource scope each has its `<thread id>` sections.
        """
        return {*self.cursors, *(g.thread_id for g in self.groups)}


# A staged (buffered) reflection's fields, cleared together whenever it is activated, dropped or made stale:
# `record.model_copy(update={**NO_STAGED_REFLECTION, ...})` or `writer.next_generation(..., **NO_STAGED_REFLECTION)`.
NO_STAGED_REFLECTION: MappingProxyType[str, None] = MappingProxyType(
    {
        'buffered_reflection': None,
        'buffered_reflection_tokens': None,
        'buffered_reflection_input_tokens': None,
        'reflected_line_count': None,
        'buffered_reflection_cycle_id': None,
        'buffered_reflection_usage': None,
    }
)


class WorkingMemoryRecord(_Model):
    """A resource's (or, in thread scope, a thread's) working memory: Markdown text or a JSON object.

    `thread_id` is None in resource scope. `version` is the optimistic lock: stores bump it on every write.
    """

    scope: Scope
    resource_id: str
    thread_id: str | None = None
    format: Literal['markdown', 'json']
    content: str | dict[str, Any]
    updated_at: datetime
    version: int = 0


class FailureNote(_Model):
    """One observation, reflection or buffering failure, kept for `recentFailures` (GET /memory, the inspector)."""

    operation_type: Literal['observation', 'reflection']
    reason: str
    message: str
    at: datetime
    # The thread it concerned (resource scope keeps one list for the resource; this attributes each failure).
    thread_id: str | None = None
    # `data-om-buffering-failed` (background work) rather than `data-om-observation-failed`.
    background: bool = False
    # Not a failure: an answer that became memory although a check was unsure about it (`reason` names the doubt,
    # om_lib/prompts/log_check.py). Kept beside the failures; the memory view lists them apart (`recentNotes`).
    note: bool = False
