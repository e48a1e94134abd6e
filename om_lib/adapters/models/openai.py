"""`LanguageModel` on any OpenAI-compatible Chat Completions endpoint through the official `openai` client.

`openai/<model>` runs on OpenAI itself or on any compatible gateway (Azure OpenAI's v1 endpoint, vLLM, Ollama,
LiteLLM, ...): the client reads `OPENAI_API_KEY` and `OPENAI_BASE_URL`, and deployed stacks hand it the key from
Secrets Manager. One `generate` is one HTTP request (the client's retries are off, its timeout is the caller's
remaining time), so `om_lib.models.model_router.ModelRouter` owns every retry. The SDK is imported on first use.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from om_lib.adapters.models.chat_turns import paired_turns
from om_lib.adapters.models.provider_calls import KeyedClient, unavailable_error
from om_lib.errors import (
    DeadlineExceededError,
    ModelOutputError,
    ModelRequestError,
    ModelUnavailableError,
)
from om_lib.llm import Content, FunctionCall, FunctionResponse, InlineBlob, ModelRequest, ModelResponse, Usage
from om_lib.ports import TextSink

if TYPE_CHECKING:
    import openai

logger = logging.getLogger(__name__)

# HTTP statuses that say "try again later" rather than "this request is wrong".
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
# A 429 with this code is an exhausted plan, not a rate limit: waiting does not help.
_PERMANENT_429_CODES = frozenset({'insufficient_quota'})
_IMAGE_TYPES = frozenset({'image/png', 'image/jpeg', 'image/jpg', 'image/gif', 'image/webp'})
# A key for gateways that need none (Ollama, a local vLLM): the client refuses to start without one.
NO_KEY = 'not-needed'


@dataclass(frozen=True)
class OpenAIModelProfile:
    """What an OpenAI model family accepts; matched by model-name prefix, first match wins.

    Attributes:
        prefix: Start of the model name.
        max_output_tokens: The largest `max_completion_tokens` it takes.
        temperature: Accepts `temperature` (reasoning models take only the default and refuse the field).
    """

    prefix: str
    max_output_tokens: int
    temperature: bool = True


OPENAI_PROFILES: tuple[OpenAIModelProfile, ...] = (
    OpenAIModelProfile('gpt-5', 128000, temperature=False),
    OpenAIModelProfile('gpt-4.1', 32768),
    OpenAIModelProfile('gpt-4o', 16384),
    OpenAIModelProfile('gpt-4-turbo', 4096),
    OpenAIModelProfile('gpt-3.5-turbo', 4096),
    OpenAIModelProfile('o1', 100000, temperature=False),
    OpenAIModelProfile('o3', 100000, temperature=False),
    OpenAIModelProfile('o4', 100000, temperature=False),
)


def openai_profile(model: str) -> OpenAIModelProfile | None:
    """The known profile of a model name (None for gateways' own models: sent as configured)."""
    return next((profile for profile in OPENAI_PROFILES if model.startswith(profile.prefix)), None)


@dataclass(frozen=True)
class _Sdk:
    openai: Any


@functools.cache
def _sdk() -> _Sdk:
    """Import the openai client once, on first use (guarded, with an install hint)."""
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'OpenAILanguageModel needs the openai package: `pip install openai` (a dependency of om-serverless)'
        ) from exc
    return _Sdk(openai=openai)


