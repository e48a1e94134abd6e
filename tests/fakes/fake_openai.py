"""A loopback fake of the OpenAI REST API (Chat Completions, Embeddings), for driving real OpenAI-compatible clients.

It speaks the wire protocol, so the real `openai` client (and SDKs built on it: the OpenAI Agents SDK's
`OpenAIChatCompletionsModel`, Strands' `OpenAIModel`, any gateway client) talk to it unchanged: non-streaming and
streaming (SSE) chat completions, tool calls, and embeddings (float or base64). Script replies, or pass a handler;
read `server.chat_requests` to see what the model was sent.

    with FakeOpenAI() as server:
        server.script(ChatReply.tool_calls(('get_weather', {'city': 'Lisbon'})), ChatReply.text('Sunny.'))
        client = openai.OpenAI(base_url=server.base_url, api_key='test')
        ...
        assert server.chat_requests[-1].tool_results == ['{"temp": 21}']
"""

from __future__ import annotations

import base64
import itertools
import json
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.loopback import EmbedHandler, JsonRequestHandler, LoopbackServer, deterministic_embedding, parse_json

_ERROR_TYPES = {
    400: 'invalid_request_error',
    401: 'authentication_error',
    403: 'permission_error',
    404: 'not_found_error',
    429: 'rate_limit_exceeded',
    500: 'server_error',
    503: 'server_error',
}


def _text_of(content: Any) -> str:
    """The text of a message's `content` (a string, or a list of `{type: text, text}` parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return ''.join(part.get('text', '') for part in content if isinstance(part, dict))
    return ''


@dataclass(frozen=True)
class ChatRequest:
    """One `POST /v1/chat/completions` as received."""

    body: dict[str, Any]
    headers: Mapping[str, str]

    @property
    def model(self) -> str:
        """The `model` field."""
        return str(self.body.get('model', ''))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The `messages` array."""
        return list(self.body.get('messages') or [])

    @property
    def stream(self) -> bool:
        """Whether the client asked for server-sent events."""
        return bool(self.body.get('stream'))

    def texts(self, role: str) -> list[str]:
        """The text of every message with `role`, in order."""
        return [_text_of(m.get('content')) for m in self.messages if m.get('role') == role]

    @property
    def system_texts(self) -> list[str]:
        """Every system (or developer) message's text."""
        return [_text_of(m.get('content')) for m in self.messages if m.get('role') in ('system', 'developer')]

    @property
    def system_text(self) -> str:
        """All system text, joined."""
        return '\n\n'.join(self.system_texts)

    @property
    def user_texts(self) -> list[str]:
        """Every user message's text."""
        return self.texts('user')

    @property
    def last_user_text(self) -> str:
        """The newest user message's text ('' when none)."""
        texts = self.user_texts
        return texts[-1] if texts else ''

    @property
    def tool_names(self) -> list[str]:
        """The functions offered to the model."""
        return [t.get('function', {}).get('name', '') for t in self.body.get('tools') or []]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Every tool call in the assistant messages of the history (`{id, function: {name, arguments}}`)."""
        return [call for m in self.messages if m.get('role') == 'assistant' for call in m.get('tool_calls') or []]

    @property
    def tool_results(self) -> list[str]:
        """The content of every `tool` message, in order."""
        return self.texts('tool')

    @property
    def image_urls(self) -> list[str]:
        """Every `image_url` part's URL (https or data: URLs)."""
        return [
            part['image_url']['url']
            for m in self.messages
            if isinstance(m.get('content'), list)
            for part in m['content']
            if isinstance(part, dict) and part.get('type') == 'image_url'
        ]


@dataclass(frozen=True)
class EmbeddingsRequest:
    """One `POST /v1/embeddings` as received."""

    body: dict[str, Any]
    headers: Mapping[str, str]

    @property
    def inputs(self) -> list[str]:
        """The input texts (token-id inputs are shown as their JSON)."""
        raw = self.body.get('input')
        items = raw if isinstance(raw, list) and (not raw or not isinstance(raw[0], int)) else [raw]
        return [item if isinstance(item, str) else json.dumps(item) for item in items]


