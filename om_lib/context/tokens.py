"""Token counting for thresholds: o200k string counts plus the reference's message overheads (spec §4.2, §4.3).

CONTRACT §1 "Tokens": every threshold, count and status figure is in o200k tokens plus 3.8 per message and 24 per
conversation, counted the same way everywhere. This module holds the rules; the string tokenizer is injected
(`om_lib.adapters.tiktoken_counter.TiktokenTokenizer` in production, anything with `.version` and `.count()` in
tests), so the domain never imports tiktoken.

Per-part estimates are cached on stored messages (`Message.token_counts`, seed 000 "Token estimate metadata cache"):
an entry is used only when its `version` equals this counter's `version` exactly, so estimates written by another
tokenizer, an older counting logic, or a client are ignored and recomputed. Per-message and per-conversation
overheads are never cached. Attachment estimates (images, files counted by bytes) depend on the model context, so
they are always re-derived from the part; that is arithmetic on the part's fields and never calls the tokenizer.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from om_lib.context.context import render_observation_groups_for_actor
from om_lib.messages import (
    FilePart,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    TokenCounts,
    ToolCallPart,
    ToolResultPart,
)
from om_lib.ports import StringTokenizer

_GROUP_TAG = '<observation-group'

TOKENS_PER_MESSAGE = 3.8
TOKENS_PER_CONVERSATION = 24

# Bump when any rule below changes what a part counts: old cache entries then stop matching and are recomputed.
COUNTER_LOGIC_VERSION = 'om-tc-1'

# Reference: a non-string tool argument/result payload is JSON whose braces and quotes over-count; the reference
# compensates by taking 12 off the message overhead for each one.
_JSON_PAYLOAD_OVERHEAD_DELTA = -12

_ENCRYPTED_CONTENT_KEY = 'encryptedContent'
_ENCRYPTED_CONTENT_REDACTION_THRESHOLD = 256

IMAGE_FILE_EXTENSIONS = frozenset({'png', 'jpg', 'jpeg', 'webp', 'gif', 'bmp', 'tiff', 'tif', 'heic', 'heif', 'avif'})

GoogleMediaResolution = Literal['low', 'medium', 'high', 'ultra_high', 'unspecified']
ImageDetail = Literal['low', 'high', 'auto']

_GEMINI_3_IMAGE_TOKENS: dict[str, int] = {
    'low': 280,
    'medium': 560,
    'high': 1120,
    'ultra_high': 2240,
    'unspecified': 1120,
}
_GOOGLE_LEGACY_TOKENS_PER_TILE = 258
_ANTHROPIC_MAX_LONG_EDGE = 1568
_KIB = 1024
_MIB = 1024 * 1024

# Header sniffing decodes only a prefix of inline base64: PNG/GIF/WebP sizes sit in the first 30 bytes, JPEG's
# SOF marker comes after the EXIF/ICC segments, which rarely exceed a few hundred KB.
_HEADER_PREFIX_CHARS = 4096
_JPEG_PREFIX_CHARS = 4 * ((1 * _MIB) // 3)


@dataclass(frozen=True)
class ModelContext:
    """The model whose attachment costs are estimated (spec §4.3: the counter is model-aware).

    Attributes:
        provider: Provider key, lower-cased on use (`google`, `openai`, `anthropic`; anything else uses the
            OpenAI-style fallback).
        model_id: The model id after the provider (`gemini-2.5-flash`).
        media_resolution: Gemini 3 `mediaResolution` (`low`, `medium`, `high`, `ultra_high`, `unspecified`).
    """

    provider: str
    model_id: str = ''
    media_resolution: GoogleMediaResolution = 'unspecified'

    @classmethod
    def parse(cls, name: str) -> ModelContext:
        """Build a context from `provider/model_id`; a name without a slash is a bare model id with no provider."""
        provider, slash, model_id = name.strip().partition('/')
        if not slash:
            return cls(provider='', model_id=provider)
        return cls(provider=provider, model_id=model_id)

    @property
    def name(self) -> str:
        """`provider/model_id`."""
        return f'{self.provider}/{self.model_id}'


DEFAULT_MODEL_CONTEXT = ModelContext('google', 'gemini-2.5-flash')

ModelLike = ModelContext | tuple[str, str] | str


def _to_context(model: ModelLike | None) -> ModelContext:
    if model is None:
        return DEFAULT_MODEL_CONTEXT
    if isinstance(model, ModelContext):
        return model
    if isinstance(model, str):
        return ModelContext.parse(model)
    provider, model_id = model
    return ModelContext(provider, model_id)


class TokenCounter:
    """Counts strings, parts, messages and message lists in tokenizer tokens plus the reference's overheads.

    Thread-safe: the only mutable state is a memo of role-name counts, whose racing writes store equal values.
    """

    def __init__(self, tokenizer: StringTokenizer, model: ModelLike | None = None) -> None:
        """Create a counter.

        Args:
            tokenizer: Counts plain text (`.version`, `.count(text)`).
            model: The model context for attachment estimates: a `ModelContext`, a `(provider, model_id)` pair or a
                `provider/model_id` string. Defaults to `google/gemini-2.5-flash`.
        """
        self._tokenizer = tokenizer
        self._model = _to_context(model)
        self._version = f'{COUNTER_LOGIC_VERSION}:{tokenizer.version}'
        # Role names are four fixed strings; memoising them keeps cached message counts free of tokenizer calls.
        self._role_tokens: dict[str, int] = {}

    @property
    def version(self) -> str:
        """The cache key of per-part estimates: counting-logic version and tokenizer version."""
        return self._version

    @property
    def model(self) -> ModelContext:
        """The model context used for attachment estimates."""
        return self._model

    @property
    def tokenizer(self) -> StringTokenizer:
        """The string tokenizer."""
        return self._tokenizer

    def with_model(self, model: ModelLike | None) -> TokenCounter:
        """A counter with the same tokenizer (same `version`) for another model context, e.g. the Actor's model."""
        return TokenCounter(self._tokenizer, model)

    # -- strings ---------------------------------------------------------------------------------------------------

    def count_string(self, text: str) -> int:
        """Tokens of a plain string; 0 for ''."""
        if not text:
            return 0
        return self._tokenizer.count(text)

    def count_observations(self, text: str) -> int:
        """Tokens of an observations text as the Actor is shown it: observation groups count as their one-line
        headers, not as the tags they are stored with (every threshold counts what the Actor reads)."""
        return self.count_string(render_observation_groups_for_actor(text) if _GROUP_TAG in text else text)

    # -- parts -----------------------------------------------------------------------------------------------------

    def part_tokens(self, part: Part) -> int | None:
        """The payload estimate of one part, without message overheads; None for parts never counted (reasoning).

        Always computed (never read from a cache), under this counter's model context.
        """
        if isinstance(part, ReasoningPart):
            return None
        attachment = self._attachment_tokens(part)
        if attachment is not None:
            return attachment
        return self._payload_tokens(part)

    def _payload_tokens(self, part: Part) -> int:
        """Model-independent payload tokens (the ones that need the tokenizer and are worth caching)."""
        if isinstance(part, TextPart):
            return self.count_string(part.text)
        if isinstance(part, ToolCallPart):
            tokens = self.count_string(part.tool_name)
            if _has_args(part.args):
                tokens += self.count_string(part.args if isinstance(part.args, str) else _compact_json(part.args))
            return tokens
        if isinstance(part, ToolResultPart):
            if part.result is None:
                return 0
            return self.count_string(format_tool_result(part.result))
        if isinstance(part, FilePart):
            return self.count_string(_file_descriptor(part))
        if isinstance(part, ReasoningPart):
            return 0
        # Unreachable with the current Part union; counting the JSON keeps a new part type from costing nothing.
        return self.count_string(_compact_json(part.model_dump(mode='json', by_alias=True, exclude_none=True)))

    def _attachment_tokens(self, part: Part) -> int | None:
        """Model-dependent estimate of an image or a byte-sized file; None when the part is not one of those."""
        if isinstance(part, ImagePart):
            return estimate_image_tokens(
                self._model,
                width=part.width,
                height=part.height,
                size_bytes=part.size if part.size is not None else _base64_size(part.data),
                data=part.data,
            )
        if isinstance(part, FilePart):
            if is_image_like_file(part):
                return estimate_image_tokens(
                    self._model,
                    width=None,
                    height=None,
                    size_bytes=part.size if part.size is not None else _base64_size(part.data),
                    data=part.data,
                )
            size = part.size if part.size is not None else _base64_size(part.data)
            if size is not None:
                return estimate_file_tokens_from_bytes(self._model.provider, _file_mime_type(part), size)
        return None

    # -- messages --------------------------------------------------------------------------------------------------

    def valid_cached_counts(self, message: Message) -> tuple[int | None, ...] | None:
        """The message's cached per-part counts if they were written by this counter version and are well-formed.

        Anything else (no cache, another version, another part count, a negative or missing value, a value where a
        reasoning part must have None) gives None, so forged or stale estimates are never trusted.
        """
        cached = message.token_counts
        if cached is None or cached.version != self._version or len(cached.parts) != len(message.parts):
            return None
        for part, value in zip(message.parts, cached.parts, strict=True):
            if isinstance(part, ReasoningPart):
                if value is not None:
                    return None
            elif type(value) is not int or value < 0:
                return None
        return cached.parts

    def with_token_counts(self, message: Message) -> Message:
        """The message with `token_counts` filled for this counter; the same object if they are already valid."""
        if self.valid_cached_counts(message) is not None:
            return message
        counts = TokenCounts(version=self._version, parts=tuple(self.part_tokens(p) for p in message.parts))
        return message.model_copy(update={'token_counts': counts})

    def count_message(self, message: Message) -> int:
        """Tokens of one message: role + parts + 3.8 overhead (+ the reference's tool adjustments), rounded.

        Uses the message's cached per-part counts when they are valid for this counter (no tokenizer call then).
        Never negative.
        """
        cached = message.token_counts
        if cached is not None and cached.version == self._version and len(cached.parts) == len(message.parts):
            total = self._count(message, cached.parts)
            if total is not None:
                return total
        total = self._count(message, None)
        assert total is not None  # without a cache there is nothing to reject
        return total

    def _count(self, message: Message, cached: tuple[int | None, ...] | None) -> int | None:
        """Count one message, taking payloads from `cached` when given; None if a cached entry is malformed."""
        payload = self._role_count(message.role)
        overhead = TOKENS_PER_MESSAGE
        extra_messages = 0
        for index, part in enumerate(message.parts):
            # Dispatch on the `type` tag: this loop runs for every message of the window on every step.
            kind = part.type
            if kind == 'reasoning':
                if cached is not None and cached[index] is not None:
                    return None
                continue
            if kind == 'image' or kind == 'file':
                attachment = self._attachment_tokens(part)
                if attachment is not None:
                    payload += attachment
                    continue
            if cached is None:
                payload += self._payload_tokens(part)
            else:
                value = cached[index]
                if type(value) is not int or value < 0:
                    return None
                payload += value
            if kind == 'tool-call':
                args = part.args  # type: ignore[union-attr]
                if _has_args(args) and not isinstance(args, str):
                    overhead += _JSON_PAYLOAD_OVERHEAD_DELTA
            elif kind == 'tool-result':
                # A tool result travels as its own tool message in the provider request: one more message overhead.
                extra_messages += 1
                result = part.result  # type: ignore[union-attr]
                if result is not None and not isinstance(result, str):
                    overhead += _JSON_PAYLOAD_OVERHEAD_DELTA
        total = payload + overhead + extra_messages * TOKENS_PER_MESSAGE
        # JS Math.round (half up), as the reference; clamped because the -12 JSON adjustments can push a tiny
        # tool message below zero, and a message never frees context space.
        return max(0, math.floor(total + 0.5))

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a message list: 0 for an empty list, else 24 + the sum of `count_message`."""
        total = 0
        seen = False
        for message in messages:
            seen = True
            total += self.count_message(message)
        return total + TOKENS_PER_CONVERSATION if seen else 0

    def _role_count(self, role: str) -> int:
        tokens = self._role_tokens.get(role)
        if tokens is None:
            tokens = self.count_string(role)
            self._role_tokens[role] = tokens
        return tokens


# -- tool payloads -------------------------------------------------------------------------------------------------


def _has_args(args: Any) -> bool:
    # The reference counts args when they are truthy in JS: an empty object still counts, '' and null do not.
    return args is not None and args != ''


def _compact_json(value: Any) -> str:
    """`JSON.stringify(value)`: compact, non-ASCII kept."""
    return json.dumps(value, separators=(',', ':'), ensure_ascii=False, default=str)


def strip_encrypted_content(value: Any) -> Any:
    """Replace every `encryptedContent` string longer than 256 characters by a short placeholder, recursively.

    Providers return opaque encrypted blobs (e.g. web search results) the model never reads as text; counting them
    would inflate the window by thousands of tokens.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, entry in value.items():
            if (
                key == _ENCRYPTED_CONTENT_KEY
                and isinstance(entry, str)
                and len(entry) > _ENCRYPTED_CONTENT_REDACTION_THRESHOLD
            ):
                out[key] = f'[stripped encryptedContent: {len(entry)} characters]'
            else:
                out[key] = strip_encrypted_content(entry)
        return out
    if isinstance(value, list | tuple):
        return [strip_encrypted_content(item) for item in value]
    return value


