"""The chat service behind `POST /threads/{threadId}/chat`: one step, one Actor call and one turn, in one request.

`chat` saves the user's message first (through `prepare_step`, which also observes and reflects when due), calls the
Actor model (`actorModel`) with the memory system message and the unobserved messages, then saves the reply
(`complete_turn`).

Failure rule (CONTRACT §2): once the user's message is saved, trouble is reported inside the answer, never as an
error that hides the write. So when the Actor model fails, `chat` returns `reply=None` and a
`data-om-actor-failed` part (`{type, data: {error, message, retryable, model}}`); the client may retry the same
message (same id: the retry does not save it twice). When the reply cannot be saved, it is still returned, with a
`data-om-reply-unsaved` part; sending it to `/turns` under its id saves it. Errors before anything is written
(an invalid message, another resource's thread, a conflicting id) raise as usual.

Tools: `tools` are declared to the Actor as given. With `retrieval` on, the `recall` tool is offered too and run here:
when the Actor answers with recall calls only, they are run (an invalid call becomes an `{error}` result the model
can correct), the results are sent back, and the Actor is asked again, for at most `MAX_TOOL_ROUNDS` rounds. Each
round is saved as messages of the turn (an assistant message with the `tool-call` parts, then a `tool` message with
the `tool-result` parts) before the final reply. Any other function call comes back as a `tool-call` part of the
reply, for the client to run and send to `/turns`.

Working memory (`workingMemory`): its block is appended to the system message, and unless it is read-only (in the
configuration or for this request) the Actor also gets `updateWorkingMemory`, run here like `recall`: a refused
update becomes an `{success: false, error}` result the model can correct, and changes nothing. After the thread's
first turn, `generateTitle` queues a title job (`data-om-scheduled` names `title`).
"""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from om_lib.conversation import Conversation
from om_lib.errors import InvalidInputError, ModelError, OMError
from om_lib.llm import (
    Content,
    ContentPart,
    FunctionCall,
    FunctionDeclaration,
    FunctionResponse,
    InlineBlob,
    ModelRequest,
    ModelResponse,
)
from om_lib.messages import FilePart, ImagePart, Message, TextPart, ToolCallPart, ToolResultPart
from om_lib.parts import ActorFailed, CycleParts, ReplyUnsaved
from om_lib.recall import RecallRequest, recall
from om_lib.records import record_key
from om_lib.working_memory import TOOL_NAME as WORKING_MEMORY_TOOL
from om_lib.working_memory import WorkingMemory

logger = logging.getLogger(__name__)

# What the Actor is, in our words; the memory system message (observations, working memory, hints) follows it.
ACTOR_SYSTEM_PROMPT = (
    'You are a helpful assistant in a long-running conversation with one user. '
    'Answer the latest user message directly and accurately. '
    'Use the memory below as what you already know about this user and earlier turns; '
    'prefer it over guessing, and say so plainly when you do not know something.'
)
# The Actor always gets at least this long, even when observation used up the request's budget: an answer late is
# better than no answer, and the API's budget (20 s by default) plus this stays under API Gateway's 29 s.
MIN_ACTOR_S = 8.0
# Attachments inlined into the Actor's request, per attachment.
MAX_INLINE_BYTES = 12 * 1024 * 1024
# Rounds of recall calls run for one chat turn; a model still asking after that gets an answer without them.
MAX_TOOL_ROUNDS = 4


@dataclass
class ChatResult:
    """The Actor's reply (None when the Actor failed after the user's message was saved) and this call's parts."""

    reply: Message | None
    parts: CycleParts
    saved_ids: list[str] = field(default_factory=list)
    actor_calls: int = 0


