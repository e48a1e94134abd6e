"""The HTTP API's request and response bodies (CONTRACT §2), camelCase on the wire.

Request models validate at the edge (Powertools turns their errors into 422s with field paths); response models
document the answers in the OpenAPI document. Message parts reuse om_lib's part models, so the API refuses exactly
what the engine would refuse, before anything is written.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from functions.api.limits import (
    MAX_ATTACHMENT_BYTES,
    MAX_FILENAME_CHARS,
    MAX_MESSAGES_PER_REQUEST,
    MAX_PARTS_PER_MESSAGE,
    MAX_TEXT_CHARS,
    AtMost,
    Text,
    too_large,
)
from om_lib.ids import Id
from om_lib.messages import FilePart, ImagePart, Message, Part, ReasoningPart, Role, TextPart

# The fields a client never sees: arrival order, the token cache and the owner (the request already names it).
SERVER_FIELDS = frozenset({'seq', 'token_counts', 'thread_id', 'resource_id'})


def _text_within_limit(part: Part) -> Part:
    if isinstance(part, TextPart | ReasoningPart) and len(part.text) > MAX_TEXT_CHARS:
        raise too_large(MAX_TEXT_CHARS, 'characters of text', len(part.text))
    return part


# A message part, its text within MAX_TEXT_CHARS (the part models are om_lib's, so the API refuses what the engine
# would, before anything is written).
LimitedPart = Annotated[Part, AfterValidator(_text_within_limit)]


def new_message_id() -> str:
    """A server-assigned message id."""
    return f'msg_{uuid.uuid4().hex}'


# Every request body: camelCase, unknown fields refused, and strict types, so `"readOnly": "no"` or `"size": "15"` is a
# 422 rather than a guess (pydantic's lax mode would read them as False and 15). JSON already has booleans and numbers.
API_MODEL_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra='forbid', strict=True)


class _Model(BaseModel):
    model_config = API_MODEL_CONFIG


class MessageIn(_Model):
    """A message as a client sends it: `id` and `createdAt` are optional, `content` is shorthand for one text part."""

    # Client-supplied token estimates (`tokenCounts`) and server fields are ignored, not refused (CONTRACT §2).
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra='ignore', strict=True)

    id: Id | None = None
    role: Role
    # An ISO 8601 string in JSON (strict mode would want a datetime object).
    created_at: datetime | None = Field(default=None, strict=False)
    content: Text | None = None
    parts: (
        Annotated[
            list[LimitedPart],
            AtMost(MAX_PARTS_PER_MESSAGE, 'items', 'parts'),
            Field(
                description='An image or file part links an `https:` URL, a `data:` URL, or an `s3:` URL of one of '
                "this resource's uploads (the `url` POST /attachments answered); any other URL is refused (422)."
            ),
        ]
        | None
    ) = None

    @model_validator(mode='after')
    def _one_body(self) -> MessageIn:
        if self.content is not None and self.parts:
            raise ValueError('send either `content` or `parts`, not both')
        if self.content is None and not self.parts:
            raise ValueError('a message needs `content` (text) or at least one entry in `parts`')
        return self

    def to_message(self, now: datetime, default_id: str | None = None) -> Message:
        """The domain message, with a server id (`default_id`, else a new one) and time where the client sent none."""
        parts = tuple(self.parts) if self.parts else (TextPart(text=self.content or ''),)
        message_id = self.id or default_id or new_message_id()
        return Message(id=message_id, role=self.role, created_at=self.created_at or now, parts=parts)


Messages = Annotated[list[MessageIn], AtMost(MAX_MESSAGES_PER_REQUEST, 'items', 'messages')]


# `provider/model`, as the caller names the model its Actor runs (any provider: it is not called here).
ActorModelName = Annotated[
    str,
    Field(
        min_length=3,
        max_length=200,
        pattern=r'^[A-Za-z0-9][\w.:@-]*/[^\s/][^\s]*$',
        description=(
            'The model your Actor calls for this step, as `provider/model` (e.g. `anthropic/claude-sonnet-4-5`). '
            'Optional: with it, `activateAfterIdle: "auto"` uses that provider\'s prompt-cache lifetime, and a change '
            'of model since the last step activates buffered observations when `activateOnProviderChange` is on.'
        ),
    ),
]


class StepsIn(_Model):
    """`POST /threads/{threadId}/steps`: the new input of one step."""

    resource_id: Id
    messages: Messages
    step_number: int = Field(default=0, ge=0)
    read_only: bool = Field(
        default=False, description='Working memory is shown but `updateWorkingMemory` is not offered (this step).'
    )
    actor_model: ActorModelName | None = None


class ImportedMessageIn(MessageIn):
    """A message imported from elsewhere: its `createdAt` (when it was said) is required; it dates the observations."""

    # An ISO 8601 string in JSON (strict mode would want a datetime object).
    created_at: datetime = Field(strict=False)

    @model_validator(mode='after')
    def _not_system(self) -> ImportedMessageIn:
        if self.role == 'system':
            raise ValueError("an imported message is the conversation's: role 'user', 'assistant' or 'tool'")
        return self


class ObserveIn(_Model):
    """`POST /threads/{threadId}/memory/observe`: observe now; with `messages`, messages imported from elsewhere."""

    resource_id: Id
    messages: (
        Annotated[
            list[ImportedMessageIn],
            AtMost(MAX_MESSAGES_PER_REQUEST, 'items', 'messages'),
            Field(
                description=(
                    'History imported from another system, in order, each with its `createdAt`: observed into this '
                    "thread's memory, never added to its messages. Left out: the thread's own unobserved messages "
                    'are observed now, below the threshold too.'
                )
            ),
        ]
        | None
    ) = None


class MemoryOperationIn(_Model):
    """`POST /threads/{threadId}/memory/reflect` and `…/memory/buffer`."""

    resource_id: Id


class TurnsIn(_Model):
    """`POST /threads/{threadId}/turns`: the outputs of one turn (assistant and tool messages)."""

    resource_id: Id
    messages: Messages


class UiMessageIn(BaseModel):
    """A message as the AI SDK's chat state holds it (`UIMessage`: `{id, role, parts, metadata}`). Only the newest
    user message of a request is used; its `text` and `file` parts become the message's parts, other parts (steps,
    tools, `data-*`) are the chat UI's own and are left out."""

    model_config = ConfigDict(extra='ignore')

    id: Id
    role: Literal['system', 'user', 'assistant']
    parts: Annotated[list[dict[str, Any]], AtMost(MAX_PARTS_PER_MESSAGE, 'items', 'parts')]

    def to_message(self, now: datetime) -> Message:
        """The user's message: its text parts and its files (images as image parts)."""
        return Message(id=self.id, role='user', created_at=now, parts=tuple(self.content_parts()))

    def content_parts(self) -> list[Part]:
        """Its text and file parts as message parts (validation errors for what cannot be one)."""
        parts: list[Part] = []
        for part in self.parts:
            kind = part.get('type')
            if kind == 'text' and isinstance(part.get('text'), str) and part['text'].strip():
                if len(part['text']) > MAX_TEXT_CHARS:
                    raise too_large(MAX_TEXT_CHARS, 'characters of text', len(part['text']))
                parts.append(TextPart(text=part['text']))
            elif kind == 'file' and isinstance(part.get('url'), str):
                media_type = str(part.get('mediaType') or '') or None
                url = part['url']
                inline = {'data': url} if url.startswith('data:') else {'url': url}
                filename = part.get('filename') if isinstance(part.get('filename'), str) else None
                cls = ImagePart if (media_type or '').startswith('image/') else FilePart
                try:
                    parts.append(cls.model_validate({'mediaType': media_type, 'filename': filename, **inline}))
                except ValidationError as exc:
                    raise ValueError(f'a file part of the newest user message: {exc.errors()[0]["msg"]}') from exc
        if not parts:
            raise ValueError('the newest user message has no text or file part: send what the user typed')
        return parts