def format_tool_result(value: Any) -> str:
    """The text a tool result is counted as: strings as-is, else 2-space-indented JSON with encrypted blobs stripped."""
    if isinstance(value, str):
        return value
    return json.dumps(strip_encrypted_content(value), indent=2, ensure_ascii=False, default=str)


# -- attachments ---------------------------------------------------------------------------------------------------


def _extension(value: str | None) -> str | None:
    if not value:
        return None
    path = value.split('#', 1)[0].split('?', 1)[0]
    last = path.rsplit('/', 1)[-1]
    if '.' not in last:
        return None
    return last.rsplit('.', 1)[-1].lower()


def is_image_like_file(part: FilePart) -> bool:
    """Whether a file part is really an image: image MIME type, `data:image/` URI, or an image file extension."""
    if part.media_type and part.media_type.lower().startswith('image/'):
        return True
    for source in (part.data, part.url):
        if source and source.startswith('data:image/'):
            return True
    if part.url and not part.url.startswith('data:') and _extension(part.url) in IMAGE_FILE_EXTENSIONS:
        return True
    return _extension(part.filename) in IMAGE_FILE_EXTENSIONS


def _base64_payload(data: str | None) -> str | None:
    """The base64 text of inline data (the part after the comma of a base64 data URI); None if not base64."""
    if not data:
        return None
    if data.startswith('data:'):
        header, comma, payload = data.partition(',')
        if not comma or ';base64' not in header.lower():
            return None
        return payload
    return data


