"""A loopback fake of the Gemini REST API, for driving the real google-genai client in tests.

Start it, point the client at it with `fake_gemini_env(server)` (or `base_url=server.url`), script replies per model
or with a handler, and read `server.calls` to see what the client sent and which model served.

`:streamGenerateContent?alt=sse` answers the same replies as server-sent events, Google's wire format: one `data:`
event per piece of text (a word with the space before it), each a `GenerateContentResponse` with one candidate, the
last with the finish reason and the usage; `FakeReply.chunk_delay_s` paces them (a model that streams at a fixed
rate) and `FakeReply.cut_after` drops the connection after that many events (a stream that breaks off).

    with FakeGemini() as server:
        server.script('gemini-2.5-flash', FakeReply.error(503), FakeReply.text('hello'))
        ...
        assert [call.model for call in server.calls] == ['gemini-2.5-flash', 'gemini-2.5-flash']
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import EmbedHandler, JsonRequestHandler, LoopbackServer, deterministic_embedding, parse_json

# POST /<version>/models/<model>:<method>; the version is whatever the client is configured with (v1, v1beta).
_ROUTE = re.compile(r'^/(?P<version>[^/]+)/models/(?P<model>[^/:]+):(?P<method>[A-Za-z]+)$')

_STATUS_NAMES = {
    400: 'INVALID_ARGUMENT',
    401: 'UNAUTHENTICATED',
    403: 'PERMISSION_DENIED',
    404: 'NOT_FOUND',
    408: 'DEADLINE_EXCEEDED',
    429: 'RESOURCE_EXHAUSTED',
    500: 'INTERNAL',
    503: 'UNAVAILABLE',
    504: 'DEADLINE_EXCEEDED',
}


@dataclass(frozen=True)
class FakeRequest:
    """One request as the fake received it."""

    model: str
    method: str
    path: str
    body: dict[str, Any]
    headers: Mapping[str, str]

    @property
    def api_key(self) -> str | None:
        """The `x-goog-api-key` header."""
        return self.headers.get('x-goog-api-key')

    @property
    def system_text(self) -> str:
        """All text of `systemInstruction`."""
        parts = (self.body.get('systemInstruction') or {}).get('parts') or []
        return ''.join(part.get('text', '') for part in parts)

    @property
    def user_texts(self) -> list[str]:
        """Every text part of every `user` turn, in order."""
        return [
            part['text']
            for content in self.body.get('contents') or []
            if content.get('role', 'user') == 'user'
            for part in content.get('parts') or []
            if 'text' in part
        ]

    @property
    def inline_data(self) -> list[dict[str, Any]]:
        """Every `inlineData` part (`mimeType`, base64 `data`)."""
        return [
            part['inlineData']
            for content in self.body.get('contents') or []
            for part in content.get('parts') or []
            if 'inlineData' in part
        ]

    @property
    def inline_data_count(self) -> int:
        """How many inline blobs (images) the request carried."""
        return len(self.inline_data)

    @property
    def generation_config(self) -> dict[str, Any]:
        """The `generationConfig` object (temperature, maxOutputTokens, thinkingConfig, ...)."""
        return dict(self.body.get('generationConfig') or {})

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Every function declaration offered to the model."""
        return [decl for tool in self.body.get('tools') or [] for decl in tool.get('functionDeclarations') or []]


