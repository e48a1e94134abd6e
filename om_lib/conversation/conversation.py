"""A step and a turn as an agent sees them: the engine's step plus everything around it that belongs to every client.

`step` is the engine's step (memory updated, observations and unobserved messages) with the working-memory block and
(`semanticRecall`) the recalled earlier messages in the system message, and the tool declarations the Actor should
expose (recall, updateWorkingMemory). `turn` saves the
turn's outputs and starts what follows a turn (indexing for semantic search, a title after the first turn). The
`/steps` and `/turns` routes and the chat service both build on these two, so the Actor's context is built in one
place.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from om_lib.engine.engine import MemoryEngine
from om_lib.errors import OMError
from om_lib.history.recall import recall_tool
from om_lib.history.semantic import SemanticMemory, embedding_text, format_recalled
from om_lib.history.titles import after_turn as title_after_turn
from om_lib.history.working_memory import working_memory_of
from om_lib.llm import FunctionDeclaration
from om_lib.messages import Message
from om_lib.parts import CycleParts, Scheduled, SemanticRecallFailed
from om_lib.records import OMRecord

logger = logging.getLogger(__name__)


@dataclass
class AgentStep:
    """What the Actor gets for a step: `system` (memory and working memory), `messages`, the `tools` to expose."""

    thread_id: str
    resource_id: str
    system: str
    messages: list[Message]
    tools: list[FunctionDeclaration]
    parts: CycleParts
    record: OMRecord | None
    saved_ids: list[str] = field(default_factory=list)


@dataclass
class AgentTurn:
    """What a turn saved, its parts (`data-om-scheduled` names what it queued) and what it queued."""

    saved: list[Message]
    parts: CycleParts
    scheduled: list[str]


class Conversation:
    """Steps and turns with working memory, tools, semantic indexing and titles, over a `MemoryEngine`."""

    def __init__(self, engine: MemoryEngine, *, semantic: SemanticMemory | None = None) -> None:
        self.engine = engine
        # Semantic search (`retrieval.vector`, `semanticRecall`): recall's search mode, recalled context, indexing.
        self.semantic = semantic
        settings = engine.settings
        self.working = working_memory_of(settings.working_memory, engine.store, engine.clock)

    def recall_declaration(self) -> FunctionDeclaration | None:
        """The `recall` tool (retrieval on): search mode is described only when vectors can be searched."""
        retrieval = self.engine.settings.retrieval
        if retrieval is None:
            return None
        return recall_tool(retrieval.scope, vector=retrieval.vector and self.semantic is not None)

    def step(
        self,
        resource_id: str,
        thread_id: str,
        messages: Sequence[Message],
        *,
        step_number: int = 0,
        read_only: bool = False,
        parts: CycleParts | None = None,
        actor_model: str | None = None,
    ) -> AgentStep:
        """Save the step's input, update memory when due, and return the Actor's context.

        `read_only`: working memory is shown, but the Actor gets no tool to change it (this request only).
        `parts`: the collector to report into (with its live sink, if any); a new one by default.
        `actor_model`: the model the Actor runs (`provider/model`), when the caller says (om_lib/context/idle.py).
        """
        step = self.engine.prepare_step(
            resource_id, thread_id, messages, step_number=step_number, parts=parts, actor_model=actor_model
        )
        system = step.system
        parts = step.parts
        recalled = self._semantic_recall(resource_id, thread_id, messages, step.messages, parts)
        if recalled:
            system = f'{system}\n\n{recalled}' if system.strip() else recalled
        tools: list[FunctionDeclaration] = []
        recall = self.recall_declaration()
        if recall is not None:
            tools.append(recall)
        working = self.working
        if working is not None:
            block = working.system_text(resource_id, thread_id, read_only=read_only)
            system = f'{system}\n\n{block}' if system.strip() else block
            tools.extend(working.tools(read_only=read_only))
        return AgentStep(
            step.thread_id,
            step.resource_id,
            system,
            step.messages,
            tools,
            parts,
            step.record,
            step.saved_ids,
        )

    def _semantic_recall(
        self,
        resource_id: str,
        thread_id: str,
        step_input: Sequence[Message],
        in_context: Sequence[Message],
        parts: CycleParts,
    ) -> str:
        """`semanticRecall`: earlier messages similar to the step's newest user message, as a system-message section.

        Messages already in the Actor's context are left out. A failure (the embedding model is down) costs the
        Actor this context only: it is logged and reported as a `data-om-semantic-recall-failed` part.
        """
        settings = self.engine.settings.semantic_recall
        latest = next((m for m in reversed(step_input) if m.role == 'user'), None)
        query = embedding_text(latest) if latest is not None else ''
        if self.semantic is None or settings is None or not query or latest is None:
            return ''
        try:
            recalled = self.semantic.recall_context(
                resource_id,
                thread_id,
                query,
                settings,
                exclude_ids={m.id for m in in_context} | {latest.id},
                catch_up=False,  # what the thread's jobs have not indexed yet is in the Actor's context already
            )
        except OMError as exc:
            logger.warning('semantic recall failed', extra={'thread_id': thread_id, 'error': exc.code})
            parts.add(SemanticRecallFailed(error=exc.code, retryable=exc.retryable))
            return ''
        return format_recalled(recalled, thread_id)

    def turn(
        self, resource_id: str, thread_id: str, outputs: Sequence[Message], *, parts: CycleParts | None = None
    ) -> AgentTurn:
        """Save the turn's outputs; queue what is due (background memory work, indexing, a title).

        `parts`: the collector to report into (a new one by default); the returned turn's parts are this turn's only.
        """
        before = len(parts) if parts is not None else 0
        turn = self.engine.complete_turn(resource_id, thread_id, outputs, parts=parts)
        parts = turn.parts
        if self.semantic is not None:
            self.semantic.schedule(resource_id, thread_id)  # embed the turn's messages, off the path
        scheduled = list(turn.scheduled)
        if title_after_turn(self.engine.rt, resource_id, thread_id, turn.saved):
            scheduled.append('title')
        if scheduled:
            parts.add(Scheduled(operations=tuple(scheduled)))
        return AgentTurn(list(turn.saved), CycleParts(parts.items[before:]), scheduled)