def _base64_size(data: str | None) -> int | None:
    """Decoded byte size of inline base64 data, computed from its length (no decoding)."""
    payload = _base64_payload(data)
    if payload is None:
        return None
    if any(ws in payload for ws in (' ', '\n', '\r', '\t')):
        payload = ''.join(payload.split())
    padding = 2 if payload.endswith('==') else 1 if payload.endswith('=') else 0
    return max(0, (len(payload) * 3) // 4 - padding)


def _decode_prefix(payload: str, chars: int) -> bytes | None:
    chunk = ''.join(payload[:chars].split())
    chunk = chunk[: len(chunk) - len(chunk) % 4]
    try:
        return base64.b64decode(chunk)
    except (binascii.Error, ValueError):
        return None


def image_dimensions(data: str | None) -> tuple[int, int] | None:
    """Width and height read from the header of inline base64 image data (PNG, JPEG, GIF, WebP); None if unknown."""
    payload = _base64_payload(data)
    if not payload:
        return None
    head = _decode_prefix(payload, _HEADER_PREFIX_CHARS)
    if not head:
        return None
    if head.startswith(b'\xff\xd8'):
        dims = _jpeg_dimensions(head)
        if dims is None and len(payload) > _HEADER_PREFIX_CHARS:
            more = _decode_prefix(payload, _JPEG_PREFIX_CHARS)
            dims = _jpeg_dimensions(more) if more else None
        return dims
    return sniff_image_dimensions(head)


def sniff_image_dimensions(head: bytes) -> tuple[int, int] | None:
    """Width and height from the first bytes of a PNG, GIF, WebP or JPEG file; None if unknown or invalid."""
    dims: tuple[int, int] | None = None
    if head.startswith(b'\x89PNG\r\n\x1a\n') and len(head) >= 24 and head[12:16] == b'IHDR':
        dims = struct.unpack('>II', head[16:24])
    elif head[:6] in (b'GIF87a', b'GIF89a') and len(head) >= 10:
        dims = struct.unpack('<HH', head[6:10])
    elif head[:4] == b'RIFF' and head[8:12] == b'WEBP' and len(head) >= 30:
        dims = _webp_dimensions(head)
    elif head.startswith(b'\xff\xd8'):
        dims = _jpeg_dimensions(head)
    if dims is None or dims[0] <= 0 or dims[1] <= 0:
        return None
    return dims


def _webp_dimensions(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b'VP8 ' and head[23:26] == b'\x9d\x01\x2a':
        width, height = struct.unpack('<HH', head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b'VP8L' and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], 'little')
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b'VP8X':
        return int.from_bytes(head[24:27], 'little') + 1, int.from_bytes(head[27:30], 'little') + 1
    return None


# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not frames.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # standalone markers have no length
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], 'big')
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            height, width = struct.unpack('>HH', data[i + 5 : i + 9])
            return (width, height) if width and height else None
        if length < 2:
            return None
        i += 2 + length
    return None


