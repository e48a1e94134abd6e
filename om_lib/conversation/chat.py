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

Time: the turn happens when the user's message says it was said (its `createdAt`, else its arrival). The Actor is
told that date, relative dates in its memory are counted from it, and the turn's own messages (tool rounds, the reply)
are dated from it on, by the time the turn took. A client asking "as of" a date (replayed history, an evaluation)
sends the message with that `createdAt`; the thread is still ordered by arrival.

Working memory (`workingMemory`): its block is appended to the system message, and unless it is read-only (in the
configuration or for this request) the Actor also gets `updateWorkingMemory`, run here like `recall`: a refused
update becomes an `{success: false, error}` result the model can correct, and changes nothing. After the thread's
first turn, `generateTitle` queues a title job (`data-om-scheduled` names `title`).

Idempotent turns: a user message is answered once. Its reply's id is derived from the message's (`reply_id_for`), so
the stored reply is found again by any later request for the same message id, which gets it back with no Actor call
and nothing stored twice. While a request answers a message it holds a claim on it in the store (a conditional write
with a lease): a concurrent request for the same message waits for that reply, or answers 409 `in_progress` when it
does not come within the request's budget. A crashed request's claim expires with its lease.

Listening (`listener`): the streamed route hears the turn as it happens, as `ChatEvent`s — the reply's id, each
`data-om-*` part when it is made (the collector's live sink), each Actor call with its text as the model writes it,
and the tool calls run here. The JSON route passes no listener; both run this same code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from om_lib.conversation.conversation import Conversation
from om_lib.engine.step import check_ids
from om_lib.errors import InvalidInputError, MessageConflictError, ModelError, OMError, TurnInProgressError
from om_lib.history.recall import RecallRequest, recall
from om_lib.history.working_memory import TOOL_NAME as WORKING_MEMORY_TOOL
from om_lib.history.working_memory import WorkingMemory
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
from om_lib.messages import FilePart, ImagePart, Message, TextPart, ToolCallPart, ToolResultPart, time_of
from om_lib.models.model_spec import model_refs
from om_lib.parts import ActorFailed, CycleParts, OMPart, ReplyUnsaved
from om_lib.records import record_key

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
# A claim on answering a message outlives the request's budget and the Actor's own time by this much: a request that
# died holding one stops blocking retries of the message after its lease.
CLAIM_MARGIN_S = 30.0
# How often a request waiting for another one's reply to the same message looks again (growing to the second value).
WAIT_POLL_S = (0.1, 0.5)


def reply_id_for(resource_id: str, thread_id: str, message_id: str) -> str:
    """The id of the reply to user message `message_id`: derived, so any request for that message finds it."""
    digest = hashlib.sha256(f'{resource_id}\x00{thread_id}\x00{message_id}\x00reply'.encode()).hexdigest()
    return f'msg_{digest[:32]}'


# -- what a listener hears --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TurnStarted:
    """The turn began (the user's message is being saved): `reply_id` is the id its reply will have."""

    reply_id: str


@dataclass(frozen=True)
class MemoryPart:
    """A `data-om-*` part, the moment it was made."""

    part: OMPart


@dataclass(frozen=True)
class ActorStarted:
    """An Actor call began (a reply, or a round of tool calls)."""


@dataclass(frozen=True)
class TextDelta:
    """The next piece of the Actor's text, as the model wrote it."""

    text: str


@dataclass(frozen=True)
class ToolCalled:
    """The Actor called a tool: `server` ones (`recall`, `updateWorkingMemory`) are run here and answered
    (`ToolAnswered`); a caller's own come back to it in the reply."""

    call: ToolCallPart
    server: bool = False


@dataclass(frozen=True)
class ToolAnswered:
    """A tool run here answered."""

    result: ToolResultPart


@dataclass(frozen=True)
class ActorFinished:
    """The Actor call ended (answered, or failed: a `data-om-actor-failed` part says so)."""


ChatEvent = TurnStarted | MemoryPart | ActorStarted | TextDelta | ToolCalled | ToolAnswered | ActorFinished
# Hears a turn as it happens. Must not raise (a listener that went away must not fail the turn).
ChatListener = Callable[[ChatEvent], None]


@dataclass
class ChatResult:
    """The Actor's reply (None when the Actor failed after the user's message was saved) and this call's parts.

    `replayed`: the message had been answered before; `reply` is the stored reply, and nothing ran or was stored.
    """

    reply: Message | None
    parts: CycleParts
    saved_ids: list[str] = field(default_factory=list)
    actor_calls: int = 0
    replayed: bool = False


def today_line(now: datetime) -> str:
    """The sentence that tells the Actor what day it is (a date, not a time: it changes once a day, so the prompt
    prefix stays cacheable)."""
    day = now.astimezone(UTC)
    return f"Today's date is {day:%A}, {day:%B} {day.day}, {day.year} (UTC)."


class _TurnClock:
    """The turn's time: the user message's time, moved on by the time the turn has taken since it started."""

    def __init__(self, wall: Callable[[], datetime]) -> None:
        self._wall = wall
        self._started = wall()
        self.said = self._started

    def said_at(self, when: datetime) -> None:
        """The user's message was said at `when` (its `createdAt`): the turn's time starts from it."""
        self.said = when

    def now(self) -> datetime:
        """The turn's current time."""
        return self.said + max(timedelta(0), self._wall() - self._started)


class ChatService:
    """Steps, Actor call and turns in one call, over a `Conversation` (the same step and turn as `/steps`, `/turns`).

    Args:
        conversation: Steps and turns; its engine's router, settings (`actor_model`), counter and clock serve the Actor.
        system_prompt: The Actor's own instructions, placed before the memory system message.
        sleep: Waits between looks at another request's progress on the same message (injectable for tests).
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        system_prompt: str = ACTOR_SYSTEM_PROMPT,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.conversation = conversation
        self.engine = conversation.engine
        self.semantic = conversation.semantic
        self.system_prompt = system_prompt
        self._sleep = sleep

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
        """Save `message`, ask the Actor, save and return its reply; a message answered before gets its stored reply.

        Args:
            resource_id: The owner of the thread.
            thread_id: The thread (created on first use).
            message: The user's message (with its final id and time).
            tools: Function declarations exposed to the Actor (run by the client; only `recall` is run here).
            step_number: The step's number, echoed in the status part.
            read_only: Working memory is shown but the Actor gets no tool to change it (this request only).
            listener: Hears the turn as it happens (`ChatEvent`s), from `TurnStarted` on: the message was claimed
                and checked (not answered, no other content under its id), so what is raised before it wrote nothing;
                later trouble saving it (a storage outage) comes after it.

        Returns:
            ChatResult with the reply (or None and a `data-om-actor-failed` part when the Actor failed).

        Raises:
            InvalidInputError, ThreadNotFoundError, MessageConflictError, StorageError: before anything was saved.
            TurnInProgressError: another request is answering this message and did not finish while this one waited.
        """
        check_ids(resource_id, thread_id)
        store, clock = self.engine.store, self.engine.clock
        reply_id = reply_id_for(resource_id, thread_id, message.id)
        owner = uuid.uuid4().hex
        lease = timedelta(seconds=self.engine.time_budget_s + MIN_ACTOR_S + CLAIM_MARGIN_S)
        give_up = clock.monotonic() + self.engine.time_budget_s
        poll = WAIT_POLL_S[0]
        while True:
            held = store.claim_turn(resource_id, thread_id, message.id, owner=owner, now=clock.now(), lease=lease)
            try:
                stored = self._stored_reply(resource_id, thread_id, message, reply_id)
            except BaseException:
                if held is None:
                    store.release_turn(resource_id, thread_id, message.id, owner=owner)
                raise
            if stored is not None:
                if held is None:
                    store.release_turn(resource_id, thread_id, message.id, owner=owner)
                return self._replay(stored, listener)
            if held is None:
                break
            # Another request is answering this message: wait for its reply (or for its claim to end).
            if clock.monotonic() + poll > give_up:
                raise TurnInProgressError(message.id)
            self._sleep(poll)
            poll = min(poll * 2, WAIT_POLL_S[1])
        try:
            return self._answer(
                resource_id,
                thread_id,
                message,
                reply_id,
                tools=tools,
                step_number=step_number,
                read_only=read_only,
                hear=_Announcer(reply_id, listener),
            )
        finally:
            store.release_turn(resource_id, thread_id, message.id, owner=owner)

    def _stored_reply(self, resource_id: str, thread_id: str, message: Message, reply_id: str) -> Message | None:
        """The reply stored for `message`, or None. A stored message of this id with other content is a conflict
        (found here, before the turn is heard of, so it is refused like any request that writes nothing)."""
        found = {m.id: m for m in self.engine.store.get_messages(resource_id, thread_id, [message.id, reply_id])}
        stored = found.get(message.id)
        if stored is not None and stored.content_hash() != message.content_hash():
            raise MessageConflictError(message.id)
        return found.get(reply_id)

    @staticmethod
    def _replay(reply: Message, listener: ChatListener | None) -> ChatResult:
        """The stored reply, told to the listener as the Actor call it came from (nothing runs, nothing is stored)."""
        if listener is not None:
            listener(TurnStarted(reply.id))
            listener(ActorStarted())
            text = reply.text()
            if text:
                listener(TextDelta(text))
            for part in reply.parts:
                if isinstance(part, ToolCallPart):
                    listener(ToolCalled(part))
            listener(ActorFinished())
        return ChatResult(reply, CycleParts(), [], actor_calls=0, replayed=True)

    def _answer(
        self,
        resource_id: str,
        thread_id: str,
        message: Message,
        reply_id: str,
        *,
        tools: Sequence[FunctionDeclaration],
        step_number: int,
        read_only: bool,
        hear: _Announcer,
    ) -> ChatResult:
        """The turn itself: the step, the Actor (with rounds of the tools run here), and the reply saved."""
        engine = self.engine
        started = engine.clock.monotonic()
        clock = _TurnClock(engine.clock.now)
        hear.start()  # the listener may answer now: the reply's id is known and nothing left can refuse the message
        parts = CycleParts(sink=hear.part if hear.listening else None)
        step = self.conversation.step(
            resource_id,
            thread_id,
            [message],
            step_number=step_number,
            read_only=read_only,
            parts=parts,
            # The Actor this turn calls (its first model): its provider decides `"auto"` idle times.
            actor_model=model_refs(engine.settings.actor_model)[0].name,
        )
        # The stored message (a retry keeps the time it was first sent with) says when this turn happens.
        clock.said_at(time_of(next((m for m in step.messages if m.id == message.id), message)))
        system = f'{self.system_prompt}\n\n{today_line(clock.said)}'
        if step.system.strip():
            system = f'{system}\n\n{step.system}'
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
            hear(ActorStarted())
            try:
                response = engine.router.generate(
                    engine.settings.actor_model,
                    request,
                    input_tokens=input_tokens,
                    deadline=deadline,
                    on_text=hear.text if hear.listening else None,
                )
            except ModelError as exc:
                # The tool rounds are not saved: a retry of the same message runs them again.
                logger.warning('actor failed', extra={'thread_id': thread_id, 'error': exc.code})
                parts.add(ActorFailed(error=exc.code, retryable=exc.retryable, model=getattr(exc, 'model', None)))
                hear(ActorFinished())
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
            round_number = len(turn_messages) // 2
            turn_messages.extend(
                self._recall_round(
                    response, resource_id, thread_id, recall_scope, working, reply_id, round_number, hear, clock
                )
            )
            hear(ActorFinished())

        reply = self._reply(response, reply_id, clock.now())
        for part in reply.parts:
            if isinstance(part, ToolCallPart):
                hear(ToolCalled(part))  # the caller's own tools: it runs them and sends the results to /turns
        hear(ActorFinished())
        saved = list(step.saved_ids)
        try:
            turn = self.conversation.turn(resource_id, thread_id, [*turn_messages, reply], parts=parts)
        except OMError as exc:
            # The answer exists and the user's message is saved; losing the reply now would hide both.
            logger.warning('reply not saved', extra={'thread_id': thread_id, 'error': exc.code})
            parts.add(ReplyUnsaved(error=exc.code, retryable=exc.retryable))
            return ChatResult(reply, parts, saved, actor_calls=actor_calls)
        stored = next((m for m in turn.saved if m.id == reply.id), reply)
        return ChatResult(stored, parts, [*saved, *(m.id for m in turn_messages), reply.id], actor_calls=actor_calls)

    # -- the recall tool --------------------------------------------------------------------------------------------
    def _recall_round(
        self,
        response: ModelResponse,
        resource_id: str,
        thread_id: str,
        scope: Literal['thread', 'resource'],
        working: WorkingMemory | None,
        reply_id: str,
        round_number: int,
        hear: _Announcer,
        clock: _TurnClock,
    ) -> list[Message]:
        """Run the response's tool calls (recall, updateWorkingMemory): the assistant tool-call message and the
        tool-result message (their ids derived from the reply's, so a retried turn stores them once)."""
        call_parts: list[TextPart | ToolCallPart] = [TextPart(text=response.text)] if response.text else []
        result_parts: list[ToolResultPart] = []
        for call in response.function_calls:
            call_id = call.id or f'call_{uuid.uuid4().hex}'
            called = ToolCallPart(tool_call_id=call_id, tool_name=call.name, args=call.args)
            call_parts.append(called)
            hear(ToolCalled(called, server=True))
            if call.name == WORKING_MEMORY_TOOL and working is not None:
                result, failed = working.run_tool(call.args, resource_id, thread_id)
            else:
                result, failed = self._run_recall(call, resource_id, thread_id, scope)
            answered = ToolResultPart(tool_call_id=call_id, tool_name=call.name, result=result, is_error=failed)
            result_parts.append(answered)
            hear(ToolAnswered(answered))
        now = clock.now()
        return [
            Message(id=f'{reply_id}_call{round_number}', role='assistant', created_at=now, parts=tuple(call_parts)),
            Message(id=f'{reply_id}_result{round_number}', role='tool', created_at=now, parts=tuple(result_parts)),
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
    def _reply(self, response: ModelResponse, reply_id: str, at: datetime) -> Message:
        reply_parts: list[TextPart | ToolCallPart] = []
        if response.text:
            reply_parts.append(TextPart(text=response.text))
        for call in response.function_calls:
            reply_parts.append(
                ToolCallPart(tool_call_id=call.id or f'call_{uuid.uuid4().hex}', tool_name=call.name, args=call.args)
            )
        if not reply_parts:
            reply_parts.append(TextPart(text=''))
        return Message(id=reply_id, role='assistant', created_at=at, parts=tuple(reply_parts))

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


class _Announcer:
    """Tells the listener (if any) what happens, the reply's id first (`start`)."""

    def __init__(self, reply_id: str, listener: ChatListener | None) -> None:
        self.reply_id = reply_id
        self.listener = listener

    @property
    def listening(self) -> bool:
        return self.listener is not None

    def start(self) -> None:
        self(TurnStarted(self.reply_id))

    def __call__(self, event: ChatEvent) -> None:
        if self.listener is not None:
            self.listener(event)

    def part(self, part: OMPart) -> None:
        self(MemoryPart(part))

    def text(self, delta: str) -> None:
        self(TextDelta(delta))