class ChatService:
    """Steps, Actor call and turns in one call, over a `Conversation` (the same step and turn as `/steps`, `/turns`).

    Args:
        conversation: Steps and turns; its engine's router, settings (`actor_model`), counter and clock serve the Actor.
        id_factory: Makes new message ids (server ids are `msg_<uuid hex>`).
        system_prompt: The Actor's own instructions, placed before the memory system message.
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        id_factory: Callable[[], str] | None = None,
        system_prompt: str = ACTOR_SYSTEM_PROMPT,
    ) -> None:
        self.conversation = conversation
        self.engine = conversation.engine
        self.semantic = conversation.semantic
        self._new_id = id_factory or (lambda: f'msg_{uuid.uuid4().hex}')
        self.system_prompt = system_prompt

    def chat(
        self,
        resource_id: str,
        thread_id: str,
        message: Message,
        *,
        tools: Sequence[FunctionDeclaration] = (),
        step_number: int = 0,
        read_only: bool = False,
    ) -> ChatResult:
        """Save `message`, ask the Actor, save and return its reply.

        Args:
            resource_id: The owner of the thread.
            thread_id: The thread (created on first use).
            message: The user's message (with its final id and time).
            tools: Function declarations exposed to the Actor (run by the client; only `recall` is run here).
            step_number: The step's number, echoed in the status part.
            read_only: Working memory is shown but the Actor gets no tool to change it (this request only).

        Returns:
            ChatResult with the reply (or None and a `data-om-actor-failed` part when the Actor failed).

        Raises:
            InvalidInputError, ThreadNotFoundError, MessageConflictError, StorageError: before anything was saved.
        """
        engine = self.engine
        started = engine.clock.monotonic()
        step = self.conversation.step(resource_id, thread_id, [message], step_number=step_number, read_only=read_only)
        parts = CycleParts(list(step.parts))
        system = self.system_prompt + ('\n\n' + step.system if step.system.strip() else '')
        # The step's tools (recall, updateWorkingMemory) run here; the caller's own go back to the caller.
        internal = {t.name for t in step.tools}
        offered = [t for t in tools if t.name not in internal] + step.tools
        retrieval = engine.settings.retrieval
        recall_scope: Literal['thread', 'resource'] = retrieval.scope if retrieval is not None else 'thread'
        deadline = max(started + engine.time_budget_s, engine.clock.monotonic() + MIN_ACTOR_S)
        turn_messages: list[Message] = []  # the tool rounds of this turn, saved before the reply
        actor_calls = 0
        while True:
            history = [*step.messages, *turn_messages]
            request = ModelRequest(
                purpose='actor',
                system=system,
                contents=tuple(self._contents(history, resource_id)),
                tools=tuple(offered),
                source_messages=tuple(history),
            )
            input_tokens = engine.counter.count_messages(history) + engine.counter.count_string(system)
            actor_calls += 1
            try:
                response = engine.router.generate(
                    engine.settings.actor_model, request, input_tokens=input_tokens, deadline=deadline
                )
            except ModelError as exc:
                # The tool rounds are not saved: a retry of the same message runs them again.
                logger.warning('actor failed', extra={'thread_id': thread_id, 'error': exc.code})
                parts.add(ActorFailed(error=exc.code, retryable=exc.retryable, model=getattr(exc, 'model', None)))
                return ChatResult(None, parts, list(step.saved_ids), actor_calls=actor_calls)
            calls = response.function_calls
            runs_tools = bool(calls) and all(c.name in internal for c in calls)
            if not runs_tools:
                break
            if actor_calls > MAX_TOOL_ROUNDS:
                # Still asking after every round was spent: keep its text, leave no unanswered call behind.
                logger.warning('tool rounds exhausted', extra={'thread_id': thread_id, 'rounds': MAX_TOOL_ROUNDS})
                response = ModelResponse(text=response.text, model=response.model, usage=response.usage)
                break
            working = self.conversation.working
            turn_messages.extend(self._recall_round(response, resource_id, thread_id, recall_scope, working))

        reply = self._reply(response)
        saved = list(step.saved_ids)
        try:
            turn = self.conversation.turn(resource_id, thread_id, [*turn_messages, reply])
        except OMError as exc:
            # The answer exists and the user's message is saved; losing the reply now would hide both.
            logger.warning('reply not saved', extra={'thread_id': thread_id, 'error': exc.code})
            parts.add(ReplyUnsaved(error=exc.code, retryable=exc.retryable))
            return ChatResult(reply, parts, saved, actor_calls=actor_calls)
        parts.extend(turn.parts)
        stored = next((m for m in turn.saved if m.id == reply.id), reply)
        return ChatResult(stored, parts, [*saved, *(m.id for m in turn_messages), reply.id], actor_calls=actor_calls)

    # -- the recall tool --------------------------------------------------------------------------------------------
    def _recall_round(
        self,
        response: ModelResponse,
        resource_id: str,
        thread_id: str,
        scope: Literal['thread', 'resource'],
        working: WorkingMemory | None = None,
    ) -> list[Message]:
        """Run the response's tool calls (recall, updateWorkingMemory): the assistant tool-call message and the
        tool-result message."""
        call_parts: list[TextPart | ToolCallPart] = [TextPart(text=response.text)] if response.text else []
        result_parts: list[ToolResultPart] = []
        for call in response.function_calls:
            call_id = call.id or f'call_{uuid.uuid4().hex}'
            call_parts.append(ToolCallPart(tool_call_id=call_id, tool_name=call.name, args=call.args))
            if call.name == WORKING_MEMORY_TOOL and working is not None:
                result, failed = working.run_tool(call.args, resource_id, thread_id)
            else:
                result, failed = self._run_recall(call, resource_id, thread_id, scope)
            result_parts.append(
                ToolResultPart(tool_call_id=call_id, tool_name=call.name, result=result, is_error=failed)
            )
        now = self.engine.clock.now()
        return [
            Message(id=self._new_id(), role='assistant', created_at=now, parts=tuple(call_parts)),
            Message(id=self._new_id(), role='tool', created_at=now, parts=tuple(result_parts)),
        ]

    def _run_recall(
        self, call: FunctionCall, resource_id: str, thread_id: str, scope: Literal['thread', 'resource']
    ) -> tuple[dict[str, Any], bool]:
        """The tool's returns, or `{error}` (and True) for a call the model can correct or a failed read."""
        retrieval = self.engine.settings.retrieval
        try:
            request = RecallRequest.from_args(call.args if isinstance(call.args, dict) else {})
            result = recall(
                self.engine.store,
                self.engine.counter,
                resource_id=resource_id,
                current_thread_id=thread_id,
                request=request,
                scope=scope,
                semantic=self.semantic if retrieval is not None and retrieval.vector else None,
                obscure_thread_ids=self.engine.settings.obscure_thread_ids,
                memory_key=record_key(self.engine.settings.scope, resource_id, thread_id),
            )
            return result, False
        except InvalidInputError as exc:
            return {'error': str(exc)}, True
        except OMError as exc:
            logger.warning('recall failed', extra={'thread_id': thread_id, 'error': exc.code})
            return {'error': 'recall could not read the history right now; answer without it or try again'}, True

    # -- request and reply ------------------------------------------------------------------------------------------
    def _reply(self, response: ModelResponse) -> Message:
        reply_parts: list[TextPart | ToolCallPart] = []
        if response.text:
            reply_parts.append(TextPart(text=response.text))
        for call in response.function_calls:
            reply_parts.append(
                ToolCallPart(tool_call_id=call.id or f'call_{uuid.uuid4().hex}', tool_name=call.name, args=call.args)
            )
        if not reply_parts:
            reply_parts.append(TextPart(text=''))
        return Message(
            id=self._new_id(), role='assistant', created_at=self.engine.clock.now(), parts=tuple(reply_parts)
        )

    def _contents(self, messages: Sequence[Message], resource_id: str) -> list[Content]:
        contents: list[Content] = []
        for message in messages:
            role: Literal['user', 'model'] = 'model' if message.role == 'assistant' else 'user'
            converted = [p for p in (self._part(part, message, resource_id) for part in message.parts) if p is not None]
            if not converted:
                continue
            # Gemini wants turns to alternate; consecutive messages of one side become one turn.
            if contents and contents[-1].role == role:
                contents[-1] = Content(role=role, parts=(*contents[-1].parts, *converted))
            else:
                contents.append(Content(role=role, parts=tuple(converted)))
        return contents

    def _part(self, part: Any, message: Message, resource_id: str) -> ContentPart | None:
        if isinstance(part, TextPart):
            if not part.text:
                return None
            return f'[system] {part.text}' if message.role == 'system' else part.text
        if isinstance(part, ToolCallPart):
            args = part.args if isinstance(part.args, dict) else {'value': part.args}
            return FunctionCall(name=part.tool_name, args=args, id=part.tool_call_id)
        if isinstance(part, ToolResultPart):
            result = part.result if isinstance(part.result, dict) else {'result': part.result}
            return FunctionResponse(name=part.tool_name, response=result, id=part.tool_call_id)
        if isinstance(part, ImagePart | FilePart):
            return self._attachment(part, resource_id)
        return None  # reasoning is the model's own scratchpad; it is not sent back

    def _attachment(self, part: ImagePart | FilePart, resource_id: str) -> ContentPart:
        mime = part.media_type or ('image/png' if isinstance(part, ImagePart) else 'application/octet-stream')
        data: bytes | None = None
        if part.data:
            try:
                data = base64.b64decode(part.data, validate=True)
            except (binascii.Error, ValueError):
                data = None
        elif part.url and part.url.startswith('s3://') and self.engine.blobs is not None:
            data = self.engine.blobs.read(part.url, max_bytes=MAX_INLINE_BYTES, resource_id=resource_id)
        if data is not None and len(data) <= MAX_INLINE_BYTES:
            return InlineBlob(mime_type=mime, data=data)
        name = part.filename or 'attachment'
        return f'[attachment {name} ({mime}) at {part.url or "inline data"}; not available to you]'