def _openai_estimator(model_id: str) -> tuple[int, int, int]:
    """(base tokens, tile tokens, fallback tiles) of an OpenAI-style model."""
    if model_id.startswith('gpt-5'):
        return 70, 140, 4
    if model_id.startswith('gpt-4o-mini'):
        return 2833, 5667, 1
    if model_id.startswith(('o1', 'o3')):
        return 75, 150, 4
    if 'computer-use' in model_id:
        return 65, 129, 4
    return 85, 170, 4


def _js_round(value: float) -> int:
    return math.floor(value + 0.5)


def _openai_high_detail_tiles(width: int | None, height: int | None, size_bytes: int | None, fallback: int) -> int:
    if width and height:
        w, h = float(width), float(height)
        longest = max(w, h)
        if longest > 2048:
            w, h = w * 2048 / longest, h * 2048 / longest
        shortest = min(w, h)
        if shortest > 768:
            w, h = w * 768 / shortest, h * 768 / shortest
        sw, sh = max(1, _js_round(w)), max(1, _js_round(h))
        return max(1, math.ceil(sw / 512) * math.ceil(sh / 512))
    if size_bytes is not None:
        if size_bytes <= 512 * _KIB:
            return 1
        if size_bytes <= 2 * _MIB:
            return 4
        if size_bytes <= 4 * _MIB:
            return 6
        return 8
    return fallback


