"""The API's bodies as pydantic models (docs/api.md): camelCase on the wire, snake_case in Python.

Answers are parsed leniently (`extra='allow'`): a field the server adds later is kept, not refused, so an older
client keeps working against a newer server. Messages get a client-side id when created (`msg_<uuid hex>`), so
sending the same message again is a no-op on the server and every write is safe to retry.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.alias_generators import to_camel

Role = Literal['user', 'assistant', 'system', 'tool']
OMStatus = Literal['observed', 'buffered', 'unobserved']


def new_message_id() -> str:
    """A fresh message id, in the server's style (`msg_<uuid hex>`)."""
    return f'msg_{uuid.uuid4().hex}'


class WireModel(BaseModel):
    """camelCase on the wire, snake_case attributes, unknown fields kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra='allow')

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the API expects (camelCase, no None fields)."""
        return self.model_dump(mode='json', by_alias=True, exclude_none=True)


# -- message parts --------------------------------------------------------------------------------------------------
class TextPart(WireModel):
    """Plain text."""

    type: Literal['text'] = 'text'
    text: str


class ImagePart(WireModel):
    """An image by `url` (`https://`, `s3://` from an attachment upload) and/or inline base64 `data`."""

    type: Literal['image'] = 'image'
    media_type: str | None = None
    url: str | None = None
    data: str | None = None
    filename: str | None = None
    width: int | None = None
    height: int | None = None
    size: int | None = None


class FilePart(WireModel):
    """A file by `url` and/or inline base64 `data`."""

    type: Literal['file'] = 'file'
    media_type: str | None = None
    url: str | None = None
    data: str | None = None
    filename: str | None = None
    size: int | None = None


class ToolCallPart(WireModel):
    """The Actor asked for a tool to be run."""

    type: Literal['tool-call'] = 'tool-call'
    tool_call_id: str
    tool_name: str
    args: Any = Field(default_factory=dict)


class ToolResultPart(WireModel):
    """A tool's answer to a call."""

    type: Literal['tool-result'] = 'tool-result'
    tool_call_id: str
    tool_name: str
    result: Any = None
    is_error: bool = False


class ReasoningPart(WireModel):
    """Model reasoning (never counted toward thresholds)."""

    type: Literal['reasoning'] = 'reasoning'
    text: str = ''


class OtherPart(WireModel):
    """A part type this client does not know (kept as sent)."""

    type: str


_PART_TYPES = {'text', 'image', 'file', 'tool-call', 'tool-result', 'reasoning'}


def _part_tag(value: Any) -> str:
    kind = value.get('type') if isinstance(value, dict) else getattr(value, 'type', None)
    return kind if kind in _PART_TYPES else 'other'


Part = Annotated[
    Annotated[TextPart, Tag('text')]
    | Annotated[ImagePart, Tag('image')]
    | Annotated[FilePart, Tag('file')]
    | Annotated[ToolCallPart, Tag('tool-call')]
    | Annotated[ToolResultPart, Tag('tool-result')]
    | Annotated[ReasoningPart, Tag('reasoning')]
    | Annotated[OtherPart, Tag('other')],
    Discriminator(_part_tag),
]


class Message(WireModel):
    """A conversation message. `content="text"` is shorthand for one text part; `id` is assigned here if absent.

    `om_status` (`observed`, `buffered`, `unobserved`) is filled in by message listings once the server reports it.
    """

    id: str = Field(default_factory=new_message_id, min_length=1)
    role: Role
    created_at: datetime | None = None
    parts: list[Part] = Field(default_factory=list)
    om_status: OMStatus | None = None

    @model_validator(mode='before')
    @classmethod
    def _content_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and 'content' in data:
            data = dict(data)
            content = data.pop('content')
            if content is not None:
                if not isinstance(content, str):
                    raise ValueError('`content` must be a string; use `parts` for anything else')
                if data.get('parts'):
                    raise ValueError('send either `content` or `parts`, not both')
                data['parts'] = [{'type': 'text', 'text': content}]
        return data

    @classmethod
    def user(cls, text: str, **fields: Any) -> Message:
        """A user message with one text part."""
        return cls(role='user', parts=[TextPart(text=text)], **fields)

    @classmethod
    def assistant(cls, text: str, **fields: Any) -> Message:
        """An assistant message with one text part."""
        return cls(role='assistant', parts=[TextPart(text=text)], **fields)

    @classmethod
    def system(cls, text: str, **fields: Any) -> Message:
        """A system message with one text part."""
        return cls(role='system', parts=[TextPart(text=text)], **fields)

    def text(self) -> str:
        """The text parts joined by newlines."""
        return '\n'.join(p.text for p in self.parts if isinstance(p, TextPart))

    def to_wire(self) -> dict[str, Any]:
        """The message as the API takes it (`omStatus` is an answer-only field)."""
        return self.model_dump(mode='json', by_alias=True, exclude_none=True, exclude={'om_status'})