@dataclass(frozen=True)
class FakeReply:
    """What the fake answers: an HTTP status and a JSON body, optionally after a delay."""

    status: int
    body: dict[str, Any]
    delay_s: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    chunk_delay_s: float = 0.0
    cut_after: int | None = None

    @classmethod
    def text(
        cls,
        text: str,
        *,
        thoughts: Sequence[str] = (),
        finish_reason: str = 'STOP',
        prompt_tokens: int = 11,
        output_tokens: int = 7,
        thought_tokens: int = 0,
        delay_s: float = 0.0,
    ) -> FakeReply:
        """A normal answer; `thoughts` become thought parts before the text."""
        parts: list[dict[str, Any]] = [{'text': thought, 'thought': True} for thought in thoughts]
        parts.append({'text': text})
        return cls(200, _candidate_body(parts, finish_reason, prompt_tokens, output_tokens, thought_tokens), delay_s)

    @classmethod
    def function_calls(cls, *calls: tuple[str, dict[str, Any]], text: str = '', delay_s: float = 0.0) -> FakeReply:
        """An answer asking for `(name, args)` tool calls (optionally with some text before them)."""
        parts: list[dict[str, Any]] = [{'text': text}] if text else []
        parts += [{'functionCall': {'name': name, 'args': args}} for name, args in calls]
        return cls(200, _candidate_body(parts, 'STOP', 11, 7, 0), delay_s)

    @classmethod
    def error(
        cls, status: int, message: str = 'scripted failure', *, delay_s: float = 0.0, retry_after: str | None = None
    ) -> FakeReply:
        """A Google-style error response (with a `Retry-After` header when given)."""
        body = {'error': {'code': status, 'message': message, 'status': _STATUS_NAMES.get(status, 'UNKNOWN')}}
        return cls(status, body, delay_s, {'Retry-After': retry_after} if retry_after is not None else {})

    @classmethod
    def empty(cls, *, delay_s: float = 0.0) -> FakeReply:
        """A 200 with no candidates at all."""
        return cls(200, {'candidates': [], 'usageMetadata': {'promptTokenCount': 11}}, delay_s)

    @classmethod
    def blocked(cls, finish_reason: str = 'SAFETY', *, delay_s: float = 0.0) -> FakeReply:
        """A candidate stopped by a safety filter (no content)."""
        body = {'candidates': [{'finishReason': finish_reason, 'index': 0}], 'usageMetadata': {'promptTokenCount': 11}}
        return cls(200, body, delay_s)

    @classmethod
    def prompt_blocked(cls, reason: str = 'SAFETY', *, delay_s: float = 0.0) -> FakeReply:
        """The prompt itself refused (`promptFeedback.blockReason`)."""
        return cls(200, {'promptFeedback': {'blockReason': reason}, 'usageMetadata': {'promptTokenCount': 11}}, delay_s)

    def after(self, delay_s: float) -> FakeReply:
        """The same reply, sent after `delay_s` seconds."""
        return replace(self, delay_s=delay_s)

    def paced(self, chunk_delay_s: float) -> FakeReply:
        """The same reply; streamed, one event every `chunk_delay_s` seconds."""
        return replace(self, chunk_delay_s=chunk_delay_s)

    def cut(self, after_events: int) -> FakeReply:
        """The same reply; streamed, the connection drops after `after_events` events."""
        return replace(self, cut_after=after_events)

    def sse_events(self) -> list[dict[str, Any]]:
        """The reply as `:streamGenerateContent` sends it: one event per word of text (each other part as it is),
        the finish reason and the usage on the last one. A body without candidates is one event."""
        candidates = self.body.get('candidates') or []
        if not candidates or not (candidates[0].get('content') or {}).get('parts'):
            return [self.body]
        candidate = candidates[0]
        pieces: list[dict[str, Any]] = []
        for part in candidate['content']['parts']:
            if 'text' in part and part['text']:
                words = re.findall(r'\s*\S+|\s+$', part['text'])
                pieces += [{**part, 'text': word} for word in words]
            else:
                pieces.append(part)
        events = [{'candidates': [{'content': {'role': 'model', 'parts': [piece]}, 'index': 0}]} for piece in pieces]
        events[-1]['candidates'][0]['finishReason'] = candidate.get('finishReason', 'STOP')
        events[-1]['usageMetadata'] = self.body.get('usageMetadata', {})
        events[-1]['modelVersion'] = self.body.get('modelVersion', 'fake')
        return events


def _candidate_body(
    parts: list[dict[str, Any]], finish_reason: str, prompt_tokens: int, output_tokens: int, thought_tokens: int
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        'promptTokenCount': prompt_tokens,
        'candidatesTokenCount': output_tokens,
        'totalTokenCount': prompt_tokens + output_tokens + thought_tokens,
    }
    if thought_tokens:
        usage['thoughtsTokenCount'] = thought_tokens
    return {
        'candidates': [{'content': {'role': 'model', 'parts': parts}, 'finishReason': finish_reason, 'index': 0}],
        'usageMetadata': usage,
        'modelVersion': 'fake',
    }


@dataclass
class FakeCall:
    """One entry of the request log."""

    model: str
    method: str
    request: FakeRequest
    received_at: float
    answered_at: float | None = None
    status: int | None = None
    client_gone: bool = False
    events_sent: int = 0


Handler = Callable[[FakeRequest], FakeReply]


def default_handler(request: FakeRequest) -> FakeReply:
    """Answer every generateContent with a fixed text naming the model."""
    return FakeReply.text(f'fake answer from {request.model}')