class ChatIn(_Model):
    """`POST /threads/{threadId}/chat`: one user message, as `message`, as `content` text, or as the AI SDK's chat
    transport sends it (`messages`: the chat's messages, of which the newest user message is taken)."""

    resource_id: Id
    message: MessageIn | None = None
    content: Text | None = None
    messages: Annotated[list[UiMessageIn], AtMost(MAX_MESSAGES_PER_REQUEST, 'items', 'messages')] | None = Field(
        default=None,
        description=(
            "The AI SDK's `UIMessage`s (`useChat` / `DefaultChatTransport`); only the newest user message is used, "
            'so a client may send that one alone.'
        ),
    )
    id: str | None = Field(
        default=None, max_length=1000, description="The AI SDK chat's id (sent by its transport; not used)."
    )
    trigger: Literal['submit-message', 'regenerate-message'] | None = Field(
        default=None,
        description='Sent by the AI SDK transport. Regenerating a message that was answered returns its stored reply.',
    )
    message_id: str | None = Field(
        default=None, max_length=1000, description='Sent by the AI SDK transport (not used).'
    )
    read_only: bool = Field(
        default=False, description='Working memory is shown but the Actor cannot change it (this request).'
    )

    @model_validator(mode='after')
    def _one_input(self) -> ChatIn:
        if sum(x is not None for x in (self.message, self.content, self.messages)) != 1:
            raise ValueError('send exactly one of `message`, `content` or `messages`')
        if self.content is not None and not self.content.strip():
            raise ValueError('`content` must not be empty: send the text the user typed')
        if self.message is not None and not _has_content(self.message):
            raise ValueError('the chat message has no content: send at least one non-empty part')
        if self.message is not None and self.message.role != 'user':
            raise ValueError("the chat message's role must be 'user'")
        if self.messages is not None:
            newest = next((m for m in reversed(self.messages) if m.role == 'user'), None)
            if newest is None:
                raise ValueError('`messages` holds no user message: send the message the user just wrote')
            newest.content_parts()  # refused now, before anything is written
        return self

    def user_message(self, now: datetime, default_id: str | None = None) -> Message:
        """The user's message as a domain message (`default_id`, else a new server id, and the time, where absent)."""
        if self.messages is not None:
            newest = next(m for m in reversed(self.messages) if m.role == 'user')
            return newest.to_message(now)
        incoming = self.message or MessageIn(role='user', content=self.content)
        return incoming.to_message(now, default_id)