class OpenAILanguageModel:
    """Models of an OpenAI-compatible endpoint (`openai/<model>`) via Chat Completions."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.OpenAI | None = None,
        api_key_provider: Callable[[], str | None] | None = None,
    ) -> None:
        """Create the adapter; the client is built on the first call and then reused.

        Args:
            api_key: The key. None lets the client read `OPENAI_API_KEY` (with a base URL and no key at all, a
                placeholder is sent: local gateways need none).
            base_url: The API root (`https://api.openai.com/v1` unless set; a gateway or a test double). None lets the
                client read `OPENAI_BASE_URL`.
            client: A ready client to use instead (tests, custom transports). Its retry settings are the caller's.
            api_key_provider: Asked for the key on every call instead (a cached Secrets Manager read); the client is
                rebuilt when the key changes.
        """
        self._base_url = base_url
        self._client = KeyedClient(
            self._build_client, api_key=api_key, api_key_provider=api_key_provider, client=client
        )

    def warm_up(self) -> None:
        """Import the openai package now (Lambda init / SnapStart); sends no request and reads no key."""
        _sdk()

    def client(self) -> openai.OpenAI:
        """The client for the current key (the embedder shares it)."""
        return self._client.get()

    def _build_client(self, key: str | None) -> openai.OpenAI:
        sdk = _sdk()
        base_url = self._base_url or os.environ.get('OPENAI_BASE_URL') or None
        api_key = key or os.environ.get('OPENAI_API_KEY') or (NO_KEY if base_url else None)
        try:
            # max_retries=0: the client must not retry behind the router's back and past its deadline.
            return cast('openai.OpenAI', sdk.openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0))
        except sdk.openai.OpenAIError as exc:
            raise ModelRequestError(
                'no OpenAI API key: set OPENAI_API_KEY (or OPENAI_BASE_URL for a gateway that needs none)'
            ) from exc

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Run one chat completion: one attempt, no client retries, at most `timeout_s` seconds.

        Not idempotent. Raises ModelThrottledError (429) and ModelUnavailableError (408/409/5xx, timeouts, network),
        both with the `Retry-After` when one was sent; ModelRequestError (other 4xx, no key, an exhausted quota);
        ModelOutputError (refusal, content filter, no content, malformed tool call); and DeadlineExceededError when
        `timeout_s` is already spent.
        """
        kwargs = _chat_kwargs(model_id, request, timeout_s)
        client = self.client()
        sdk = _sdk()
        with map_openai_errors(sdk, model_id):
            completion = client.chat.completions.create(**kwargs, timeout=timeout_s)
        return chat_response(completion, model_id)

    def stream(self, model_id: str, request: ModelRequest, *, timeout_s: float, on_text: TextSink) -> ModelResponse:
        """`generate` with `stream: true` (server-sent chunks): each content delta goes to `on_text` as it arrives; the
        chunks are then read as one completion (same checks, same errors)."""
        kwargs = _chat_kwargs(model_id, request, timeout_s)
        client = self.client()
        sdk = _sdk()
        text: list[str] = []
        refusal: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish_reason: str | None = None
        usage: Any = None
        with map_openai_errors(sdk, model_id):
            chunks = client.chat.completions.create(
                **kwargs, stream=True, stream_options={'include_usage': True}, timeout=timeout_s
            )
            for chunk in chunks:
                usage = chunk.usage or usage
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    if delta.content:
                        text.append(delta.content)
                        on_text(delta.content)
                    if getattr(delta, 'refusal', None):
                        refusal.append(delta.refusal)
                    for call in delta.tool_calls or []:
                        slot = calls.setdefault(call.index, {'id': '', 'name': '', 'arguments': ''})
                        slot['id'] = call.id or slot['id']
                        if call.function is not None:
                            slot['name'] += call.function.name or ''
                            slot['arguments'] += call.function.arguments or ''
                    finish_reason = choice.finish_reason or finish_reason
        if finish_reason is None:
            raise ModelUnavailableError(f'the answer from openai/{model_id} broke off before it was finished')
        tool_calls = [
            SimpleNamespace(id=c['id'] or None, function=SimpleNamespace(name=c['name'], arguments=c['arguments']))
            for _, c in sorted(calls.items())
        ]
        message = SimpleNamespace(content=''.join(text), refusal=''.join(refusal) or None, tool_calls=tool_calls)
        completion = SimpleNamespace(
            choices=[SimpleNamespace(finish_reason=finish_reason, message=message)], usage=usage
        )
        return chat_response(completion, model_id)