def _anthropic_image_tokens(width: int | None, height: int | None, size_bytes: int | None) -> int:
    if width and height:
        longest = max(width, height)
        if longest > _ANTHROPIC_MAX_LONG_EDGE:
            ratio = _ANTHROPIC_MAX_LONG_EDGE / longest
            width, height = max(1, _js_round(width * ratio)), max(1, _js_round(height * ratio))
        return max(1, math.ceil(width * height / 750))
    if size_bytes is not None:
        if size_bytes <= 512 * _KIB:
            return 341
        if size_bytes <= 2 * _MIB:
            return 1366
        if size_bytes <= 4 * _MIB:
            return 2048
        return 2731
    return 1600


def estimate_image_tokens(
    model: ModelContext,
    *,
    width: int | None,
    height: int | None,
    size_bytes: int | None,
    data: str | None = None,
    detail: ImageDetail = 'auto',
) -> int:
    """Local image-token heuristic of spec §4.3 for the model context.

    Args:
        model: Provider and model id. `google`: Gemini 3 by media resolution, older Gemini 258 per 768px tile;
            `anthropic`: pixels / 750 after fitting 1568px; anything else: OpenAI-style base + tiles.
        width: Known width in pixels, else None (then read from `data`'s header when possible).
        height: Known height in pixels, else None.
        size_bytes: Byte size of the image when known.
        data: Inline base64 (or base64 data URI) to read dimensions from when they are not given.
        detail: OpenAI detail level; `auto` picks high above 768px or 1 MiB.

    Returns:
        The estimated tokens (an int ≥ 1).
    """
    if not (width and height):
        dims = image_dimensions(data)
        if dims is not None:
            width, height = dims
        else:
            width = height = None
    provider = model.provider.lower()
    model_id = model.model_id.lower()
    if provider == 'google':
        if model_id.startswith('gemini-3'):
            return _GEMINI_3_IMAGE_TOKENS.get(model.media_resolution, _GEMINI_3_IMAGE_TOKENS['unspecified'])
        if width and height:
            return _GOOGLE_LEGACY_TOKENS_PER_TILE * max(1, math.ceil(width / 768) * math.ceil(height / 768))
        return _GOOGLE_LEGACY_TOKENS_PER_TILE
    if provider == 'anthropic':
        return _anthropic_image_tokens(width, height, size_bytes)
    base, tile, fallback_tiles = _openai_estimator(model_id)
    effective = detail
    if effective == 'auto':
        if width and height:
            effective = 'high' if max(width, height) > 768 else 'low'
        elif size_bytes is not None:
            effective = 'high' if size_bytes > _MIB else 'low'
        else:
            effective = 'low'
    if effective == 'low':
        return base
    return base + _openai_high_detail_tiles(width, height, size_bytes, fallback_tiles) * tile


