"""Messages and their parts: the CONTRACT's message model (§2 "Message").

JSON uses camelCase (`mediaType`, `toolCallId`, `createdAt`); Python attributes are snake_case and both forms
validate. A message is normalised on the way in: the `content` shorthand becomes a single text part, so inside
the engine a message always has `parts`.

Stored messages carry two server-owned fields a client can never set: `seq` (arrival order in the thread) and
`token_counts` (the cached per-part token estimate, keyed by the counter's version).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

Role = Literal['user', 'assistant', 'system', 'tool']


class _CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra='forbid')


def _check_base64(data: str | None, kind: str) -> None:
    """Inline `data` must be base64 (optionally a `data:` URL); refused before anything is written."""
    if not data:
        return
    payload = data.split(',', 1)[1] if data.startswith('data:') and ',' in data else data
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f'{kind} part `data` is not valid base64') from exc


class TextPart(_CamelModel):
    """Plain text."""

    type: Literal['text'] = 'text'
    text: str


class ImagePart(_CamelModel):
    """An image, by URL (`https://`, `s3://`) and/or inline base64 `data`."""

    type: Literal['image'] = 'image'
    media_type: str | None = None
    url: str | None = None
    data: str | None = None
    filename: str | None = None
    # Numbers and booleans of parts are strict: a string such as "10" or "false" is refused, never read as one.
    width: int | None = Field(default=None, ge=1, strict=True)
    height: int | None = Field(default=None, ge=1, strict=True)
    size: int | None = Field(
        default=None, ge=0, strict=True, description='Byte size, when known (used for token estimates).'
    )

    @model_validator(mode='after')
    def _needs_source(self) -> ImagePart:
        if not self.url and not self.data:
            raise ValueError('an image part needs a `url` or base64 `data`')
        _check_base64(self.data, 'image')
        return self


class FilePart(_CamelModel):
    """A non-image file (or an image sent as a file), by URL and/or inline base64 `data`."""

    type: Literal['file'] = 'file'
    media_type: str | None = None
    url: str | None = None
    data: str | None = None
    filename: str | None = None
    size: int | None = Field(default=None, ge=0, strict=True)

    @model_validator(mode='after')
    def _needs_source(self) -> FilePart:
        if not self.url and not self.data:
            raise ValueError('a file part needs a `url` or base64 `data`')
        _check_base64(self.data, 'file')
        return self


class ToolCallPart(_CamelModel):
    """The Actor asked for a tool to be run."""

    type: Literal['tool-call'] = 'tool-call'
    tool_call_id: str
    tool_name: str
    args: Any = Field(default_factory=dict)


class ToolResultPart(_CamelModel):
    """A tool's answer to a call."""

    type: Literal['tool-result'] = 'tool-result'
    tool_call_id: str
    tool_name: str
    result: Any = None
    is_error: bool = Field(default=False, strict=True)


class ReasoningPart(_CamelModel):
    """Model reasoning. Never counted toward thresholds (it counts as 0 tokens)."""

    type: Literal['reasoning'] = 'reasoning'
    text: str = ''


Part = Annotated[
    TextPart | ImagePart | FilePart | ToolCallPart | ToolResultPart | ReasoningPart,
    Field(discriminator='type'),
]


class TokenCounts(_CamelModel):
    """Cached per-part token estimates of a stored message (seed 000, "Token estimate metadata cache").

    `parts[i]` is the estimate of `message.parts[i]`, or None for parts that are never counted (reasoning).
    The cache is valid only for the counter whose `version` wrote it.
    """

    version: str
    parts: tuple[int | None, ...]


class Message(_CamelModel):
    """One conversation message. Immutable once stored (CONTRACT §2)."""

    id: str = Field(min_length=1, max_length=256)
    role: Role
    created_at: datetime
    parts: tuple[Part, ...]
    thread_id: str | None = None
    resource_id: str | None = None
    # Server-owned: arrival order inside the thread, assigned by the store.
    seq: int | None = None
    token_counts: TokenCounts | None = None

    @model_validator(mode='before')
    @classmethod
    def _content_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and 'content' in data:
            data = dict(data)
            content = data.pop('content')
            if content is not None:
                if not isinstance(content, str):
                    raise ValueError('`content` must be a string; use `parts` for structured content')
                if data.get('parts'):
                    raise ValueError('send either `content` or `parts`, not both')
                data['parts'] = [{'type': 'text', 'text': content}]
        return data

    @model_validator(mode='after')
    def _utc(self) -> Message:
        if self.created_at.tzinfo is None:
            object.__setattr__(self, 'created_at', self.created_at.replace(tzinfo=UTC))
        return self

    def text(self) -> str:
        """All text parts joined by newlines."""
        return '\n'.join(p.text for p in self.parts if isinstance(p, TextPart))

    def content_hash(self) -> str:
        """A stable digest of role and parts: equal hashes mean the same message.

        The time is left out on purpose: a retried request without `createdAt` gets a new server time, and it must
        still count as the same message (CONTRACT §2, safe retries).
        """
        payload = {'role': self.role, 'parts': [p.model_dump(mode='json', by_alias=True) for p in self.parts]}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(',', ':')).encode()).hexdigest()


def time_of(message: Message) -> datetime:
    """The time of this message: when it was said, as the client stated it in `createdAt`, else when it arrived.

    The API fills `createdAt` in with the server's time when a client sends none, so this is always set. It dates the
    message for the Observer (its `Date:` headers and `(HH:MM)` times), for the context builder and for the recall
    tool; it never orders anything: a thread is ordered by arrival (`seq`), and observation cursors follow that order.
    """
    at = message.created_at
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def now_of(messages: Iterable[Message], fallback: datetime) -> datetime:
    """ "Now" for a step: the time of its newest new message, else `fallback` (the service's clock).

    A client that replays dated history, or asks a question "as of" a date, says so through the `createdAt` of the
    message it sends; relative times ("2 weeks ago") are then counted from that moment, not from the server's.
    """
    times = [time_of(m) for m in messages]
    return max(times) if times else fallback


def iso(dt: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a `Z` suffix, as the reference formats boundaries."""
    return dt.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.') + f'{dt.microsecond // 1000:03d}Z'
