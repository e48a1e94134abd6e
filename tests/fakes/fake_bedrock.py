"""A loopback fake of the Bedrock Runtime API (Converse, ConverseStream, and InvokeModel for Titan text embeddings).

It speaks the REST-JSON wire protocol, so the real boto3 `bedrock-runtime` client talks to it unchanged once
`AWS_ENDPOINT_URL_BEDROCK_RUNTIME` points at it (dummy credentials: the fake reads no signature, but it records that
the request was SigV4-signed). Errors carry the `X-Amzn-ErrorType` header botocore maps to its exception codes
(ThrottlingException, ValidationException, AccessDeniedException, ResourceNotFoundException, ...).

    with FakeBedrock() as server:
        server.script('us.amazon.nova-lite-v1:0', ConverseReply.error('ThrottlingException'), ConverseReply.text('hi'))
        ...
        assert server.converse_requests[-1].system_text.startswith('You are')

ConverseStream (`/model/{modelId}/converse-stream`) answers the same replies in AWS's binary event-stream encoding
(`application/vnd.amazon.eventstream`: length-prefixed messages with typed headers and CRC32 checksums): messageStart,
one contentBlockDelta per word of text (tool calls as contentBlockStart + an input delta), contentBlockStop,
messageStop with the stop reason and metadata with the usage; a scripted error after the stream began is an
`exception` message (botocore raises it as an EventStreamError), as the service sends throttling mid-stream.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from tests.fakes.loopback import EmbedHandler, JsonRequestHandler, LoopbackServer, keyword_embedding, parse_json

# POST /model/<modelId>/converse | /model/<modelId>/invoke; botocore percent-encodes the id (ARNs hold `/` and `:`).
_ROUTE = re.compile(r'^/model/(?P<model>[^/]+)/(?P<operation>converse|converse-stream|invoke)$')

# The HTTP status of each error code, as in the service model.
ERROR_STATUS = {
    'ThrottlingException': 429,
    'ValidationException': 400,
    'AccessDeniedException': 403,
    'ResourceNotFoundException': 404,
    'ModelTimeoutException': 408,
    'ModelNotReadyException': 429,
    'ModelErrorException': 424,
    'ServiceQuotaExceededException': 400,
    'InternalServerException': 500,
    'ServiceUnavailableException': 503,
}


def _blocks_text(blocks: Any) -> str:
    return ''.join(block.get('text', '') for block in blocks or [] if isinstance(block, dict))


@dataclass(frozen=True)
class ConverseRequest:
    """One `POST /model/{modelId}/converse` as received (blobs are base64 on the wire; the accessors decode them)."""

    model_id: str
    body: dict[str, Any]
    headers: Mapping[str, str]

    @property
    def signed(self) -> bool:
        """Whether the client signed the request (SigV4 `Authorization` header)."""
        return self.headers.get('authorization', '').startswith('AWS4-HMAC-SHA256')

    @property
    def system_text(self) -> str:
        """All text of `system`."""
        return _blocks_text(self.body.get('system'))

    @property
    def system_cache_points(self) -> int:
        """How many `cachePoint` blocks `system` carries."""
        return sum(1 for block in self.body.get('system') or [] if 'cachePoint' in block)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The `messages` array."""
        return list(self.body.get('messages') or [])

    @property
    def roles(self) -> list[str]:
        """Each message's role, in order."""
        return [m.get('role', '') for m in self.messages]

    def blocks(self, kind: str) -> list[Any]:
        """Every content block of one kind (`text`, `image`, `document`, `toolUse`, `toolResult`), in order."""
        return [block[kind] for m in self.messages for block in m.get('content') or [] if kind in block]

    @property
    def user_texts(self) -> list[str]:
        """Every text block of every user message."""
        return [
            b['text'] for m in self.messages if m.get('role') == 'user' for b in m.get('content') or [] if 'text' in b
        ]

    @property
    def last_user_text(self) -> str:
        """The newest user text ('' when none)."""
        texts = self.user_texts
        return texts[-1] if texts else ''

    @property
    def images(self) -> list[tuple[str, bytes]]:
        """Every image block as (format, decoded bytes)."""
        return [(image['format'], base64.b64decode(image['source']['bytes'])) for image in self.blocks('image')]

    @property
    def tool_names(self) -> list[str]:
        """The tools offered in `toolConfig`."""
        return [tool['toolSpec']['name'] for tool in (self.body.get('toolConfig') or {}).get('tools') or []]

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        """Every toolResult block (`toolUseId`, `content`)."""
        return self.blocks('toolResult')

    @property
    def inference_config(self) -> dict[str, Any]:
        """`inferenceConfig` (maxTokens, temperature, ...)."""
        return dict(self.body.get('inferenceConfig') or {})