def estimate_file_tokens_from_bytes(provider: str, mime_type: str, size_bytes: int) -> int:
    """Byte-based estimate of a non-image file (spec §4.3): PDFs by provider, anything else bytes / 4."""
    mime = mime_type.lower().split(';', 1)[0].strip()
    provider = provider.lower()
    if mime == 'application/pdf':
        if provider == 'google':
            return max(258, math.ceil(size_bytes / 20))
        if provider == 'anthropic':
            return max(1500, math.ceil(size_bytes / 3))
        return max(500, math.ceil(size_bytes / 4))
    return max(1, math.ceil(size_bytes / 4))


def _file_mime_type(part: FilePart) -> str:
    if part.media_type and part.media_type.strip():
        return part.media_type.strip()
    for source in (part.data, part.url):
        if source and source.startswith('data:'):
            header = source.split(',', 1)[0]
            mime = header[5:].split(';', 1)[0]
            if mime:
                return mime
    return 'application/octet-stream'


def _file_descriptor(part: FilePart) -> str:
    """What a file with no known size is counted as: `{"type":"file","mimeType":…,"filename":…}` (reference)."""
    filename = part.filename.strip() if part.filename and part.filename.strip() else None
    if filename is None and part.url and not part.url.startswith('data:'):
        # Like the reference, fall back to the last segment of the URL's path.
        last = urlsplit(part.url).path.rstrip('/').rsplit('/', 1)[-1]
        filename = unquote(last) or None
    return _compact_json({'type': 'file', 'mimeType': part.media_type, 'filename': filename})