class AttachmentIn(_Model):
    """`POST /attachments`: what the client is about to upload."""

    resource_id: Id
    thread_id: Id
    filename: Annotated[str, Field(min_length=1), AtMost(MAX_FILENAME_CHARS, 'characters')]
    media_type: str = Field(max_length=255, pattern=r'^[A-Za-z0-9][\w.+-]*/[\w.+-]+$')
    size: Annotated[
        int, Field(ge=0, description='Bytes the client will upload.'), AtMost(MAX_ATTACHMENT_BYTES, 'count', 'bytes')
    ]


# -- answers (documentation models; routes build the JSON themselves so None fields stay out of it) --------------


class MessageOut(_Model):
    """A message in an answer: no server-internal fields (`seq`, token cache, owner)."""

    id: str
    role: Role
    created_at: datetime
    parts: list[Part]


DataPart = dict[str, Any]


class StepsOut(_Model):
    """What the Actor should see for this step."""

    thread_id: str
    resource_id: str
    system: str
    messages: list[MessageOut]
    tools: list[dict[str, Any]]
    parts: list[DataPart]


class TurnsOut(_Model):
    """The ids of the turn's messages as stored, and any `data-om-*` parts."""

    saved: list[str]
    parts: list[DataPart]


class MemoryOperationOut(_Model):
    """What an operation asked for did, and its `data-om-*` parts."""

    status: Literal['done', 'nothing_to_do', 'busy', 'failed'] = Field(
        description=(
            '`done`: something was observed, reflected or buffered; `nothing_to_do`: nothing was left (a retry of a '
            "request that was done, or nothing new); `busy`: another worker held the memory past this request's "
            'budget (retry later); `failed`: the model failed, nothing changed (the parts say why).'
        )
    )
    generation_count: int
    observation_tokens: int
    parts: list[DataPart]