# ---------------------------------------------------------------------------------------------------------------------
# Request and response
# ---------------------------------------------------------------------------------------------------------------------
def _chat_kwargs(model_id: str, request: ModelRequest, timeout_s: float) -> dict[str, Any]:
    """The chat-completions arguments, for `generate` and `stream` alike."""
    if timeout_s <= 0:
        raise DeadlineExceededError(f'no time left to call openai/{model_id}')
    kwargs = chat_request(model_id, request)
    if not any(m['role'] != 'system' for m in kwargs['messages']):
        raise ModelRequestError(f'nothing to send to openai/{model_id}: the request has no content')
    return kwargs


def chat_request(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """The `chat.completions.create` keyword arguments for `request` (timeout excluded)."""
    profile = openai_profile(model_id)
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({'role': 'system', 'content': request.system})
    for content in paired_turns(request.contents):
        messages.extend(_messages(content))
    kwargs: dict[str, Any] = {'model': model_id, 'messages': messages}
    if request.max_output_tokens is not None:
        limit = profile.max_output_tokens if profile else request.max_output_tokens
        kwargs['max_completion_tokens'] = max(1, min(request.max_output_tokens, limit))
    if request.temperature is not None and (profile is None or profile.temperature):
        kwargs['temperature'] = request.temperature
    if request.tools:
        kwargs['tools'] = [
            {
                'type': 'function',
                'function': {'name': tool.name, 'description': tool.description, 'parameters': tool.parameters},
            }
            for tool in request.tools
        ]
    return kwargs


def _messages(content: Content) -> list[dict[str, Any]]:
    """One turn as chat messages: an assistant message (text + tool calls), or tool messages then a user message."""
    if content.role == 'model':
        text = ''.join(_attachment_note(p) for p in content.parts if isinstance(p, str | InlineBlob))
        calls = [
            {
                'id': p.id,
                'type': 'function',
                'function': {'name': p.name, 'arguments': json.dumps(p.args, default=str, ensure_ascii=False)},
            }
            for p in content.parts
            if isinstance(p, FunctionCall)
        ]
        message: dict[str, Any] = {'role': 'assistant', 'content': text or None}
        if calls:
            message['tool_calls'] = calls
        return [message] if text or calls else []
    # Tool results must directly follow the assistant message that called them, before any user text.
    out: list[dict[str, Any]] = [
        {'role': 'tool', 'tool_call_id': p.id, 'content': json.dumps(p.response, default=str, ensure_ascii=False)}
        for p in content.parts
        if isinstance(p, FunctionResponse)
    ]
    parts: list[dict[str, Any]] = []
    for part in content.parts:
        if isinstance(part, str):
            if part:
                parts.append({'type': 'text', 'text': part})
        elif isinstance(part, InlineBlob):
            parts.append(_blob_part(part))
    if parts:
        if all(p['type'] == 'text' for p in parts):
            # A plain string is what every compatible gateway understands.
            out.append({'role': 'user', 'content': ''.join(p['text'] for p in parts)})
        else:
            out.append({'role': 'user', 'content': parts})
    return out


def _data_uri(blob: InlineBlob, mime: str) -> str:
    return f'data:{mime};base64,{base64.b64encode(blob.data).decode("ascii")}'


def _blob_part(blob: InlineBlob) -> dict[str, Any]:
    mime = blob.mime_type.lower().split(';', 1)[0].strip()
    if mime in _IMAGE_TYPES:
        return {'type': 'image_url', 'image_url': {'url': _data_uri(blob, mime)}}
    if mime == 'application/pdf':
        return {'type': 'file', 'file': {'filename': 'document.pdf', 'file_data': _data_uri(blob, mime)}}
    return {'type': 'text', 'text': _attachment_note(blob)}


def _attachment_note(blob: InlineBlob | str) -> str:
    if isinstance(blob, str):
        return blob
    return f'[attachment ({blob.mime_type}, {len(blob.data)} bytes) that this model cannot read]'


def chat_response(completion: Any, model_id: str) -> ModelResponse:
    """A usable `ModelResponse` from a chat completion, or ModelOutputError."""
    if not completion.choices:
        raise ModelOutputError(f'openai/{model_id} returned no choices')
    choice = completion.choices[0]
    finish_reason = choice.finish_reason
    message = choice.message
    if finish_reason == 'content_filter':
        raise ModelOutputError(f'openai/{model_id} withheld the answer: content filter', finish_reason=finish_reason)
    if getattr(message, 'refusal', None):
        raise ModelOutputError(f'openai/{model_id} refused: {message.refusal}', finish_reason='refusal')
    calls: list[FunctionCall] = []
    for call in message.tool_calls or []:
        function = getattr(call, 'function', None)
        if function is None:
            continue  # a custom (non-function) tool call: we offer none
        try:
            args = json.loads(function.arguments or '{}')
        except json.JSONDecodeError as exc:
            raise ModelOutputError(
                f'openai/{model_id} sent malformed arguments for {function.name}', finish_reason=finish_reason
            ) from exc
        calls.append(
            FunctionCall(name=function.name, args=args if isinstance(args, dict) else {'value': args}, id=call.id)
        )
    text = message.content or ''
    if not text.strip() and not calls:
        raise ModelOutputError(f'openai/{model_id} answered with no text and no tool call', finish_reason=finish_reason)
    usage = Usage()
    if completion.usage is not None:
        details = getattr(completion.usage, 'prompt_tokens_details', None)
        usage = Usage(
            input_tokens=completion.usage.prompt_tokens or 0,
            output_tokens=completion.usage.completion_tokens or 0,
            cache_read_tokens=(getattr(details, 'cached_tokens', None) or 0) if details is not None else 0,
        )
    return ModelResponse(
        text=text, model=model_id, function_calls=tuple(calls), usage=usage, finish_reason=finish_reason
    )


# ---------------------------------------------------------------------------------------------------------------------
# Errors: the one translation table
# ---------------------------------------------------------------------------------------------------------------------
@contextmanager
def map_openai_errors(sdk: _Sdk, model_id: str) -> Iterator[None]:
    """openai client errors → om_lib model errors."""
    errors = sdk.openai
    name = f'openai/{model_id}'
    try:
        yield
    except errors.APIStatusError as exc:
        status = exc.status_code
        code = getattr(exc, 'code', None)
        reason = _reason(exc)
        if (status in _TRANSIENT_STATUSES or status >= 500) and code not in _PERMANENT_429_CODES:
            raise unavailable_error(
                f'{name} is unavailable: {status} ({reason})',
                status_code=status,
                throttled=status == 429,
                headers=exc.response.headers,
            ) from exc
        hint = {
            401: ': check OPENAI_API_KEY (deployed stacks: the OpenAI secret)',
            403: ': the key may not use this model',
            404: ': no such model at this endpoint (check the model name and OPENAI_BASE_URL)',
            429: ': the account has no quota left',
        }.get(status, '')
        raise ModelRequestError(f'{name} refused the request: {status} ({reason}){hint}', status_code=status) from exc
    except errors.APITimeoutError as exc:
        raise ModelUnavailableError(f'{name} did not answer in time') from exc
    except errors.APIConnectionError as exc:
        raise ModelUnavailableError(
            f'could not reach the endpoint of {name}: {type(exc.__cause__ or exc).__name__}'
        ) from exc
    except errors.APIResponseValidationError as exc:
        # A body that is not a chat completion comes from a proxy or gateway in trouble, not from the model.
        raise ModelUnavailableError(f'the endpoint of {name} returned an unexpected body') from exc


def _reason(exc: Any) -> str:
    # The client hands over the body's `error` object when there is one.
    body = getattr(exc, 'body', None)
    if isinstance(body, dict) and body.get('message'):
        return str(body['message'])
    return str(getattr(exc, 'message', '') or type(exc).__name__)
