"""The API's documented size limits, defined once (docs/api.md lists exactly these; a test checks it).

Passing one is 413 `too_large`, whose message and `details` name the field and the limit. The request models take
their constraints from here through `AtMost` annotations, which also document each limit in the OpenAPI document
(`maxLength`, `maxItems`, `maximum`), so the fuzzer generates requests just over every one of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from om_lib.ids import MAX_ID_CHARS
from om_lib.service import MAX_WORKING_MEMORY_BYTES, WORKING_MEMORY_KEY

KIB = 1024
MIB = 1024 * KIB

# The whole body. Lambda takes at most 6 MB per synchronous invocation, headers and request context included; a step
# never needs more (attachments go to S3 through POST /attachments).
MAX_BODY_BYTES = 5 * MIB
# Nesting of arrays and objects in a body, the body itself being level 1 (400 `invalid_json` past it: a parser's
# recursion is not a size limit a client tunes).
MAX_JSON_DEPTH = 32
MAX_MESSAGES_PER_REQUEST = 100
MAX_PARTS_PER_MESSAGE = 100
# A text or reasoning part's `text`, and a message's `content` shorthand.
MAX_TEXT_CHARS = 1_000_000
# A thread's `metadata` as compact UTF-8 JSON (it is returned with every thread of a listing).
MAX_METADATA_BYTES = 16 * KIB
MAX_TITLE_CHARS = 1000
# `vectorSearchString` of the messages query, and the recall tool's `query`.
MAX_QUERY_CHARS = 4000
MAX_INCLUDES = 100
MAX_CONTEXT_MESSAGES = 100
MAX_DELETE_IDS = 1000
# Larger files are not useful to a model inline (Gemini takes ~20 MB per request) and cost to keep.
MAX_ATTACHMENT_BYTES = 20 * MIB
MAX_FILENAME_CHARS = 255


@dataclass(frozen=True)
class Limit:
    """One row of the limits table in docs/api.md."""

    what: str
    value: int
    unit: str


LIMITS: tuple[Limit, ...] = (
    Limit('request body', MAX_BODY_BYTES, 'bytes'),
    Limit('`messages` per request', MAX_MESSAGES_PER_REQUEST, 'messages'),
    Limit('`parts` per message', MAX_PARTS_PER_MESSAGE, 'parts'),
    Limit('`text` of a part, or `content`', MAX_TEXT_CHARS, 'characters'),
    Limit('thread `metadata` (as JSON, besides `workingMemory`)', MAX_METADATA_BYTES, 'bytes'),
    Limit('thread `title`', MAX_TITLE_CHARS, 'characters'),
    Limit('`vectorSearchString`, recall `query`', MAX_QUERY_CHARS, 'characters'),
    Limit('`include` entries of a messages query', MAX_INCLUDES, 'entries'),
    Limit('`withPreviousMessages` / `withNextMessages`', MAX_CONTEXT_MESSAGES, 'messages'),
    Limit('`messageIds` to delete', MAX_DELETE_IDS, 'ids'),
    Limit('working memory (as JSON)', MAX_WORKING_MEMORY_BYTES, 'bytes'),
    Limit('attachment `size`', MAX_ATTACHMENT_BYTES, 'bytes'),
    Limit('attachment `filename`', MAX_FILENAME_CHARS, 'characters'),
    # Not 413s: these are refused as malformed, but are limits all the same.
    Limit('JSON nesting depth (400 `invalid_json`)', MAX_JSON_DEPTH, 'levels'),
    Limit('an id (422 `invalid_id`)', MAX_ID_CHARS, 'characters'),
)


def too_large(limit: int, unit: str, size: int) -> PydanticCustomError:
    """The validation error of a value over its limit (`errors.validation_response` answers it with a 413)."""
    return PydanticCustomError(
        'too_large', 'at most {limit} {unit} are allowed ({size} sent)', {'limit': limit, 'unit': unit, 'size': size}
    )


def json_bytes(value: Any) -> int:
    """The size of `value` as compact UTF-8 JSON (how metadata and working memory are measured)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(',', ':')).encode())


Measure = Literal['characters', 'items', 'count', 'json']
# What each measure is called in the OpenAPI document (JSON bytes have no JSON Schema keyword: the description says).
_SCHEMA_KEYWORD = {'characters': 'maxLength', 'items': 'maxItems', 'count': 'maximum'}


@dataclass(frozen=True)
class AtMost:
    """Annotated metadata: the value may be at most `limit` (in `unit`) by `measure`; past it, 413 `too_large`.

    Lengths are checked before the value is validated (a list of 50,000 parts is refused without validating one of
    them); counts and JSON sizes after.
    """

    limit: int
    measure: Measure
    unit: str = ''

    def size(self, value: Any) -> int | None:
        """The value's size by this measure, or None when it does not apply (another type: validation says so)."""
        if self.measure == 'characters':
            return len(value) if isinstance(value, str) else None
        if self.measure == 'items':
            return len(value) if isinstance(value, list) else None
        if self.measure == 'count':
            return value if isinstance(value, int) else None
        return json_bytes(value) if value is not None else None

    def check(self, value: Any) -> Any:
        """`value` unchanged, or the 413 validation error."""
        size = self.size(value)
        if size is not None and size > self.limit:
            raise too_large(
                self.limit, self.unit or ('bytes of JSON' if self.measure == 'json' else self.measure), size
            )
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        if self.measure in ('characters', 'items'):
            return core_schema.no_info_before_validator_function(self.check, schema)
        return core_schema.no_info_after_validator_function(self.check, schema)

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        keyword = _SCHEMA_KEYWORD.get(self.measure)
        if keyword is not None:
            json_schema[keyword] = self.limit
        return json_schema


Text = Annotated[str, AtMost(MAX_TEXT_CHARS, 'characters')]
Title = Annotated[str, AtMost(MAX_TITLE_CHARS, 'characters')]
SearchText = Annotated[str, AtMost(MAX_QUERY_CHARS, 'characters')]


def _metadata_within_limits(metadata: dict[str, Any]) -> dict[str, Any]:
    # `workingMemory` in a thread's metadata is its initial working memory (seed 003): it has its own limit.
    rest = {k: v for k, v in metadata.items() if k != WORKING_MEMORY_KEY}
    if (size := json_bytes(rest)) > MAX_METADATA_BYTES:
        raise too_large(MAX_METADATA_BYTES, 'bytes of JSON', size)
    if WORKING_MEMORY_KEY in metadata:
        if (size := json_bytes(metadata[WORKING_MEMORY_KEY])) > MAX_WORKING_MEMORY_BYTES:
            raise too_large(MAX_WORKING_MEMORY_BYTES, 'bytes of JSON in workingMemory', size)
    return metadata


Metadata = Annotated[dict[str, Any], AfterValidator(_metadata_within_limits)]
ContextCount = Annotated[int, Field(ge=0), AtMost(MAX_CONTEXT_MESSAGES, 'count', 'messages')]