@dataclass(frozen=True)
class ToolCall:
    """A tool call the fake model makes."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the JSON string the wire carries."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class ChatReply:
    """What the fake answers to a chat completion: text and/or tool calls, or an error; optionally after a delay."""

    content: str | None = None
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    status: int = 200
    error_message: str = ''
    error_code: str | None = None
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int = 0
    delay_s: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    chunk_delay_s: float = 0.0  # streamed: the pause between two chunks (a model that streams at a fixed rate)

    @classmethod
    def text(cls, text: str, *, finish_reason: str = 'stop', delay_s: float = 0.0) -> ChatReply:
        """A plain answer."""
        return cls(content=text, finish_reason=finish_reason, delay_s=delay_s)

    @classmethod
    def tool_calls(
        cls, *calls: tuple[str, dict[str, Any]] | ToolCall, text: str | None = None, delay_s: float = 0.0
    ) -> ChatReply:
        """An answer asking for tool calls, `(name, arguments)` pairs or `ToolCall`s (optionally with text)."""
        made = tuple(c if isinstance(c, ToolCall) else ToolCall(c[0], c[1]) for c in calls)
        return cls(content=text, calls=made, finish_reason='tool_calls', delay_s=delay_s)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = 'scripted failure',
        *,
        code: str | None = None,
        delay_s: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> ChatReply:
        """An OpenAI-style error answer (`code` as OpenAI sends it, e.g. `insufficient_quota` on a 429), with extra
        `headers` (e.g. `retry-after-ms`) when given."""
        return cls(
            status=status,
            error_message=message,
            error_code=code,
            delay_s=delay_s,
            headers=tuple((headers or {}).items()),
        )

    def after(self, delay_s: float) -> ChatReply:
        """The same reply, sent after `delay_s` seconds."""
        return replace(self, delay_s=delay_s)

    def paced(self, chunk_delay_s: float) -> ChatReply:
        """The same reply; streamed, one chunk every `chunk_delay_s` seconds."""
        return replace(self, chunk_delay_s=chunk_delay_s)


@dataclass
class FakeCall:
    """One entry of the request log."""

    kind: str  # 'chat' | 'embeddings'
    request: ChatRequest | EmbeddingsRequest
    received_at: float
    answered_at: float | None = None
    status: int | None = None


ChatHandler = Callable[[ChatRequest], ChatReply]


def default_handler(request: ChatRequest) -> ChatReply:
    """Echo the last user message."""
    return ChatReply.text(f'fake answer to: {request.last_user_text}'[:500])


class FakeOpenAI(LoopbackServer[FakeCall, ChatReply]):
    """A threaded HTTP server on 127.0.0.1 (random port) speaking the OpenAI Chat Completions and Embeddings APIs.

    Chat replies come from the model's script if it has entries left, then the shared script, then `handler`.
    Embeddings are deterministic per text (`embed_handler`), `embedding_dimensions` long unless the request asks.
    """

    thread_name = 'fake-openai'

    def __init__(
        self,
        handler: ChatHandler = default_handler,
        *,
        embed_handler: EmbedHandler = deterministic_embedding,
        embedding_dimensions: int = 8,
    ) -> None:
        """Create a stopped server; use it as a context manager or call `start()` / `stop()`."""
        super().__init__()
        self.handler = handler
        self.embed_handler = embed_handler
        self.embedding_dimensions = embedding_dimensions
        self._ids = itertools.count(1)

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_request_handler(self)

    @property
    def base_url(self) -> str:
        """The OpenAI client's `base_url` (`.../v1`)."""
        return f'{self.url}/v1'

    # -- scripting and the log ---------------------------------------------------------------------------------
    def script(self, *replies: ChatReply, model: str | None = None) -> None:
        """Queue chat replies (for `model` only, or for any model), used one per request before `handler`."""
        self._add_script(model, replies)

    def pending(self, model: str | None = None) -> int:
        """Scripted replies not used yet."""
        return self._pending(model)

    @property
    def chat_requests(self) -> list[ChatRequest]:
        """The chat completion requests received, in order."""
        return [c.request for c in self.calls if isinstance(c.request, ChatRequest)]

    @property
    def embedding_requests(self) -> list[EmbeddingsRequest]:
        """The embeddings requests received, in order."""
        return [c.request for c in self.calls if isinstance(c.request, EmbeddingsRequest)]

    # -- serving (handler threads) -----------------------------------------------------------------------------
    def _chat_reply(self, request: ChatRequest) -> ChatReply:
        return self._scripted(request.model, None) or self.handler(request)

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            return f'{prefix}-fake-{next(self._ids)}'

    def chat_completion(self, request: ChatRequest, reply: ChatReply) -> dict[str, Any]:
        """The non-streaming answer body."""
        tool_calls = [self._tool_call_json(call) for call in reply.calls]
        message: dict[str, Any] = {'role': 'assistant', 'content': reply.content, 'refusal': None}
        if tool_calls:
            message['tool_calls'] = tool_calls
        return {
            'id': self._next_id('chatcmpl'),
            'object': 'chat.completion',
            'created': int(time.time()),
            'model': request.model,
            'choices': [
                {'index': 0, 'message': message, 'finish_reason': _finish(reply), 'logprobs': None},
            ],
            'usage': _usage(reply),
        }

    def chat_chunks(self, request: ChatRequest, reply: ChatReply) -> Iterator[dict[str, Any]]:
        """The streamed answer as `chat.completion.chunk` objects (text in pieces, tool arguments in pieces)."""
        base = {
            'id': self._next_id('chatcmpl'),
            'object': 'chat.completion.chunk',
            'created': int(time.time()),
            'model': request.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish, 'logprobs': None}]}

        yield chunk({'role': 'assistant', 'content': ''})
        for piece in _pieces(reply.content or ''):
            yield chunk({'content': piece})
        for index, call in enumerate(reply.calls):
            wire = self._tool_call_json(call)
            first = {
                'index': index,
                'id': wire['id'],
                'type': 'function',
                'function': {'name': call.name, 'arguments': ''},
            }
            yield chunk({'tool_calls': [first]})
            for piece in _pieces(wire['function']['arguments']):
                yield chunk({'tool_calls': [{'index': index, 'function': {'arguments': piece}}]})
        yield chunk({}, _finish(reply))
        if (request.body.get('stream_options') or {}).get('include_usage'):
            yield {**base, 'choices': [], 'usage': _usage(reply)}

    def _tool_call_json(self, call: ToolCall) -> dict[str, Any]:
        return {
            'id': call.id or self._next_id('call'),
            'type': 'function',
            'function': {'name': call.name, 'arguments': call.arguments_json()},
        }

    def embeddings(self, request: EmbeddingsRequest) -> dict[str, Any]:
        """The embeddings answer body (base64 little-endian float32 when asked, as the openai client asks)."""
        dims = int(request.body.get('dimensions') or self.embedding_dimensions)
        as_base64 = request.body.get('encoding_format') == 'base64'
        data = []
        for index, text in enumerate(request.inputs):
            vector = self.embed_handler(text, dims)
            value: Any = vector
            if as_base64:
                value = base64.b64encode(struct.pack(f'<{len(vector)}f', *vector)).decode('ascii')
            data.append({'object': 'embedding', 'index': index, 'embedding': value})
        tokens = sum(max(1, len(text.split())) for text in request.inputs)
        return {
            'object': 'list',
            'data': data,
            'model': request.body.get('model', ''),
            'usage': {'prompt_tokens': tokens, 'total_tokens': tokens},
        }