class ChatOut(_Model):
    """The Actor's reply (`null` when the Actor model failed after the user's message was saved)."""

    reply: MessageOut | None
    parts: list[DataPart]


class ListedMessageOut(MessageOut):
    """A message as `GET /threads/{threadId}/messages` lists it: with where it stands in memory."""

    om_status: Literal['observed', 'buffered', 'unobserved'] = Field(
        description='observed: covered by the observations; buffered: in a chunk waiting to activate; unobserved.'
    )


class MessagesPage(_Model):
    """One page of a thread's messages, oldest first."""

    messages: list[ListedMessageOut]
    page: int
    per_page: int
    has_more: bool


class ThreadOut(_Model):
    """A thread as listed."""

    id: str
    resource_id: str
    title: str | None
    title_pinned: bool = Field(
        description='The title was set through `PATCH /threads/{threadId}`: generated titles never replace it.'
    )
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any]


class ThreadsPage(_Model):
    """One page of a resource's threads."""

    threads: list[ThreadOut]
    has_more: bool


class BufferedObservationsOut(_Model):
    """Observations computed in the background, not yet active."""

    chunks: int
    message_tokens: int
    observation_tokens: int
    status: str


class BufferedReflectionOut(_Model):
    """A reflection computed in the background, not yet active."""

    input_observation_tokens: int
    observation_tokens: int
    status: str


class BufferedOut(_Model):
    """Background work on this memory."""

    observations: BufferedObservationsOut
    reflection: BufferedReflectionOut


class BlockAfterOut(_Model):
    """Where async buffering stops waiting: past it a step observes (reflects) synchronously. None when it is off."""

    observation: int | None = Field(description='Unobserved message tokens past which a step observes in the request.')
    reflection: int | None = Field(description='Observation tokens past which a step reflects in the request.')


class ThresholdsOut(_Model):
    """The thresholds that trigger observation and reflection, in tokens (the ones in force now)."""

    message_tokens: int
    observation_tokens: int
    block_after: BlockAfterOut


class TokensLeftOut(_Model):
    """How far a threshold is."""

    tokens_left: int | None = Field(
        description='Tokens still to come before it is reached (0: reached, the next step or turn acts); null when '
        'observational memory is off.'
    )


class QuietSweepOut(_Model):
    """When the scheduled sweeper observes this thread if nothing more is said (it observes a quiet thread below the
    threshold too)."""

    quiet_after_seconds: int = Field(description='A thread counts as quiet this long after its newest message.')
    interval_seconds: float | None = Field(description='How often the sweeper runs; null when no sweeper runs.')
    quiet_at: str | None = Field(
        description='When this thread counts as quiet if nothing more is said; null when nothing is unobserved.'
    )
    swept_by: str | None = Field(
        description='The sweeper has observed it by then (the first run after `quietAt`); null when no sweeper runs or '
        'nothing is unobserved.'
    )


class UpcomingOut(_Model):
    """When memory will act next."""

    observation: TokensLeftOut = Field(
        description='Unobserved message tokens until the Observer runs (`thresholds.messageTokens`). In resource '
        'scope other threads’ messages count too, so it can come sooner.'
    )
    reflection: TokensLeftOut = Field(
        description='Observation tokens until the Reflector condenses the log (`thresholds.observationTokens`).'
    )
    quiet_sweep: QuietSweepOut


class FailureOut(_Model):
    """A failure kept for `recentFailures` (the failure reasons page of the docs explains each `reason`)."""

    operation_type: Literal['observation', 'reflection']
    reason: str
    message: str
    at: str
    thread_id: str | None = None
    background: bool = False


class ArchivedGroupOut(_Model):
    """One observation group moved out of the active log past its bound (recall's `mode: "observations"`)."""

    id: str
    thread_id: str | None
    range: str = Field(description='The messages it came from (`#12:#19`: their numbers in the thread); may be empty.')
    observations: str
    tokens: int
    archived_at: str
    generation: int = Field(description='The generation it was moved out of.')


