"""Request and answer bodies of the thread and message-history routes (CONTRACT §2), camelCase on the wire."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator, model_validator

from functions.api.limits import (
    MAX_DELETE_IDS,
    MAX_INCLUDES,
    AtMost,
    ContextCount,
    Metadata,
    SearchText,
    Title,
)
from functions.api.models import API_MODEL_CONFIG, MessageOut, ThreadOut
from om_lib.ids import Id
from om_lib.service import DEFAULT_PER_PAGE, DateRange, Include


class _Model(BaseModel):
    model_config = API_MODEL_CONFIG


class DateRangeIn(_Model):
    """`createdAt` bounds, both inclusive; either may be left out. A time without a zone is UTC."""

    # ISO 8601 strings in JSON (strict mode would want datetime objects).
    start: datetime | None = Field(default=None, strict=False)
    end: datetime | None = Field(default=None, strict=False)

    @field_validator('start', 'end')
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @model_validator(mode='after')
    def _ordered(self) -> DateRangeIn:
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError('dateRange.start must not be after dateRange.end')
        return self

    def as_range(self) -> DateRange:
        """The domain form."""
        return (self.start, self.end)


class ThreadCreateIn(_Model):
    """`POST /threads`: an explicit, empty thread (`id` is server-assigned when absent)."""

    resource_id: Id
    id: Id | None = None
    title: Title | None = None
    metadata: Metadata | None = None


class ThreadPatchIn(_Model):
    """`PATCH /threads/{threadId}`: fields left out stay as they are; `metadata` replaces the whole object."""

    resource_id: Id
    title: Title | None = None
    metadata: Metadata | None = None


class ThreadCloneIn(_Model):
    """`POST /threads/{threadId}/clone`: which messages to copy (date range first, then the last `messageLimit`)."""

    resource_id: Id
    new_thread_id: Id | None = None
    title: Title | None = None
    message_limit: int | None = Field(default=None, ge=0)
    date_range: DateRangeIn | None = None


class IncludeIn(_Model):
    """A message to include by id, with context around it (by arrival order)."""

    id: Id
    with_previous_messages: ContextCount = 0
    with_next_messages: ContextCount = 0

    def as_include(self) -> Include:
        """The domain form."""
        return Include(id=self.id, with_previous=self.with_previous_messages, with_next=self.with_next_messages)


class MessagesQueryIn(_Model):
    """`POST /threads/{threadId}/messages/query`: a page of a thread's messages with chosen ones and their neighbours.

    `perPage: false` (or null) asks for every message; `perPage: 0` for the included messages only.
    """

    resource_id: Id
    page: int = Field(default=0, ge=0, le=1_000_000)
    per_page: int | None = Field(default=DEFAULT_PER_PAGE, ge=0, le=1000)
    date_range: DateRangeIn | None = None
    include: Annotated[list[IncludeIn], AtMost(MAX_INCLUDES, 'items', 'entries')] | None = None
    vector_search_string: Annotated[SearchText, Field(min_length=1)] | None = None

    @field_validator('per_page', mode='before')
    @classmethod
    def _false_means_all(cls, value: Any) -> Any:
        # `false` (the seed's spelling) and `null` ask for every message; `0 == False` in Python, so test identity.
        if value is False:
            return None
        if value is True:
            raise ValueError('perPage is a number from 0 to 1000, or false for every message')
        return value


class MessagesDeleteIn(_Model):
    """`DELETE /threads/{threadId}/messages`: `messageIds` left out clears the thread."""

    resource_id: Id | None = None
    message_ids: Annotated[list[Id], AtMost(MAX_DELETE_IDS, 'items', 'ids')] | None = None


# -- answers ------------------------------------------------------------------------------------------------------


class ThreadEnvelope(_Model):
    """One thread."""

    thread: ThreadOut


class CloneOut(_Model):
    """The clone and the messages copied into it (new ids, arrival order)."""

    thread: ThreadOut
    cloned_messages: list[MessageOut]


class MessagesQueryOut(_Model):
    """The recalled messages in arrival order; `hasMore` is about the paged ones."""

    messages: list[MessageOut]
    has_more: bool