def _finish(reply: ChatReply) -> str:
    return reply.finish_reason or ('tool_calls' if reply.calls else 'stop')


def _usage(reply: ChatReply) -> dict[str, Any]:
    return {
        'prompt_tokens': reply.prompt_tokens,
        'completion_tokens': reply.completion_tokens,
        'total_tokens': reply.prompt_tokens + reply.completion_tokens,
        'prompt_tokens_details': {'cached_tokens': reply.cached_tokens},
    }


def _pieces(text: str, count: int = 3) -> list[str]:
    """`text` cut into up to `count` pieces (streamed deltas)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)]


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {'error': {'message': message, 'type': _ERROR_TYPES.get(status, 'api_error'), 'param': None, 'code': code}}


def _make_request_handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class _Handler(JsonRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self._route().rstrip('/')
            if path in ('/v1/models', '/models'):
                self._send_json(200, {'object': 'list', 'data': [{'id': 'fake-model', 'object': 'model'}]})
            else:
                self._send_json(404, error_body(404, f'no route GET {path}'))

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self._read_body()
            path = self._route().rstrip('/')
            headers = self._lower_headers()
            try:
                body = parse_json(raw)
            except json.JSONDecodeError:
                self._send_json(400, error_body(400, 'the body is not JSON'))
                return
            if path in ('/v1/chat/completions', '/chat/completions'):
                self._chat(ChatRequest(body=body, headers=headers))
            elif path in ('/v1/embeddings', '/embeddings'):
                request = EmbeddingsRequest(body=body, headers=headers)
                call = FakeCall('embeddings', request, time.monotonic())
                fake._log(call)
                fake._answered(call, 200)
                self._send_json(200, fake.embeddings(request))
            else:
                self._send_json(404, error_body(404, f'the fake does not implement POST {path}'))

        def _chat(self, request: ChatRequest) -> None:
            call = FakeCall('chat', request, time.monotonic())
            fake._log(call)
            reply = fake._chat_reply(request)
            fake._wait(reply.delay_s)
            fake._answered(call, reply.status)
            if reply.status != 200:
                self._send_json(
                    reply.status, error_body(reply.status, reply.error_message, reply.error_code), reply.headers
                )
            elif request.stream:
                self._send_events(fake.chat_chunks(request, reply), reply.chunk_delay_s)
            else:
                self._send_json(200, fake.chat_completion(request, reply))

        def _send_events(self, chunks: Iterator[dict[str, Any]], chunk_delay_s: float = 0.0) -> None:
            try:
                self.send_response(HTTPStatus.OK)
                self.send_header('Content-Type', 'text/event-stream')
                self.send_header('Cache-Control', 'no-cache')
                self.send_header('Connection', 'close')  # the stream ends when the connection does
                self.end_headers()
                for index, item in enumerate(chunks):
                    if index and chunk_delay_s:
                        fake._wait(chunk_delay_s)
                    self.wfile.write(f'data: {json.dumps(item)}\n\n'.encode())
                    self.wfile.flush()
                self.wfile.write(b'data: [DONE]\n\n')
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return _Handler


def fake_openai_env(server: FakeOpenAI) -> dict[str, str]:
    """Environment variables that point the `openai` client (and OpenAI-compatible SDKs) at the fake."""
    return {'OPENAI_BASE_URL': server.base_url, 'OPENAI_API_KEY': 'test-key'}


@contextmanager
def running_fake_openai(handler: ChatHandler = default_handler) -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI for the duration of the block."""
    with FakeOpenAI(handler) as server:
        yield server


def texts_in(requests: Sequence[ChatRequest], role: str) -> list[str]:
    """Every `role` text of every request, flattened (handy in assertions)."""
    return [text for request in requests for text in request.texts(role)]