@dataclass(frozen=True)
class InvokeRequest:
    """One `POST /model/{modelId}/invoke` as received (a JSON body)."""

    model_id: str
    body: dict[str, Any]
    headers: Mapping[str, str]


@dataclass(frozen=True)
class ConverseReply:
    """What the fake answers: content blocks and a stop reason, or an error; optionally after a delay."""

    content: tuple[dict[str, Any], ...] = ()
    stop_reason: str = 'end_turn'
    error_code: str | None = None
    error_message: str = ''
    input_tokens: int = 11
    output_tokens: int = 7
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    delay_s: float = 0.0
    retry_after: str | None = None
    chunk_delay_s: float = 0.0
    stream_error_after: int | None = None  # ConverseStream: an exception event after this many events

    @classmethod
    def text(cls, text: str, *, stop_reason: str = 'end_turn', delay_s: float = 0.0, **usage: int) -> ConverseReply:
        """A plain answer (usage: input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)."""
        return cls(content=({'text': text},), stop_reason=stop_reason, delay_s=delay_s, **usage)

    @classmethod
    def tool_use(cls, *calls: tuple[str, dict[str, Any]], text: str = '', delay_s: float = 0.0) -> ConverseReply:
        """An answer asking for `(name, input)` tool calls (optionally after some text); ids are assigned."""
        blocks: list[dict[str, Any]] = [{'text': text}] if text else []
        blocks += [
            {'toolUse': {'toolUseId': f'tooluse_{name}_{n}', 'name': name, 'input': args}}
            for n, (name, args) in enumerate(calls)
        ]
        return cls(content=tuple(blocks), stop_reason='tool_use', delay_s=delay_s)

    @classmethod
    def error(
        cls, code: str, message: str = 'scripted failure', *, delay_s: float = 0.0, retry_after: str | None = None
    ) -> ConverseReply:
        """A Bedrock error (the status follows the code, as in the service model), with a `Retry-After` when given."""
        return cls(error_code=code, error_message=message, delay_s=delay_s, retry_after=retry_after)

    def body(self) -> dict[str, Any]:
        """The Converse response body."""
        return {
            'output': {'message': {'role': 'assistant', 'content': list(self.content)}},
            'stopReason': self.stop_reason,
            'usage': {
                'inputTokens': self.input_tokens,
                'outputTokens': self.output_tokens,
                'totalTokens': self.input_tokens
                + self.output_tokens
                + self.cache_read_tokens
                + self.cache_write_tokens,
                'cacheReadInputTokens': self.cache_read_tokens,
                'cacheWriteInputTokens': self.cache_write_tokens,
            },
            'metrics': {'latencyMs': 1},
        }

    def stream_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The reply as ConverseStream sends it: (event type, payload) in order."""
        events: list[tuple[str, dict[str, Any]]] = [('messageStart', {'role': 'assistant'})]
        for index, block in enumerate(self.content):
            if 'text' in block:
                for word in re.findall(r'\s*\S+|\s+$', block['text']):
                    events.append(('contentBlockDelta', {'contentBlockIndex': index, 'delta': {'text': word}}))
            elif 'toolUse' in block:
                use = block['toolUse']
                start = {'toolUse': {'toolUseId': use['toolUseId'], 'name': use['name']}}
                events.append(('contentBlockStart', {'contentBlockIndex': index, 'start': start}))
                delta = {'toolUse': {'input': json.dumps(use.get('input') or {})}}
                events.append(('contentBlockDelta', {'contentBlockIndex': index, 'delta': delta}))
            events.append(('contentBlockStop', {'contentBlockIndex': index}))
        events.append(('messageStop', {'stopReason': self.stop_reason}))
        body = self.body()
        events.append(('metadata', {'usage': body['usage'], 'metrics': body['metrics']}))
        return events


def event_stream_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One message of AWS's event-stream encoding: total and header lengths, the prelude's CRC32, string headers
    (name length, name, type 7, value length, value), the payload, and the message's CRC32."""
    encoded = b''.join(
        struct.pack('>B', len(name)) + name.encode() + struct.pack('>BH', 7, len(value.encode())) + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack('>II', total, len(encoded))
    prelude += struct.pack('>I', binascii.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack('>I', binascii.crc32(message))


@dataclass
class FakeCall:
    """One entry of the request log."""

    operation: str  # 'converse' | 'converse-stream' | 'invoke'
    model_id: str
    request: ConverseRequest | InvokeRequest
    received_at: float
    answered_at: float | None = None
    status: int | None = None


ConverseHandler = Callable[[ConverseRequest], ConverseReply]


def default_handler(request: ConverseRequest) -> ConverseReply:
    """Answer every Converse call with a text naming the model."""
    return ConverseReply.text(f'fake answer from {request.model_id}')


class FakeBedrock(LoopbackServer[FakeCall, ConverseReply]):
    """A threaded HTTP server on 127.0.0.1 (random port) speaking Converse and Titan-embeddings InvokeModel.

    Converse replies come from the model's script, then the shared script, then `handler`. InvokeModel answers as
    `amazon.titan-embed-text-v1/v2` do (`embedding`, `inputTextTokenCount`); a scripted error applies to it too.
    """

    thread_name = 'fake-bedrock'

    def __init__(
        self, handler: ConverseHandler = default_handler, *, embed_handler: EmbedHandler = keyword_embedding
    ) -> None:
        """Create a stopped server; use it as a context manager or call `start()` / `stop()`."""
        super().__init__()
        self.handler = handler
        self.embed_handler = embed_handler

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_request_handler(self)

    # -- scripting and the log ---------------------------------------------------------------------------------
    def script(self, model_id: str | None, *replies: ConverseReply) -> None:
        """Queue replies for `model_id` (None: any model), used one per request before `handler`."""
        self._add_script(model_id, replies)

    def pending(self, model_id: str | None = None) -> int:
        """Scripted replies not used yet."""
        return self._pending(model_id)

    def calls_for(self, model_id: str) -> list[FakeCall]:
        """The logged calls to one model."""
        return [call for call in self.calls if call.model_id == model_id]

    @property
    def converse_requests(self) -> list[ConverseRequest]:
        """The Converse requests received, in order."""
        return [c.request for c in self.calls if isinstance(c.request, ConverseRequest)]

    @property
    def invoke_requests(self) -> list[InvokeRequest]:
        """The InvokeModel requests received, in order."""
        return [c.request for c in self.calls if isinstance(c.request, InvokeRequest)]

    # -- serving (handler threads) -----------------------------------------------------------------------------
    def embedding(self, request: InvokeRequest) -> dict[str, Any]:
        """The Titan embeddings answer: v2 honours `dimensions` (256/512/1024, default 1024) and `normalize`."""
        text = str(request.body.get('inputText', ''))
        v2 = 'embed-text-v2' in request.model_id
        dims = int(request.body.get('dimensions') or 1024) if v2 else 1536
        vector = self.embed_handler(text, dims)
        return {'embedding': vector, 'inputTextTokenCount': max(1, len(text.split()))}


def _make_request_handler(fake: FakeBedrock) -> type[BaseHTTPRequestHandler]:
    class _Handler(JsonRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self._read_body()
            match = _ROUTE.match(self._route())
            if match is None:
                self._send(404, {'message': f'no route for {self.path}'}, 'UnknownOperationException')
                return
            try:
                body = parse_json(raw)
            except json.JSONDecodeError:
                self._send(400, {'message': 'the body is not JSON'}, 'ValidationException')
                return
            model_id = unquote(match['model'])
            headers = self._lower_headers()
            if match['operation'] in ('converse', 'converse-stream'):
                request: ConverseRequest | InvokeRequest = ConverseRequest(model_id, body, headers)
            else:
                request = InvokeRequest(model_id, body, headers)
            call = FakeCall(match['operation'], model_id, request, time.monotonic())
            reply = fake._receive(call, model_id, None)
            if isinstance(request, ConverseRequest) and reply is None:
                reply = fake.handler(request)
            if reply is not None:
                fake._wait(reply.delay_s)
            if reply is not None and reply.error_code:
                status = ERROR_STATUS.get(reply.error_code, 400)
                fake._answered(call, status)
                self._send(status, {'message': reply.error_message}, reply.error_code, retry_after=reply.retry_after)
            elif isinstance(request, ConverseRequest) and match['operation'] == 'converse-stream':
                assert reply is not None
                fake._answered(call, 200)
                self._stream(reply)
            elif isinstance(request, ConverseRequest):
                assert reply is not None
                fake._answered(call, 200)
                self._send(200, reply.body())
            else:
                fake._answered(call, 200)
                self._send(200, fake.embedding(request))

        def _stream(self, reply: ConverseReply) -> None:
            """The answer as event-stream messages, chunked, one flush per event."""
            try:
                self.send_response(200)
                self.send_header('Content-Type', 'application/vnd.amazon.eventstream')
                self.send_header('Transfer-Encoding', 'chunked')
                self.send_header('x-amzn-RequestId', 'fake-request-id')
                self.end_headers()
                for index, (kind, payload) in enumerate(reply.stream_events()):
                    if reply.stream_error_after is not None and index >= reply.stream_error_after:
                        headers = {
                            ':message-type': 'exception',
                            ':exception-type': 'throttlingException',
                            ':content-type': 'application/json',
                        }
                        self._chunk(event_stream_message(headers, json.dumps({'message': 'scripted'}).encode()))
                        break
                    if index and reply.chunk_delay_s:
                        fake._wait(reply.chunk_delay_s)
                    headers = {':message-type': 'event', ':event-type': kind, ':content-type': 'application/json'}
                    self._chunk(event_stream_message(headers, json.dumps(payload).encode()))
                self._chunk(b'')
            except (BrokenPipeError, ConnectionResetError):
                return

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f'{len(data):x}\r\n'.encode() + data + b'\r\n')
            self.wfile.flush()

        def _send(
            self, status: int, body: dict[str, Any], error_type: str | None = None, *, retry_after: str | None = None
        ) -> None:
            headers = [('x-amzn-RequestId', 'fake-request-id')]
            if retry_after is not None:
                headers.append(('Retry-After', retry_after))
            if error_type:
                headers.append(
                    ('x-amzn-ErrorType', f'{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/')
                )
            self._send_json(status, body, headers)  # a client that gave up (its read timeout fired) is no error

    return _Handler


def fake_bedrock_env(server: FakeBedrock) -> dict[str, str]:
    """Environment that points boto3's `bedrock-runtime` client at the fake (dummy credentials are fine)."""
    return {'AWS_ENDPOINT_URL_BEDROCK_RUNTIME': server.url}


@contextmanager
def running_fake_bedrock(handler: ConverseHandler = default_handler) -> Iterator[FakeBedrock]:
    """A started FakeBedrock for the duration of the block."""
    with FakeBedrock(handler) as server:
        yield server
