"""The streamed chat turn (`POST /threads/{threadId}/chat/stream`): the AI SDK's UI message stream, as typed chunks.

The server sends server-sent events, `data: <chunk JSON>`, ending with `data: [DONE]`. `parse_chunk` makes each one a
model (camelCase fields become snake_case attributes); a chunk type this client does not know comes back as a plain
`StreamChunk` with its fields kept, so a newer server does not break an older client. In order:

    Start (message_id: the reply's id)
    DataChunk (type `data-om-*`: data-om-status first, observation-start/-end/-failed as they happen, ...)
    StartStep, TextStart / TextDelta / TextEnd, ToolInputAvailable / ToolOutputAvailable / ToolOutputError
    FinishStep, DataChunk (what the turn queued), ErrorChunk (the Actor failed: retry with the same message id)
    Finish
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DONE = '[DONE]'


class StreamChunk(BaseModel):
    """One chunk of the UI message stream (fields the client does not know are kept)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra='allow', frozen=True)

    type: str


class Start(StreamChunk):
    """The turn began: `message_id` is the reply's id (the same in `GET .../messages` once it is saved)."""

    type: Literal['start'] = 'start'
    message_id: str | None = None


class StartStep(StreamChunk):
    """An Actor call began."""

    type: Literal['start-step'] = 'start-step'


class FinishStep(StreamChunk):
    """The Actor call ended."""

    type: Literal['finish-step'] = 'finish-step'


class TextStart(StreamChunk):
    """A block of the reply's text begins."""

    type: Literal['text-start'] = 'text-start'
    id: str


class TextDelta(StreamChunk):
    """The next piece of the reply's text, as the model wrote it."""

    type: Literal['text-delta'] = 'text-delta'
    id: str
    delta: str


class TextEnd(StreamChunk):
    """The block of text is complete."""

    type: Literal['text-end'] = 'text-end'
    id: str


class ToolInputAvailable(StreamChunk):
    """The Actor called a tool (`provider_executed`: the server ran it, e.g. `recall`)."""

    type: Literal['tool-input-available'] = 'tool-input-available'
    tool_call_id: str
    tool_name: str
    input: Any = None
    provider_executed: bool | None = None


class ToolOutputAvailable(StreamChunk):
    """A tool the server ran answered."""

    type: Literal['tool-output-available'] = 'tool-output-available'
    tool_call_id: str
    output: Any = None


class ToolOutputError(StreamChunk):
    """A tool the server ran failed (the model is told, and may correct its call)."""

    type: Literal['tool-output-error'] = 'tool-output-error'
    tool_call_id: str
    error_text: str


class DataChunk(StreamChunk):
    """A `data-om-*` part (the memory's status, observation and buffering events), the moment it happened."""

    id: str | None = None
    data: dict[str, Any] = {}


class ErrorChunk(StreamChunk):
    """The turn failed after it began (the user's message is saved: retry it with the same id). `code` is the API's
    error code (e.g. `model_unavailable`)."""

    type: Literal['error'] = 'error'
    error_text: str
    code: str | None = None


class Finish(StreamChunk):
    """The turn ended: `finish_reason` is `stop`, `tool-calls` or `error`."""

    type: Literal['finish'] = 'finish'
    finish_reason: str | None = None


_TYPES: dict[str, type[StreamChunk]] = {
    cls.model_fields['type'].default: cls
    for cls in (
        Start,
        StartStep,
        FinishStep,
        TextStart,
        TextDelta,
        TextEnd,
        ToolInputAvailable,
        ToolOutputAvailable,
        ToolOutputError,
        ErrorChunk,
        Finish,
    )
}


def parse_chunk(value: dict[str, Any]) -> StreamChunk:
    """The typed chunk for one decoded event."""
    kind = str(value.get('type', ''))
    if kind.startswith('data-'):
        return DataChunk.model_validate(value)
    return _TYPES.get(kind, StreamChunk).model_validate(value)


def chunks_of_lines(lines: Iterable[str]) -> Iterator[StreamChunk]:
    """The chunks of an event stream's lines, up to `[DONE]`."""
    for line in lines:
        if not line.startswith('data:'):
            continue  # blank separators, comments
        payload = line[5:].strip()
        if payload == DONE:
            return
        yield parse_chunk(json.loads(payload))


async def achunks_of_lines(lines: AsyncIterator[str]) -> AsyncIterator[StreamChunk]:
    """`chunks_of_lines` for an async line iterator."""
    async for line in lines:
        if not line.startswith('data:'):
            continue
        payload = line[5:].strip()
        if payload == DONE:
            return
        yield parse_chunk(json.loads(payload))


def text_of(chunks: Iterable[StreamChunk]) -> str:
    """The reply's text: every text delta, joined."""
    return ''.join(c.delta for c in chunks if isinstance(c, TextDelta))


__all__ = [
    'DataChunk',
    'ErrorChunk',
    'Finish',
    'FinishStep',
    'Start',
    'StartStep',
    'StreamChunk',
    'TextDelta',
    'TextEnd',
    'TextStart',
    'ToolInputAvailable',
    'ToolOutputAvailable',
    'ToolOutputError',
    'chunks_of_lines',
    'parse_chunk',
    'text_of',
]