MessageLike = Message | dict[str, Any] | str


def as_message(value: MessageLike, *, role: Role = 'user') -> Message:
    """A `Message` from a model, a dict (wire or Python names) or plain text (a `role` message)."""
    if isinstance(value, Message):
        return value
    if isinstance(value, str):
        return Message(role=role, parts=[TextPart(text=value)])
    return Message.model_validate(value)


# -- data-om-* parts and answers ------------------------------------------------------------------------------------
class DataPart(WireModel):
    """A `data-om-*` part of an answer (status, observation start/end/failed, buffering, activation ...)."""

    type: str
    data: dict[str, Any] = Field(default_factory=dict)


class _WithParts(WireModel):
    parts: list[DataPart] = Field(default_factory=list)

    def parts_of(self, kind: str) -> list[DataPart]:
        """The parts of one type, e.g. `parts_of('data-om-observation-end')`."""
        kind = kind if kind.startswith('data-') else f'data-om-{kind}'
        return [p for p in self.parts if p.type == kind]

    @property
    def status(self) -> dict[str, Any] | None:
        """The `data-om-status` part's data (token windows and thresholds), if the answer has one."""
        found = self.parts_of('data-om-status')
        return found[-1].data if found else None

    @property
    def failures(self) -> list[DataPart]:
        """`data-om-observation-failed` and `-buffering-failed` parts: trouble after the input was saved."""
        return [p for p in self.parts if p.type.endswith('-failed')]


class ToolDeclaration(WireModel):
    """A function the Actor should expose (`recall`, `updateWorkingMemory`): name, description, JSON Schema."""

    name: str
    description: str = ''
    parameters: dict[str, Any] = Field(default_factory=dict)


class StepResult(_WithParts):
    """`POST /threads/{id}/steps`: the memory system message, then the unobserved messages to send after it."""

    thread_id: str
    resource_id: str
    system: str = ''
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolDeclaration] = Field(default_factory=list)


class MemoryOperation(WireModel):
    """`POST /threads/{id}/memory/observe | reflect | buffer`: what the operation did and its `data-om-*` parts.

    `status`: `done`, `nothing_to_do` (a retry, or nothing left), `busy` (another worker held the memory past the
    request's budget: retry later) or `failed` (the model failed; nothing changed).
    """

    status: Literal['done', 'nothing_to_do', 'busy', 'failed']
    generation_count: int = 0
    observation_tokens: int = 0
    parts: list[DataPart] = Field(default_factory=list)

    def parts_of(self, kind: str) -> list[DataPart]:
        """The parts of one type, e.g. `parts_of('observation-end')`."""
        kind = kind if kind.startswith('data-') else f'data-om-{kind}'
        return [p for p in self.parts if p.type == kind]


class TurnResult(_WithParts):
    """`POST /threads/{id}/turns`: the ids saved, and background work scheduled (`data-om-scheduled`)."""

    saved: list[str] = Field(default_factory=list)


class ChatResult(_WithParts):
    """`POST /threads/{id}/chat`: the Actor's reply (None when the Actor failed after the input was saved)."""

    reply: Message | None = None


class Thresholds(WireModel):
    """Observation and reflection thresholds, in tokens."""

    message_tokens: int
    observation_tokens: int


class BufferedObservations(WireModel):
    """Observations computed in the background, not yet active."""

    chunks: int = 0
    message_tokens: int = 0
    observation_tokens: int = 0
    status: str = 'idle'


class BufferedReflection(WireModel):
    """A reflection computed in the background, not yet active."""

    input_observation_tokens: int = 0
    observation_tokens: int = 0
    status: str = 'idle'


class Buffered(WireModel):
    """Background work on this memory."""

    observations: BufferedObservations = Field(default_factory=BufferedObservations)
    reflection: BufferedReflection = Field(default_factory=BufferedReflection)


class RecentFailure(WireModel):
    """A recent failed observation or reflection (listed once the server reports them)."""

    operation_type: str | None = None
    reason: str | None = None
    message: str | None = None
    at: str | None = None


class TokensLeft(WireModel):
    """How far a threshold is: `tokens_left` (0: reached; None when observational memory is off)."""

    tokens_left: int | None = None