class ArchiveOut(_Model):
    """The archive: what keeps the active log within its bound when reflection cannot."""

    after_tokens: int = Field(description='Past this many observation tokens the oldest groups are archived.')
    keep_tokens: int = Field(description='About how many of the newest observation tokens stay active.')
    tokens: int = Field(description='Tokens archived in all.')
    groups: list[ArchivedGroupOut] = Field(description='Archived groups, newest first.')


class NoteOut(_Model):
    """An Observer or Reflector answer that became memory although a check was unsure about it."""

    operation_type: Literal['observation', 'reflection']
    note: str = Field(description='`mostly_prose`, `repeated_item` or `newest_date_missing`.')
    message: str
    at: str
    thread_id: str | None = None


class MemoryOut(_Model):
    """`GET /threads/{threadId}/memory`."""

    scope: Literal['thread', 'resource']
    record_id: str | None
    generation_count: int
    observations: str = Field(
        description='The observation log. In resource scope each `<thread id="…">` section names the real thread id.'
    )
    observation_tokens: int
    pending_message_tokens: int
    thresholds: ThresholdsOut
    current_task: str | None
    suggested_response: str | None
    last_observed_at: str | None
    buffered: BufferedOut
    upcoming: UpcomingOut = Field(description='When memory will act next: observation, reflection, the quiet sweep.')
    recent_failures: list[FailureOut] = Field(description='The last 20 failures of this memory, newest first.')
    recent_notes: list[NoteOut] = Field(
        description='Answers accepted although a check was unsure about them (the last 20, newest first).'
    )
    archive: ArchiveOut


class GenerationOut(_Model):
    """One generation of a memory."""

    generation: int = Field(description='0 for the first; each reflection or reset adds one.')
    record_id: str
    current: bool = Field(description='The live generation (the one `GET …/memory` shows).')
    trigger: Literal['initial', 'reflection', 'archive', 'reset'] = Field(
        description='`initial`: the first; `reflection`: the Reflector condensed the generation before; `archive`: '
        'the log passed its bound and its oldest groups moved to the archive (no model call); `reset`: observed '
        'messages were deleted (or a thread erased from a resource memory) and the rest is observed again.'
    )
    created_at: str
    observations: str
    observation_tokens: int = Field(description='Its size now (for an earlier generation: when it was replaced).')
    initial_observation_tokens: int | None = Field(
        description='Its size when it began (after the reflection or reset that made it); null for the first '
        'generation and for generations stored before this was kept.'
    )


class GenerationsOut(_Model):
    """`GET /threads/{threadId}/memory/generations`: newest first, the current generation first."""

    scope: Literal['thread', 'resource']
    record_id: str | None
    generations: list[GenerationOut]
    has_more: bool


class AttachmentOut(_Model):
    """A presigned S3 upload: PUT exactly the declared bytes to `uploadUrl` with the declared Content-Type, then use
    `url` in a part. When the URL's `X-Amz-SignedHeaders` include `x-amz-server-side-encryption` (the local stack; a
    deployed bucket encrypts with its own key and signs none), send `x-amz-server-side-encryption: AES256` too."""

    url: str
    upload_url: str
    expires_at: str


class HealthOut(_Model):
    """Liveness."""

    status: Literal['ok']
    version: str


class ErrorBody(_Model):
    """The error object."""

    code: str
    message: str
    details: list[dict[str, Any]]


class ErrorOut(_Model):
    """Every error answer: `{"error": {"code", "message", "details"}}`."""

    error: ErrorBody


def message_json(message: Message) -> dict[str, Any]:
    """A message as answers show it (camelCase, no server-internal fields, no empty optionals)."""
    return message.model_dump(mode='json', by_alias=True, exclude_none=True, exclude=set(SERVER_FIELDS))


def _has_content(message: MessageIn) -> bool:
    """At least one part carries something for the Actor (non-blank text, a file, a tool result...)."""
    domain = message.to_message(datetime.now(UTC))
    return any(not isinstance(p, TextPart) or p.text.strip() for p in domain.parts)