class FakeGemini(LoopbackServer[FakeCall, FakeReply]):
    """A threaded HTTP server on 127.0.0.1 (random port) speaking enough of the Gemini REST API.

    Replies come, per request, from the model's script queue if it has entries left, else from `handler`.
    `embedContent` / `batchEmbedContents` answer with `embed_handler` (deterministic vectors by default).
    """

    thread_name = 'fake-gemini'

    def __init__(
        self,
        handler: Handler = default_handler,
        *,
        embed_handler: EmbedHandler = deterministic_embedding,
        embedding_dimensions: int = 8,
    ) -> None:
        """Create a stopped server; use it as a context manager or call `start()` / `stop()`."""
        super().__init__()
        self.handler = handler
        self.embed_handler = embed_handler
        self.embedding_dimensions = embedding_dimensions

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_request_handler(self)

    # -- scripting and the log ---------------------------------------------------------------------------------

    def script(self, model: str, *replies: FakeReply) -> None:
        """Queue replies for `model`, used one per request in order before falling back to `handler`."""
        self._add_script(model, replies)

    def pending(self, model: str) -> int:
        """Scripted replies for `model` not used yet."""
        return self._pending(model)

    def calls_for(self, model: str) -> list[FakeCall]:
        """The logged calls to one model."""
        return [call for call in self.calls if call.model == model]

    @property
    def requests(self) -> list[FakeRequest]:
        """The requests received, in arrival order."""
        return [call.request for call in self.calls]

    # -- serving (called from handler threads) -----------------------------------------------------------------

    def _reply(self, request: FakeRequest) -> tuple[FakeCall, FakeReply]:
        call = FakeCall(model=request.model, method=request.method, request=request, received_at=time.monotonic())
        scripted = self._receive(call, request.model)
        if request.method in ('embedContent', 'batchEmbedContents'):
            reply = scripted or self._embed_reply(request)
        elif request.method in ('generateContent', 'streamGenerateContent'):
            reply = scripted or self.handler(request)
        else:
            reply = FakeReply.error(404, f'the fake does not implement :{request.method}')
        return call, reply

    def _embed_reply(self, request: FakeRequest) -> FakeReply:
        def vector(item: Mapping[str, Any]) -> dict[str, Any]:
            text = ''.join(part.get('text', '') for part in (item.get('content') or {}).get('parts') or [])
            dims = int(item.get('outputDimensionality') or self.embedding_dimensions)
            return {'values': self.embed_handler(text, dims)}

        if request.method == 'batchEmbedContents':
            return FakeReply(200, {'embeddings': [vector(item) for item in request.body.get('requests') or []]})
        return FakeReply(200, {'embedding': vector(request.body)})

    def _client_gone(self, call: FakeCall) -> None:
        with self._lock:
            call.client_gone = True

    def _event_sent(self, call: FakeCall) -> None:
        with self._lock:
            call.events_sent += 1


def _make_request_handler(fake: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class _Handler(JsonRequestHandler):
        protocol_version = 'HTTP/1.0'  # one connection a request, as google-genai has always been served here
        content_type = 'application/json; charset=UTF-8'

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self._read_body()
            path = self._route()
            match = _ROUTE.match(path)
            if match is None:
                self._send_json(HTTPStatus.NOT_FOUND, FakeReply.error(404, f'no route for {path}').body)
                return
            try:
                body = parse_json(raw)
            except json.JSONDecodeError:
                self._send_json(HTTPStatus.BAD_REQUEST, FakeReply.error(400, 'body is not JSON').body)
                return
            request = FakeRequest(
                model=match['model'], method=match['method'], path=path, body=body, headers=self._lower_headers()
            )
            call, reply = fake._reply(request)
            fake._wait(reply.delay_s)
            fake._answered(call, reply.status)
            if request.method == 'streamGenerateContent' and reply.status == 200:
                self._stream(call, reply)
            elif not self._send_json(reply.status, reply.body, reply.headers.items()):
                fake._client_gone(call)

        def _stream(self, call: FakeCall, reply: FakeReply) -> None:
            """Server-sent events, as Google sends them (`data: <json>` and a blank line); the connection's end (this
            handler speaks HTTP/1.0) ends the stream."""
            try:
                self.send_response(200)
                self.send_header('Content-Type', 'text/event-stream')
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for index, event in enumerate(reply.sse_events()):
                    if reply.cut_after is not None and index >= reply.cut_after:
                        return  # the connection closes mid-answer
                    if index and reply.chunk_delay_s:
                        fake._wait(reply.chunk_delay_s)
                    self.wfile.write(b'data: ' + json.dumps(event).encode() + b'\r\n\r\n')
                    self.wfile.flush()
                    fake._event_sent(call)
            except (BrokenPipeError, ConnectionResetError):
                fake._client_gone(call)

    return _Handler


def fake_gemini_env(server: FakeGemini) -> dict[str, str]:
    """Environment variables that point google-genai (and GeminiLanguageModel) at the fake."""
    return {'GOOGLE_GEMINI_BASE_URL': server.url, 'GEMINI_API_KEY': 'test-key'}


@contextmanager
def running_fake_gemini(handler: Handler = default_handler) -> Iterator[FakeGemini]:
    """A started FakeGemini for the duration of the block (handy as the body of a pytest fixture)."""
    with FakeGemini(handler) as server:
        yield server
