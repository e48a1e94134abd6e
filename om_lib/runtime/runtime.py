"""What every room of the engine shares: the resolved settings and the ports, with the few helpers they all need.

`MemoryEngine` builds one `Runtime` and hands it to the observation pipeline, the reflection path, buffering, the
step and the jobs. They call down into it; nothing calls back up into its caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from om_lib.config import ResolvedOMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.errors import DeadlineExceededError
from om_lib.llm import CallUsage
from om_lib.messages import Message, ToolCallPart, ToolResultPart
from om_lib.models.model_router import ModelRouter
from om_lib.parts import (
    FAILED_TYPES,
    BufferingFailed,
    BufferingStart,
    FailureReason,
    MarkerConfig,
    ObservationFailed,
    ObservationStart,
    OMPart,
    OperationType,
    StoredPart,
)
from om_lib.ports import BlobReader, Clock, MemoryStore
from om_lib.records import FailureNote, OMRecord
from om_lib.runtime.record_writer import LeaseName, RecordWriter, lease_active
from om_lib.work import BackgroundWork, Job

logger = logging.getLogger(__name__)

# How many messages one read of unobserved history takes (it pages until done).
UNOBSERVED_PAGE = 500
# How often a step looks whether another holder released a lease it waits for.
LEASE_POLL_S = 0.25


@dataclass(frozen=True)
class Cycle:
    """One observation, reflection or buffering run: its id (in every part it produces) and when it started."""

    cycle_id: str
    started_at: datetime
    started_mono: float


@dataclass
class Runtime:
    """The engine's settings and ports (see module docstring)."""

    settings: ResolvedOMConfig
    store: MemoryStore
    router: ModelRouter
    counter: TokenCounter
    clock: Clock
    writer: RecordWriter
    new_id: Callable[[], str]
    blobs: BlobReader | None = None
    work: BackgroundWork | None = None
    time_budget_s: float = 20.0
    # Waiting for another holder's lease: real sleep in production, a clock advance in tests.
    sleep: Callable[[float], None] = field(default=time.sleep)

    # -- time and cycles -----------------------------------------------------------------------------------------
    def deadline(self) -> float:
        """The monotonic time by which a request must be done (its time budget from now)."""
        return self.clock.monotonic() + self.time_budget_s

    def left(self, deadline: float) -> float:
        """Seconds left before `deadline`."""
        return deadline - self.clock.monotonic()

    def start_cycle(self, prefix: str = '') -> Cycle:
        """A new cycle, starting now."""
        return Cycle(f'{prefix}{self.new_id()}', self.clock.now(), self.clock.monotonic())

    def elapsed_ms(self, cycle: Cycle | None) -> int:
        """Milliseconds since `cycle` started (0 without one)."""
        if cycle is None:
            return 0
        return max(0, int((self.clock.monotonic() - cycle.started_mono) * 1000))

    # -- thresholds ----------------------------------------------------------------------------------------------
    def message_threshold(self, record: OMRecord | None) -> int:
        """`messageTokens` for this record (dynamic under `shareTokenBudget`)."""
        if record is None:
            return self.settings.max_message_threshold()
        return self.settings.dynamic_message_threshold(record.observation_tokens)

    def observation_threshold(self, record: OMRecord) -> int:
        """`observationTokens` as shown in status: under a shared budget, what the messages leave (spec §5)."""
        s = self.settings
        if s.share_token_budget:
            return max(s.max_message_threshold() - self.message_threshold(record), 1000)
        return s.observation_tokens

    def marker_config(self) -> MarkerConfig:
        """The thresholds snapshot carried by start and activation markers."""
        s = self.settings
        return MarkerConfig(
            message_tokens=s.max_message_threshold(), observation_tokens=s.observation_tokens, scope=s.scope
        )

    def wait_for_release(
        self, record: OMRecord, name: LeaseName, deadline: float, *, reserve_s: float
    ) -> OMRecord | None:
        """Wait until the holder of lease `name` on `record` is done (released it, or it expired), keeping `reserve_s`
        of the budget; the fresh head then, or None when the budget ran out first (or the record is gone)."""
        held = getattr(record, name)
        owner = held.owner if held is not None else None
        while self.left(deadline) > reserve_s + LEASE_POLL_S:
            self.sleep(LEASE_POLL_S)
            fresh = self.store.get_record(record.key)
            if fresh is None:
                return None
            current = getattr(fresh, name)
            if not lease_active(current, self.clock.now()) or current.owner != owner:
                return fresh
        return None

    # -- messages ------------------------------------------------------------------------------------------------
    def load_after(self, resource_id: str, thread_id: str, after: int) -> list[Message]:
        """A thread's messages after sequence `after`, page by page; never the observed history before it."""
        out: list[Message] = []
        while True:
            page = self.store.list_messages(resource_id, thread_id, after_seq=after, limit=UNOBSERVED_PAGE)
            out.extend(page.messages)
            if not page.has_more or not page.messages:
                return out
            after = page.messages[-1].seq or after

    # -- background work -------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> bool:
        """Hand a job to the background; best effort (the sweeper finds what a lost job left behind)."""
        if self.work is None:
            return False
        try:
            self.work.submit(job)
        except Exception:  # noqa: BLE001 - a queue outage must not fail a request whose input is saved
            logger.exception('could not submit background work', extra={'kind': job.kind, 'key': job.record_key})
            return False
        return True

    # -- failures, kept for recentFailures ----------------------------------------------------------------------------
    def remember_failures(self, resource_id: str, thread_id: str, parts: Iterable[OMPart]) -> None:
        """Keep the failures among `parts` for `recentFailures` (a ladder's `retrying` attempts and deferrals are not
        failures; parts a worker stored for the next step were kept when the worker made them). Best effort."""
        memory_thread = thread_id if self.settings.scope == 'thread' else None
        for part in parts:
            if isinstance(part, StoredPart) or part.kind() not in FAILED_TYPES:
                continue
            data = part.data()
            if data.get('retrying') or data.get('reason') == 'deferred':
                continue
            note = FailureNote(
                operation_type=data.get('operationType', 'observation'),
                reason=str(data.get('reason') or 'error'),
                message=str(data.get('error') or '')[:500],
                at=self.clock.now(),
                thread_id=str(data.get('threadId') or thread_id),
                background=isinstance(part, BufferingFailed),
            )
            try:
                self.store.add_failure(resource_id, memory_thread, note)
            except Exception:  # noqa: BLE001 - a failure that cannot be kept must not fail the step that reports it
                logger.warning('could not keep a failure', extra={'thread_id': thread_id, 'reason': note.reason})

    def remember_notes(
        self, resource_id: str, thread_id: str, operation: OperationType, notes: Sequence[str], detail: str
    ) -> None:
        """Keep the doubts about an accepted answer for the memory view's `recentNotes` (best effort)."""
        memory_thread = thread_id if self.settings.scope == 'thread' else None
        for note in notes:
            kept = FailureNote(
                operation_type=operation,
                reason=note,
                message=detail[:500],
                at=self.clock.now(),
                thread_id=thread_id,
                note=True,
            )
            try:
                self.store.add_failure(resource_id, memory_thread, kept)
            except Exception:  # noqa: BLE001 - a note that cannot be kept must not fail the work it describes
                logger.warning('could not keep a note', extra={'thread_id': thread_id, 'note': note})

    # -- parts -----------------------------------------------------------------------------------------------------
    def start_part(
        self,
        cycle: Cycle,
        operation: OperationType,
        tokens: int,
        record_id: str,
        thread_id: str,
        thread_ids: tuple[str, ...] | None = None,
    ) -> ObservationStart:
        """`data-om-observation-start` for a cycle that begins now (`thread_ids`: the cycle's threads, this one alone
        by default)."""
        return ObservationStart(
            cycle_id=cycle.cycle_id,
            operation_type=operation,
            started_at=cycle.started_at,
            tokens_to_observe=tokens,
            record_id=record_id,
            thread_id=thread_id,
            thread_ids=thread_ids or (thread_id,),
            config=self.marker_config(),
        )

    def buffering_start_part(
        self, cycle: Cycle, operation: OperationType, tokens: int, record_id: str, thread_id: str
    ) -> BufferingStart:
        """`data-om-buffering-start` for background buffering queued now."""
        return BufferingStart(
            cycle_id=cycle.cycle_id,
            operation_type=operation,
            started_at=cycle.started_at,
            tokens_to_buffer=tokens,
            record_id=record_id,
            thread_id=thread_id,
            thread_ids=(thread_id,),
            config=self.marker_config(),
        )

    def failed_part(
        self,
        cycle: Cycle | None,
        operation: OperationType,
        tokens: int,
        error: Exception | str,
        record_id: str,
        thread_id: str,
        *,
        reason: FailureReason | None = None,
        retrying: bool = False,
        usage: CallUsage | None = None,
    ) -> ObservationFailed:
        """`data-om-observation-failed` for a cycle that committed nothing."""
        if reason is None:
            reason = 'timeout' if isinstance(error, DeadlineExceededError) else 'error'
        return ObservationFailed(
            cycle_id=cycle.cycle_id if cycle is not None else self.new_id(),
            operation_type=operation,
            failed_at=self.clock.now(),
            duration_ms=self.elapsed_ms(cycle),
            tokens_attempted=tokens,
            error=error if isinstance(error, str) else (str(error) or type(error).__name__),
            reason=reason,
            retrying=retrying,
            record_id=record_id,
            thread_id=thread_id,
            usage=usage,
        )


def before_step_input(messages: Sequence[Message], step_input: Sequence[Message]) -> list[Message]:
    """What a step may observe: its unobserved messages up to (not including) its own new input.

    The Actor must answer the new input, so it stays in the step's messages; observing it in the same step would show
    it twice, once in the observations and once as a message. It is observed with the turn that answers it.
    """
    own = {m.id for m in step_input}
    observable: list[Message] = []
    for message in messages:
        if message.id in own:
            break
        observable.append(message)
    return observable


def has_pending_tool_call(messages: Sequence[Message]) -> bool:
    """A tool call in the newest message with no result yet defers observation until the result arrives."""
    if not messages:
        return False
    results = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolResultPart)}
    return any(isinstance(p, ToolCallPart) and p.tool_call_id not in results for p in messages[-1].parts)