class QuietSweep(WireModel):
    """When the scheduled sweeper observes the thread if nothing more is said (times are ISO 8601, UTC)."""

    quiet_after_seconds: int = 0
    interval_seconds: float | None = None
    quiet_at: str | None = None
    swept_by: str | None = None


class Upcoming(WireModel):
    """When memory will act next: tokens until observation and reflection, and the quiet-thread sweep."""

    observation: TokensLeft = Field(default_factory=TokensLeft)
    reflection: TokensLeft = Field(default_factory=TokensLeft)
    quiet_sweep: QuietSweep = Field(default_factory=QuietSweep)


class MemoryStatus(WireModel):
    """`GET /threads/{id}/memory`: the observation log, token counts, thresholds and hints."""

    scope: Literal['thread', 'resource'] = 'thread'
    record_id: str | None = None
    generation_count: int = 0
    observations: str = ''
    observation_tokens: int = 0
    pending_message_tokens: int = 0
    thresholds: Thresholds | None = None
    current_task: str | None = None
    suggested_response: str | None = None
    last_observed_at: str | None = None
    buffered: Buffered | None = None
    upcoming: Upcoming | None = None
    recent_failures: list[RecentFailure] | None = None


class Generation(WireModel):
    """One generation of a memory (`trigger`: `initial`, `reflection`, `archive` or `reset`)."""

    generation: int = 0
    record_id: str | None = None
    current: bool = False
    trigger: str | None = None
    created_at: str | None = None
    observations: str = ''
    observation_tokens: int = 0


class MemoryGenerations(WireModel):
    """`GET /threads/{id}/memory/generations`: the memory's generations, newest first (the current one first)."""

    scope: Literal['thread', 'resource'] = 'thread'
    record_id: str | None = None
    generations: list[Generation] = Field(default_factory=list)
    has_more: bool = False


class MessagesPage(WireModel):
    """A page of a thread's messages, oldest first."""

    messages: list[Message] = Field(default_factory=list)
    page: int = 0
    per_page: int = 100
    has_more: bool = False


class MessagesQueryResult(WireModel):
    """`POST /threads/{id}/messages/query`: recalled messages in arrival order."""

    messages: list[Message] = Field(default_factory=list)
    has_more: bool = False


class Thread(WireModel):
    """A thread. `title_pinned`: the title was set through `update_thread`, so generated titles never replace it."""

    id: str
    resource_id: str
    title: str | None = None
    title_pinned: bool = False
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)


class ThreadsPage(WireModel):
    """A page of a resource's threads."""

    threads: list[Thread] = Field(default_factory=list)
    has_more: bool = False


class CloneResult(WireModel):
    """The clone and the messages copied into it."""

    thread: Thread
    cloned_messages: list[Message] = Field(default_factory=list)


class WorkingMemory(WireModel):
    """Working memory: Markdown text or a JSON object (None when nothing is stored yet)."""

    working_memory: str | dict[str, Any] | None = None
    scope: Literal['thread', 'resource'] = 'thread'
    format: Literal['markdown', 'json'] = 'markdown'


class RecallResult(WireModel):
    """The recall tool's returns; which fields are present depends on the mode (see `POST /recall`)."""

    results: str | None = None
    messages: str | None = None
    observations: str | None = None
    count: int | None = None
    cursor: str | None = None
    page: int | None = None
    limit: int | None = None
    detail: str | None = None
    has_next_page: bool | None = None
    has_prev_page: bool | None = None
    truncated: bool | None = None
    token_offset: int | None = None
    text: str | None = None
    message_id: str | None = None
    part_index: int | None = None
    role: str | None = None
    type: str | None = None
    threads: str | None = None
    has_more: bool | None = None

    def as_text(self) -> str:
        """The answer's main text (messages, threads, search results or one part), for a model or a person."""
        for value in (self.messages, self.results, self.observations, self.threads, self.text):
            if value:
                return value
        return self.model_dump_json(by_alias=True, exclude_none=True)


class AttachmentUpload(WireModel):
    """A presigned S3 upload: PUT the bytes to `upload_url` before it expires, then use `url` in a part."""

    url: str
    upload_url: str
    expires_at: str


class Health(WireModel):
    """`GET /health`."""

    status: str
    version: str


class DateRange(WireModel):
    """Inclusive `createdAt` bounds; either may be left out."""

    start: datetime | None = None
    end: datetime | None = None


class Include(WireModel):
    """A message to include by id in a query, with neighbours."""

    id: str
    with_previous_messages: int = 0
    with_next_messages: int = 0
