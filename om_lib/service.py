"""`MemoryService`: the one entry point of the edges (API routes, workers, `om serve`, the CLI).

Each method is one thing a client or a worker asks for; it holds the memory policy around it (what a step shows,
what an erase removes, what a turn starts), so the edges only parse, authorize and shape answers. It raises the
`OMError`s of `om_lib.errors` (ThreadNotFoundError, InvalidInputError, …), which the edges map to statuses.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from om_lib import uploads
from om_lib.config import ResolvedOMConfig, SemanticRecallSettings
from om_lib.conversation.chat import (
    ActorFinished,
    ActorStarted,
    ChatEvent,
    ChatListener,
    ChatResult,
    ChatService,
    MemoryPart,
    TextDelta,
    ToolAnswered,
    ToolCalled,
    TurnStarted,
)
from om_lib.conversation.conversation import AgentStep, AgentTurn, Conversation
from om_lib.engine.engine import MemoryEngine, OmStatus
from om_lib.engine.jobs import QUIET_AFTER
from om_lib.errors import (
    InvalidInputError,
    OMError,
    RetrievalDisabledError,
    ThreadNotFoundError,
    WorkingMemoryDisabledError,
)
from om_lib.events import lifecycle_events
from om_lib.history import history
from om_lib.history.history import DEFAULT_PER_PAGE, DateRange, Include
from om_lib.history.recall import RecallRequest, recall
from om_lib.history.semantic import SemanticMemory
from om_lib.history.threads import list_resource_threads
from om_lib.history.working_memory import MAX_WORKING_MEMORY_BYTES, WorkingMemory, WorkingMemoryView
from om_lib.llm import FunctionDeclaration
from om_lib.messages import Message
from om_lib.parts import FAILED_TYPES, Activation, BufferingEnd, CycleParts, ObservationEnd
from om_lib.ports import EventPublisher
from om_lib.records import OMRecord, Thread, record_key
from om_lib.uploads import Upload
from om_lib.work import Job

logger = logging.getLogger(__name__)

WORKING_MEMORY_KEY = 'workingMemory'
WORKFLOW_TASKS = frozenset({'check', 'reflect', 'validate', 'commit', 'release'})
OperationStatus = Literal['done', 'nothing_to_do', 'busy', 'failed']


@dataclass
class OperationResult:
    """What an operation a client asked for did (`POST …/memory/observe | reflect | buffer`).

    `status`: `done` (something was committed or buffered), `nothing_to_do` (a retry, or nothing left), `busy`
    (another worker held the memory past this request's budget) or `failed` (the model failed; nothing changed).
    """

    status: OperationStatus
    parts: CycleParts
    record: OMRecord | None


def operation_status(parts: CycleParts) -> OperationStatus:
    """The status an operation's parts add up to."""
    made = parts.own()
    if any(p.kind() in (ObservationEnd.TYPE, BufferingEnd.TYPE, Activation.TYPE) for p in made):
        return 'done'
    failures = [p.data() for p in made if p.kind() in FAILED_TYPES and not p.data().get('retrying')]
    if any(f.get('reason') == 'busy' for f in failures):
        return 'busy'
    return 'failed' if failures else 'nothing_to_do'


class MemoryService:
    """Observational memory as a service: conversation, memory, history, threads, working memory, background work.

    Every outcome a call makes (observation, reflection, buffering, activation, a failure) is also published as a
    lifecycle event, once, at the end of the call that made it (om_lib/events.py), when `events` is given.

    Args:
        engine: The memory engine (configuration and ports).
        semantic: Semantic search over messages, when `retrieval.vector` or `semanticRecall` is on.
        events: Where lifecycle events go (an EventBridge bus in AWS); None publishes nothing.
    """

    def __init__(
        self, engine: MemoryEngine, *, semantic: SemanticMemory | None = None, events: EventPublisher | None = None
    ) -> None:
        self.engine = engine
        self.semantic = semantic
        self.events = events
        self.conversation = Conversation(engine, semantic=semantic)
        self.chat_service = ChatService(self.conversation)

    @property
    def settings(self) -> ResolvedOMConfig:
        """The resolved configuration."""
        return self.engine.settings

    def now(self) -> Any:
        """The service's current time (its clock)."""
        return self.engine.clock.now()

    # -- conversation ----------------------------------------------------------------------------------------------
    def step(
        self,
        resource_id: str,
        thread_id: str,
        messages: Sequence[Message],
        *,
        step_number: int = 0,
        read_only: bool = False,
        actor_model: str | None = None,
    ) -> AgentStep:
        """`POST /threads/{threadId}/steps`: save the step's input, update memory when due, return the Actor's
        context. `actor_model`: the model the caller's Actor runs (`provider/model`), when it says."""
        step = self.conversation.step(
            resource_id, thread_id, messages, step_number=step_number, read_only=read_only, actor_model=actor_model
        )
        self.publish(resource_id, step.parts)
        return step

    def turn(self, resource_id: str, thread_id: str, outputs: Sequence[Message]) -> AgentTurn:
        """`POST /threads/{threadId}/turns`: save the turn's outputs; queue what is due."""
        turn = self.conversation.turn(resource_id, thread_id, outputs)
        self.publish(resource_id, turn.parts)
        return turn

    def chat(
        self,
        resource_id: str,
        thread_id: str,
        message: Message,
        *,
        tools: Sequence[FunctionDeclaration] = (),
        step_number: int = 0,
        read_only: bool = False,
        listener: ChatListener | None = None,
    ) -> ChatResult:
        """`POST /threads/{threadId}/chat`: a step, the Actor call and the turn in one call; a message answered before
        gets its stored reply. `listener` hears the turn as it happens (the streamed answer); JSON passes none."""
        result = self.chat_service.chat(
            resource_id,
            thread_id,
            message,
            tools=tools,
            step_number=step_number,
            read_only=read_only,
            listener=listener,
        )
        self.publish(resource_id, result.parts)
        return result

    # -- memory ----------------------------------------------------------------------------------------------------
    def memory(self, resource_id: str, thread_id: str) -> dict[str, Any]:
        """`GET /threads/{threadId}/memory` (CONTRACT §2)."""
        return self.engine.memory_view(resource_id, thread_id)

    def generations(self, resource_id: str, thread_id: str, *, limit: int = 10) -> dict[str, Any]:
        """`GET /threads/{threadId}/memory/generations`: the memory's generations, newest first (CONTRACT §2)."""
        return self.engine.generations_view(resource_id, thread_id, limit=limit)

    def observe(self, resource_id: str, thread_id: str, imported: Sequence[Message] | None = None) -> OperationResult:
        """`POST /threads/{threadId}/memory/observe`: observe now. Without `imported`, the thread's unobserved
        messages (below the threshold too); with it, messages imported from elsewhere (with their own dates), observed
        into this thread's memory without being added to its messages (om_lib/engine/jobs.py)."""
        if imported:
            record, parts = self.engine.observe_imported(resource_id, thread_id, imported)
        else:
            record, parts = self.engine.observe_now(resource_id, thread_id, wait=True)
        self.engine.rt.remember_failures(resource_id, thread_id, parts)
        self.publish(resource_id, parts)
        return OperationResult(operation_status(parts), parts, record)

    def reflect(self, resource_id: str, thread_id: str) -> OperationResult:
        """`POST /threads/{threadId}/memory/reflect`: reflect the memory now, below the threshold too."""
        record, parts = self.engine.reflect_asked(resource_id, thread_id)
        self.engine.rt.remember_failures(resource_id, thread_id, parts)
        self.publish(resource_id, parts)
        return OperationResult(operation_status(parts), parts, record)

    def buffer(self, resource_id: str, thread_id: str) -> OperationResult:
        """`POST /threads/{threadId}/memory/buffer`: buffer the unbuffered messages now, as one chunk."""
        record, parts = self.engine.buffer_asked(resource_id, thread_id)
        self.engine.rt.remember_failures(resource_id, thread_id, parts)
        self.publish(resource_id, parts)
        return OperationResult(operation_status(parts), parts, record)

    def recall(self, resource_id: str, thread_id: str, request: RecallRequest) -> dict[str, Any]:
        """`POST /recall`: the recall tool for a thread of a resource (retrieval mode must be on)."""
        retrieval = self.settings.retrieval
        if retrieval is None:
            raise RetrievalDisabledError(
                'recall needs retrieval mode: set `retrieval: true` (or `{scope, vector}`) in the OM configuration'
            )
        self._require_thread(resource_id, thread_id)
        return recall(
            self.engine.store,
            self.engine.counter,
            resource_id=resource_id,
            current_thread_id=thread_id,
            request=request,
            scope=retrieval.scope,
            semantic=self.semantic if retrieval.vector else None,
            # The same ids the Actor saw in `system` (hashed in resource scope by default); real ids work too.
            obscure_thread_ids=self.settings.obscure_thread_ids,
            memory_key=record_key(self.settings.scope, resource_id, thread_id),
        )

    # -- message history -------------------------------------------------------------------------------------------
    def messages(
        self, resource_id: str, thread_id: str, *, page: int, per_page: int, newest_first: bool = False
    ) -> tuple[list[tuple[Message, OmStatus]], bool]:
        """`GET /threads/{threadId}/messages`: a page in arrival order (or newest first), each message with where it
        stands in memory (`observed`, `buffered`, `unobserved`), and whether more follow."""
        self._require_thread(resource_id, thread_id)
        messages, has_more = history.page_of_messages(
            self.engine.store, resource_id, thread_id, page, per_page, newest_first=newest_first
        )
        statuses = self.engine.message_statuses(resource_id, thread_id, messages)
        return list(zip(messages, statuses, strict=True)), has_more

    def query_messages(
        self,
        resource_id: str,
        thread_id: str,
        *,
        page: int = 0,
        per_page: int | None = history.DEFAULT_PER_PAGE,
        date_range: history.DateRange | None = None,
        include: Sequence[history.Include] = (),
        vector_search_string: str | None = None,
    ) -> tuple[list[Message], bool]:
        """`POST /threads/{threadId}/messages/query`: the seed's `recall()` query."""
        return history.query_messages(
            self.engine.store,
            resource_id,
            thread_id,
            page=page,
            per_page=per_page,
            date_range=date_range,
            include=include,
            vector_search_string=vector_search_string,
            semantic=self.semantic,
            semantic_recall=self._semantic_recall_settings(),
        )

    def delete_messages(self, resource_id: str, thread_id: str, message_ids: Sequence[str] | None) -> int:
        """`DELETE /threads/{threadId}/messages`: delete by id (None: clear the thread); what was derived from them goes
        from every generation of memory and from the vectors (`om_lib.history.forgetting`), and the rest is observed
        again."""
        return history.forget_messages(
            self.engine.store,
            resource_id,
            thread_id,
            message_ids,
            now=self.now(),
            count=self.engine.counter.count_observations,
            writer=self.engine.rt.writer,
            semantic=self.semantic,
        )

    # -- threads ---------------------------------------------------------------------------------------------------
    def create_thread(
        self,
        resource_id: str,
        thread_id: str | None = None,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Thread:
        """`POST /threads`: an empty thread; `metadata.workingMemory` is the initial working memory (checked first)."""
        thread_id = thread_id or str(uuid.uuid4())
        metadata, working_memory = self._split_working_memory(resource_id, thread_id, metadata)
        thread = self.engine.store.create_thread(resource_id, thread_id, title=title, metadata=metadata, now=self.now())
        self._apply_working_memory(resource_id, thread.id, working_memory)
        return thread

    def get_thread(self, resource_id: str, thread_id: str) -> Thread:
        """`GET /threads/{threadId}`. Raises ThreadNotFoundError (also for another resource's thread)."""
        return self._require_thread(resource_id, thread_id)

    def update_thread(self, resource_id: str, thread_id: str, changes: Mapping[str, Any]) -> Thread:
        """`PATCH /threads/{threadId}`: `changes` may hold `title` and `metadata` (replaced whole).

        A title set here is pinned: the Observer's suggestions and generated titles never replace it. Clearing it
        (`null` or an empty title) un-pins it, and the thread may be titled again.
        """
        thread = self._require_thread(resource_id, thread_id)
        update: dict[str, Any] = {'updated_at': self.now()}
        working_memory: object = ...
        if 'title' in changes:
            title = (changes['title'] or '').strip() or None
            update['title'] = title
            update['title_pinned'] = title is not None
        if 'metadata' in changes:
            metadata, working_memory = self._split_working_memory(resource_id, thread_id, changes['metadata'])
            update['metadata'] = dict(metadata or {})
        updated = self.engine.store.update_thread(thread.model_copy(update=update))
        self._apply_working_memory(resource_id, thread_id, working_memory)
        return updated

    def clone_thread(
        self,
        resource_id: str,
        thread_id: str,
        *,
        new_thread_id: str | None = None,
        title: str | None = None,
        message_limit: int | None = None,
        date_range: history.DateRange | None = None,
    ) -> tuple[Thread, list[Message]]:
        """`POST /threads/{threadId}/clone`: a copy of the thread (its working memory too, in thread scope)."""
        thread, cloned = history.clone_thread(
            self.engine.store,
            resource_id,
            thread_id,
            new_thread_id=new_thread_id,
            title=title,
            message_limit=message_limit,
            date_range=date_range,
            now=self.now(),
            writer=self.engine.rt.writer,
        )
        working = self.conversation.working
        if working is not None and working.scope == 'thread':
            # Thread-scoped working memory goes with the clone (resource scope is shared already).
            source = working.get(resource_id, thread_id).value
            if source is not None:
                working.update(resource_id, thread.id, source)
        return thread, cloned

    def list_threads(
        self,
        resource_id: str,
        *,
        page: int = 0,
        per_page: int = 100,
        order_by: Literal['createdAt', 'updatedAt'] = 'createdAt',
        direction: Literal['ASC', 'DESC'] = 'DESC',
        metadata: Mapping[str, str] | None = None,
    ) -> tuple[list[Thread], bool]:
        """`GET /resources/{resourceId}/threads`: a page of the resource's threads, and whether more follow."""
        return list_resource_threads(
            self.engine.store,
            resource_id,
            page=page,
            per_page=per_page,
            order_by=order_by,
            direction=direction,
            metadata=metadata,
        )

    def erase_thread(self, resource_id: str, thread_id: str) -> None:
        """`DELETE /threads/{threadId}`: the thread, its messages, observations, vectors and attachments."""
        try:
            self.engine.store.delete_thread(resource_id, thread_id)
        finally:  # also when it was erased before: a retry after a failed vector erase must still remove them
            if self.semantic is not None:
                self.semantic.erase_thread(resource_id, thread_id)
            # Resource scope: the thread's sections leave the shared memory too (a no-op without a resource record).
            history.erase_thread_from_resource_memory(
                self.engine.store,
                resource_id,
                thread_id,
                now=self.now(),
                count=self.engine.counter.count_observations,
                writer=self.engine.rt.writer,
            )

    def upload_outlived_its_thread(self, upload: Upload) -> bool:
        """Must an uploaded attachment go: is its thread gone, or another thread of that id now (`om_lib.uploads`)?"""
        return uploads.outlived_its_thread(self.engine.store, upload)

    def erase_resource(self, resource_id: str) -> None:
        """`DELETE /resources/{resourceId}`: everything stored for the resource."""
        self.engine.store.delete_resource(resource_id)
        if self.semantic is not None:
            self.semantic.erase_resource(resource_id)

    # -- working memory --------------------------------------------------------------------------------------------
    def working_memory(self, resource_id: str, thread_id: str | None) -> WorkingMemoryView:
        """The working memory of a resource (`thread_id=None`, resource scope) or the one a thread's Actor sees."""
        working = self._working()
        if thread_id is not None:
            self._require_thread(resource_id, thread_id)
        return working.get(resource_id, thread_id)

    def update_working_memory(self, resource_id: str, thread_id: str | None, update: Any) -> WorkingMemoryView:
        """Update working memory as the Actor's tool does: Markdown replaces, JSON merges (and must fit the schema)."""
        working = self._working()
        if thread_id is not None:
            self._require_thread(resource_id, thread_id)
        return working.update(resource_id, thread_id, update)

    # -- background work -------------------------------------------------------------------------------------------
    def run_job(self, job: Job, *, deadline: float | None = None) -> CycleParts:
        """One background job (the buffer worker): observe, buffer, reflect, title, or index for semantic search."""
        if job.kind == 'embed':
            if self.semantic is None:
                logger.info('semantic search is off; embed job dropped', extra={'record_key': job.record_key})
                return CycleParts()
            self.semantic.index_thread(job.resource_id, job.thread_id, deadline=deadline)
            return CycleParts()
        parts = self.engine.run_job(job, deadline=deadline)
        self.publish(job.resource_id, parts)
        return parts

    def sweep(self, *, quiet_for: timedelta = QUIET_AFTER) -> list[Job]:
        """The scheduled sweeper: start work for quiet threads and records due for reflection."""
        return self.engine.sweep(quiet_for=quiet_for)

    def workflow_task(self, task: str, job: Job, owner: str) -> dict[str, Any]:
        """One task of the reflection workflow (`check`, `reflect`, `validate`, `commit`, `release`)."""
        if task not in WORKFLOW_TASKS:
            raise InvalidInputError(f'unknown reflection task {task!r}; expected one of {sorted(WORKFLOW_TASKS)}')
        engine = self.engine
        tasks = {
            'check': engine.workflow_check,
            'reflect': engine.workflow_reflect,
            'validate': engine.workflow_validate,
            'commit': engine.workflow_commit,
            'release': engine.workflow_release,
        }
        parts = CycleParts()
        try:
            return tasks[task](job, owner, parts)
        finally:  # a task that raises (a failing model: the workflow retries) may have made parts before it did
            self.publish(job.resource_id, parts)

    # -- lifecycle events --------------------------------------------------------------------------------------------
    def publish(self, resource_id: str, parts: CycleParts) -> None:
        """Publish the outcomes among `parts` that this call made (not the ones background work kept for it, which
        were published where they were made). Never raises: the outcomes have happened whatever becomes of the
        events."""
        if self.events is None:
            return
        events = lifecycle_events(resource_id, parts.own())
        if not events:
            return
        try:
            self.events.publish(events)
        except Exception:  # noqa: BLE001 - an adapter that breaks its promise still must not fail the request
            logger.exception('lifecycle events not published', extra={'events': len(events)})

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _require_thread(self, resource_id: str, thread_id: str) -> Thread:
        thread = self.engine.store.get_thread(resource_id, thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        return thread

    def _working(self) -> WorkingMemory:
        working = self.conversation.working
        if working is None:
            raise WorkingMemoryDisabledError(
                'working memory is off: set `workingMemory: {"enabled": true}` (with a `template` or a `schema`) in '
                'the OM configuration'
            )
        return working

    def _split_working_memory(
        self, resource_id: str, thread_id: str, metadata: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, object]:
        """Split `metadata.workingMemory` (seed 003: the initial working memory) off the metadata, checked first.

        With working memory on, the value is validated before anything is written (a refused request writes nothing)
        and is not kept in the metadata: it lives in working memory, where the Actor's updates go. Returns the
        metadata to store and the update to apply (`...` for none).
        """
        working = self.conversation.working
        if working is None or not metadata or WORKING_MEMORY_KEY not in metadata:
            return metadata, ...
        update = metadata[WORKING_MEMORY_KEY]
        working.check(update, working.get(resource_id, thread_id).value)
        return {k: v for k, v in metadata.items() if k != WORKING_MEMORY_KEY}, update

    def _apply_working_memory(self, resource_id: str, thread_id: str, update: object) -> None:
        if update is ... or self.conversation.working is None:
            return
        self.conversation.working.update(resource_id, thread_id, update)

    def _semantic_recall_settings(self) -> SemanticRecallSettings | None:
        """`semanticRecall` as configured; with only `retrieval: {vector: true}`, the defaults in retrieval's scope."""
        settings = self.settings
        if settings.semantic_recall is not None or settings.retrieval is None:
            return settings.semantic_recall
        return dataclasses.replace(history.DEFAULT_SEMANTIC_RECALL, scope=settings.retrieval.scope)


# The request types of the service's methods, for the edges.
__all__ = [
    'DEFAULT_PER_PAGE',
    'ActorFinished',
    'ActorStarted',
    'ChatEvent',
    'ChatListener',
    'ChatResult',
    'MemoryPart',
    'TextDelta',
    'ToolAnswered',
    'ToolCalled',
    'TurnStarted',
    'MAX_WORKING_MEMORY_BYTES',
    'WORKING_MEMORY_KEY',
    'DateRange',
    'Include',
    'MemoryService',
    'OMError',
    'OmStatus',
    'OperationResult',
    'RecallRequest',
]
