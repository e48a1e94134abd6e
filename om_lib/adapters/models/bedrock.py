"""`LanguageModel` on Amazon Bedrock's Converse API through boto3's `bedrock-runtime` client.

`bedrock/<modelId>` names a foundation model (`anthropic.claude-3-5-haiku-20241022-v1:0`), an inference profile
(`us.amazon.nova-lite-v1:0`) or an ARN; the id is passed to Bedrock unchanged. Credentials are boto3's usual chain (the
Lambda role in AWS), or `AWS_BEARER_TOKEN_BEDROCK`; `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` (then `AWS_ENDPOINT_URL`) points
the client at another endpoint, which is how tests reach the loopback fake.

As with Gemini, one `generate` is one HTTP request: botocore's retries are off and each request's read timeout is the
caller's remaining time, so `om_lib.models.model_router.ModelRouter` owns every retry and the path's deadline holds.
boto3's client is built on first use (loading the service model costs tens of milliseconds), never at import.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from om_lib.adapters.models.chat_turns import CONTINUATION, paired_turns
from om_lib.adapters.models.provider_calls import unavailable_error
from om_lib.errors import (
    DeadlineExceededError,
    ModelOutputError,
    ModelRequestError,
    ModelUnavailableError,
)
from om_lib.llm import Content, FunctionCall, FunctionResponse, InlineBlob, ModelRequest, ModelResponse, Usage
from om_lib.ports import TextSink

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient

logger = logging.getLogger(__name__)

# Error codes that mean "try again later" (Bedrock Runtime's service model: 429, 408, 424, 5xx and the quota error).
_TRANSIENT_CODES = frozenset(
    {
        'ThrottlingException',
        'ServiceUnavailableException',
        'InternalServerException',
        'ModelTimeoutException',
        'ModelNotReadyException',
        'ModelErrorException',
        'ServiceQuotaExceededException',
        'ModelStreamErrorException',  # ConverseStream only: the model failed mid-answer
    }
)
# Of those, the account's rate limit or quota (429 and its quota twin): ModelThrottledError, waited on longer.
_THROTTLING_CODES = frozenset({'ThrottlingException', 'ServiceQuotaExceededException'})

# Stop reasons that withhold the answer or make it unusable; the router samples again once.
_UNUSABLE_STOP_REASONS = frozenset(
    {'guardrail_intervened', 'content_filtered', 'malformed_model_output', 'malformed_tool_use'}
)

_IMAGE_FORMATS = {
    'image/png': 'png',
    'image/jpeg': 'jpeg',
    'image/jpg': 'jpeg',
    'image/gif': 'gif',
    'image/webp': 'webp',
}
_DOCUMENT_FORMATS = {
    'application/pdf': 'pdf',
    'text/csv': 'csv',
    'application/msword': 'doc',
    'application/vnd.openxmlformats-officedocument.wordprocessingml.document': 'docx',
    'application/vnd.ms-excel': 'xls',
    'application/vnd.openxmlformats-officedocument.spreadsheetml.sheet': 'xlsx',
    'text/html': 'html',
    'text/plain': 'txt',
    'text/markdown': 'md',
}

# Inference-profile ids carry a geography before the provider (`us.amazon.nova-lite-v1:0`, `global.anthropic...`).
_GEO_PREFIX = re.compile(r'^(?:us|eu|apac|jp|au|ca|us-gov|global)\.(?=[a-z0-9-]+\.)')

# botocore's connect timeout; the read timeout is set per request from the caller's remaining time.
CONNECT_TIMEOUT_S = 5.0
# The client-wide read timeout, used only if a request somehow carries none (botocore < 1.44 ignores ours).
DEFAULT_READ_TIMEOUT_S = 120.0
# A private parameter the client's `provide-client-params` hook moves into the request context (see `_read_timeout`).
READ_TIMEOUT_PARAM = 'OmReadTimeout'


@dataclass(frozen=True)
class BedrockModelProfile:
    """What a model family accepts; matched on the foundation-model id (geography prefix removed), first match wins.

    Attributes:
        prefix: Start of the foundation-model id.
        max_output_tokens: The largest `maxTokens` the model takes.
        images: Accepts image blocks (text-only models get a note instead of the image).
        cache_points: Supports prompt caching with `cachePoint` blocks.
    """

    prefix: str
    max_output_tokens: int
    images: bool = True
    cache_points: bool = False


BEDROCK_PROFILES: tuple[BedrockModelProfile, ...] = (
    BedrockModelProfile('anthropic.claude-3-5-haiku', 8192, images=False, cache_points=True),
    BedrockModelProfile('anthropic.claude-3-haiku', 4096),
    BedrockModelProfile('anthropic.claude-3-5-sonnet', 8192),
    BedrockModelProfile('anthropic.claude-3-7-sonnet', 64000, cache_points=True),
    BedrockModelProfile('anthropic.claude-haiku-4', 64000, cache_points=True),
    BedrockModelProfile('anthropic.claude-sonnet-4', 64000, cache_points=True),
    BedrockModelProfile('anthropic.claude-opus-4-5', 64000, cache_points=True),
    BedrockModelProfile('anthropic.claude-opus-4', 32000, cache_points=True),
    BedrockModelProfile('amazon.nova-micro', 10000, images=False, cache_points=True),
    BedrockModelProfile('amazon.nova-lite', 10000, cache_points=True),
    BedrockModelProfile('amazon.nova-pro', 10000, cache_points=True),
    BedrockModelProfile('amazon.nova-premier', 32000, cache_points=True),
)


def foundation_model_id(model_id: str) -> str:
    """The foundation-model id inside a model id: ARNs lose everything up to the last `/`, profiles their geography.

    An application-inference-profile ARN has an opaque id and comes back as that id.
    """
    bare = model_id.rsplit('/', 1)[-1] if model_id.startswith('arn:') else model_id
    return _GEO_PREFIX.sub('', bare)


def bedrock_profile(model_id: str) -> BedrockModelProfile | None:
    """The known profile of a model id, or None for a model this adapter has no table entry for."""
    bare = foundation_model_id(model_id)
    return next((profile for profile in BEDROCK_PROFILES if bare.startswith(profile.prefix)), None)


def clamp_max_tokens(model_id: str, requested: int | None) -> int | None:
    """The `maxTokens` to send: `requested` lowered to what a known model allows (unknown models: as requested)."""
    if requested is None:
        return None
    profile = bedrock_profile(model_id)
    return max(1, min(requested, profile.max_output_tokens)) if profile else max(1, requested)


@dataclass(frozen=True)
class _Sdk:
    boto3: Any
    config_cls: Any
    client_error: type[Exception]
    no_credentials: tuple[type[Exception], ...]
    transport_errors: tuple[type[Exception], ...]
    param_error: type[Exception]


@functools.cache
def _sdk() -> _Sdk:
    """Import boto3 and botocore once, on first use."""
    import boto3
    from botocore import exceptions
    from botocore.config import Config

    return _Sdk(
        boto3=boto3,
        config_cls=Config,
        client_error=exceptions.ClientError,
        no_credentials=(exceptions.NoCredentialsError, exceptions.PartialCredentialsError, exceptions.NoAuthTokenError),
        # Connect/read timeouts, refused or dropped connections, proxy and SSL trouble.
        transport_errors=(exceptions.HTTPClientError, exceptions.ConnectionError),
        param_error=exceptions.ParamValidationError,
    )


def _read_timeout(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """botocore hook: move our private timeout parameter into the request context, where botocore (>= 1.44) reads a
    per-request read timeout. The client's own read timeout cannot change per call without a new connection pool."""
    timeout = params.pop(READ_TIMEOUT_PARAM, None)
    if timeout is not None:
        context['read_timeout'] = timeout


class BedrockLanguageModel:
    """Bedrock models (`bedrock/<modelId>`) through the Converse API."""

    def __init__(
        self,
        *,
        client: BedrockRuntimeClient | None = None,
        region_name: str | None = None,
        profile_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        """Create the adapter; the client is built on the first call (or `warm_up`) and then reused.

        Args:
            client: A ready `bedrock-runtime` client (tests, custom sessions). Its retries are switched off here.
            region_name: The region; None lets boto3 decide (`AWS_REGION` in Lambda).
            profile_name: A named AWS profile whose credentials sign Bedrock calls only (the local stack replaces the
                environment's credentials with an emulator's). None: the standard credential chain.
            endpoint_url: Overrides the endpoint; None lets boto3 read `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` /
                `AWS_ENDPOINT_URL`, unless `profile_name` is set, when only the former counts (the latter is the local
                emulator's).
        """
        self._client = client
        self._region_name = region_name
        self._profile_name = profile_name
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()
        if client is not None:
            _install_timeout_hook(client)

    def warm_up(self) -> None:
        """Build the client now (Lambda init / SnapStart snapshots it); sends no request."""
        self.client()

    def client(self) -> BedrockRuntimeClient:
        """The `bedrock-runtime` client (the embedder shares it)."""
        with self._lock:
            if self._client is None:
                self._client = self._build_client()
            return self._client

    @property
    def region(self) -> str:
        """The region calls go to ('' before the client exists and when boto3 has none)."""
        return str(self._client.meta.region_name or '') if self._client is not None else (self._region_name or '')

    def _build_client(self) -> BedrockRuntimeClient:
        sdk = _sdk()
        endpoint_url = self._endpoint_url
        if self._profile_name and endpoint_url is None:
            endpoint_url = os.environ.get('AWS_ENDPOINT_URL_BEDROCK_RUNTIME') or None
        config = sdk.config_cls(
            # One attempt: a retry behind the router's back would run past its deadline.
            retries={'total_max_attempts': 1, 'mode': 'standard'},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=DEFAULT_READ_TIMEOUT_S,
            tcp_keepalive=True,
            # With a separate profile the global AWS_ENDPOINT_URL is the local emulator's, not Bedrock's.
            ignore_configured_endpoint_urls=bool(self._profile_name),
        )
        session = sdk.boto3.session.Session(profile_name=self._profile_name, region_name=self._region_name)
        client = session.client('bedrock-runtime', config=config, endpoint_url=endpoint_url)
        _install_timeout_hook(client)
        return client  # type: ignore[no-any-return]

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Run one Converse request: one attempt, no client retries, at most `timeout_s` seconds of waiting.

        Not idempotent. Raises ModelThrottledError (throttling, quota) and ModelUnavailableError (5xx, model timeouts,
        network), both with the `Retry-After` when one was sent; ModelRequestError (access not enabled, unknown model,
        invalid or too long input, no credentials); ModelOutputError (filtered, malformed or empty answer); and
        DeadlineExceededError when `timeout_s` is already spent.
        """
        kwargs = _converse_kwargs(model_id, request, timeout_s)
        client = self.client()
        with map_bedrock_errors(model_id, self.region):
            response = client.converse(**kwargs)
        return converse_response(response, model_id)

    def stream(self, model_id: str, request: ModelRequest, *, timeout_s: float, on_text: TextSink) -> ModelResponse:
        """`generate` over ConverseStream: each text delta goes to `on_text` as it arrives; the events are then read as
        one Converse answer (same checks, same errors). Needs `bedrock:InvokeModelWithResponseStream`."""
        kwargs = _converse_kwargs(model_id, request, timeout_s)
        client = self.client()
        blocks: dict[int, dict[str, Any]] = {}
        tool_input: dict[int, list[str]] = {}
        whole: dict[str, Any] = {}
        with map_bedrock_errors(model_id, self.region):
            response = client.converse_stream(**kwargs)
            for event in response['stream']:
                if 'contentBlockStart' in event:
                    start = event['contentBlockStart']
                    use = (start.get('start') or {}).get('toolUse')
                    if use is not None:
                        blocks[start['contentBlockIndex']] = {'toolUse': {**use, 'input': {}}}
                elif 'contentBlockDelta' in event:
                    index, delta = event['contentBlockDelta']['contentBlockIndex'], event['contentBlockDelta']['delta']
                    if 'text' in delta:
                        block = blocks.setdefault(index, {'text': ''})
                        block['text'] = block.get('text', '') + delta['text']
                        on_text(delta['text'])
                    elif 'toolUse' in delta:
                        tool_input.setdefault(index, []).append(delta['toolUse'].get('input') or '')
                elif 'messageStop' in event:
                    whole['stopReason'] = event['messageStop'].get('stopReason')
                elif 'metadata' in event:
                    whole['usage'] = event['metadata'].get('usage') or {}
        if 'stopReason' not in whole:
            raise ModelUnavailableError(f'the answer from bedrock/{model_id} broke off before it was finished')
        for index, pieces in tool_input.items():
            use = blocks.setdefault(index, {'toolUse': {'input': {}}})['toolUse']
            try:
                use['input'] = json.loads(''.join(pieces) or '{}')
            except json.JSONDecodeError as exc:
                raise ModelOutputError(
                    f'bedrock/{model_id} sent malformed tool input', finish_reason='malformed'
                ) from exc
        whole['output'] = {'message': {'role': 'assistant', 'content': [blocks[i] for i in sorted(blocks)]}}
        return converse_response(whole, model_id)


def _install_timeout_hook(client: Any) -> None:
    client.meta.events.register(
        'provide-client-params.bedrock-runtime.*', _read_timeout, unique_id='om-per-request-read-timeout'
    )


# ---------------------------------------------------------------------------------------------------------------------
# Request and response
# ---------------------------------------------------------------------------------------------------------------------
def _converse_kwargs(model_id: str, request: ModelRequest, timeout_s: float) -> dict[str, Any]:
    """The Converse (or ConverseStream) arguments, for `generate` and `stream` alike."""
    if timeout_s <= 0:
        raise DeadlineExceededError(f'no time left to call bedrock/{model_id}')
    kwargs = converse_request(model_id, request)
    if not kwargs['messages']:
        raise ModelRequestError(f'nothing to send to bedrock/{model_id}: the request has no content')
    kwargs[READ_TIMEOUT_PARAM] = timeout_s
    return kwargs


def converse_request(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """The Converse call's keyword arguments for `request` (boto3 shapes: image and document bytes stay bytes)."""
    profile = bedrock_profile(model_id)
    kwargs: dict[str, Any] = {'modelId': model_id}
    if request.system:
        system: list[dict[str, Any]] = [{'text': request.system}]
        if profile is not None and profile.cache_points:
            # The system prompt is the stable part (instructions, then the memory): cache up to here. Below the model's
            # minimum cacheable size Bedrock ignores the marker and the call succeeds.
            system.append({'cachePoint': {'type': 'default'}})
        kwargs['system'] = system
    kwargs['messages'] = _messages(
        request.contents, tools=bool(request.tools), images=profile is None or profile.images
    )
    inference: dict[str, Any] = {}
    max_tokens = clamp_max_tokens(model_id, request.max_output_tokens)
    if max_tokens is not None:
        inference['maxTokens'] = max_tokens
    if request.temperature is not None:
        inference['temperature'] = request.temperature
    if inference:
        kwargs['inferenceConfig'] = inference
    if request.thinking_budget is not None:
        logger.debug('thinking budget ignored', extra={'model': model_id})
    if request.tools:
        kwargs['toolConfig'] = {
            'tools': [
                {
                    'toolSpec': {
                        'name': tool.name,
                        'description': tool.description or tool.name,
                        'inputSchema': {'json': tool.parameters},
                    }
                }
                for tool in request.tools
            ]
        }
    return kwargs


def _messages(contents: tuple[Content, ...], *, tools: bool, images: bool) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    documents = 0
    for content in paired_turns(contents, tools=tools):
        role = 'assistant' if content.role == 'model' else 'user'
        results: list[dict[str, Any]] = []
        blocks: list[dict[str, Any]] = []
        for part in content.parts:
            if isinstance(part, str):
                if part.strip():  # Bedrock refuses blank text blocks
                    blocks.append({'text': part})
            elif isinstance(part, FunctionCall):
                blocks.append({'toolUse': {'toolUseId': part.id, 'name': part.name, 'input': part.args}})
            elif isinstance(part, FunctionResponse):
                # Text, not a `json` block: every tool-capable model reads text; only some take json.
                text = json.dumps(part.response, default=str, ensure_ascii=False)
                results.append({'toolResult': {'toolUseId': part.id, 'content': [{'text': text}]}})
            else:
                block = _blob_block(part, role=role, images=images, number=documents + 1)
                documents += 'document' in block
                blocks.append(block)
        if any('document' in block for block in blocks) and not any('text' in block for block in blocks):
            blocks.append({'text': 'See the attached document.'})  # a document needs a text block beside it
        # Tool results first: Anthropic models require them at the start of the user turn.
        merged = results + blocks
        if not merged:
            continue
        if messages and messages[-1]['role'] == role:
            messages[-1]['content'].extend(merged)
        else:
            messages.append({'role': role, 'content': merged})
    if messages and messages[0]['role'] == 'assistant':
        messages.insert(0, {'role': 'user', 'content': [{'text': CONTINUATION}]})
    return messages


def _blob_block(blob: InlineBlob, *, role: str, images: bool, number: int) -> dict[str, Any]:
    mime = blob.mime_type.lower().split(';', 1)[0].strip()
    if role == 'user' and images and mime in _IMAGE_FORMATS:
        return {'image': {'format': _IMAGE_FORMATS[mime], 'source': {'bytes': blob.data}}}
    if role == 'user' and mime in _DOCUMENT_FORMATS:
        # Document names may hold only letters, digits, single spaces, hyphens, parentheses and brackets.
        return {
            'document': {
                'format': _DOCUMENT_FORMATS[mime],
                'name': f'document {number}',
                'source': {'bytes': blob.data},
            }
        }
    return {'text': f'[attachment ({mime}, {len(blob.data)} bytes) that this model cannot read]'}


def converse_response(response: Any, model_id: str) -> ModelResponse:
    """A usable `ModelResponse` from a Converse answer, or ModelOutputError."""
    stop_reason = response.get('stopReason')
    if stop_reason in _UNUSABLE_STOP_REASONS:
        raise ModelOutputError(
            f'Bedrock withheld or cut the answer from bedrock/{model_id}: {stop_reason}', finish_reason=stop_reason
        )
    message = (response.get('output') or {}).get('message') or {}
    text_parts: list[str] = []
    calls: list[FunctionCall] = []
    for block in message.get('content') or []:
        if 'text' in block:
            text_parts.append(block['text'])
        elif 'toolUse' in block:
            use = block['toolUse']
            args = use.get('input')
            calls.append(
                FunctionCall(
                    name=use.get('name', ''),
                    args=args if isinstance(args, dict) else {'value': args},
                    id=use.get('toolUseId'),
                )
            )
        # reasoningContent is the model's scratchpad, not its answer.
    text = ''.join(text_parts)
    if not text.strip() and not calls:
        raise ModelOutputError(
            f'Bedrock answered bedrock/{model_id} with no text and no tool call', finish_reason=stop_reason
        )
    usage = response.get('usage') or {}
    cache_read, cache_write = int(usage.get('cacheReadInputTokens') or 0), int(usage.get('cacheWriteInputTokens') or 0)
    result = ModelResponse(
        text=text,
        model=model_id,
        function_calls=tuple(calls),
        usage=Usage(
            # Bedrock's inputTokens leaves out what the cache served or stored; ours counts every input token.
            input_tokens=int(usage.get('inputTokens') or 0) + cache_read + cache_write,
            output_tokens=int(usage.get('outputTokens') or 0),
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        ),
        finish_reason=stop_reason,
    )
    if cache_read or cache_write:
        logger.debug(
            'prompt cache',
            extra={'model': model_id, 'cache_read_tokens': cache_read, 'cache_write_tokens': cache_write},
        )
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Errors: the one translation table
# ---------------------------------------------------------------------------------------------------------------------
@contextmanager
def map_bedrock_errors(model_id: str, region: str) -> Iterator[None]:
    """botocore errors → om_lib model errors. Access and unknown-model refusals name what to fix."""
    sdk = _sdk()
    name = f'bedrock/{model_id}'
    where = f' in {region}' if region else ''
    try:
        yield
    except sdk.client_error as exc:
        error = getattr(exc, 'response', {}) or {}
        code = str((error.get('Error') or {}).get('Code', ''))
        # An exception inside a ConverseStream names its type in lower camel case (`throttlingException`).
        code = code[:1].upper() + code[1:]
        reason = str((error.get('Error') or {}).get('Message', '')).rstrip('. ') or code
        metadata = error.get('ResponseMetadata') or {}
        status = metadata.get('HTTPStatusCode')
        status = status if isinstance(status, int) else None
        if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
            # ModelNotReadyException is also a 429, but a model waking up, not a rate limit.
            throttled = code in _THROTTLING_CODES or (status == 429 and code not in _TRANSIENT_CODES)
            raise unavailable_error(
                f'Bedrock is unavailable for {name}: {code} ({reason})',
                status_code=status,
                throttled=throttled,
                headers=metadata.get('HTTPHeaders'),  # Bedrock seldom sends a Retry-After; a gateway in front may
            ) from exc
        if code == 'AccessDeniedException':
            message = (
                f'Bedrock denied access to {name}{where}: {reason}. Enable access to this model in the Bedrock console '
                '(Model access) for this account and region, and allow bedrock:InvokeModel on it (and, for an '
                "inference profile, on the profile's foundation models) in this function's role"
            )
            logger.error('bedrock model access denied', extra={'model': name, 'reason': reason})
        elif code == 'ResourceNotFoundException':
            message = (
                f'Bedrock has no model {model_id!r}{where}: {reason}. Use a foundation-model id, an '
                'inference-profile id (e.g. us.amazon.nova-lite-v1:0) or an ARN offered in this region'
            )
            logger.error('bedrock model not found', extra={'model': name, 'reason': reason})
        elif code == 'ValidationException':
            # Also a too-long input, an invalid model id or a model that needs an inference profile: Bedrock says which.
            message = f'Bedrock refused the request to {name}: {reason}'
        else:
            message = f'Bedrock refused the request to {name}: {code} ({reason})'
        raise ModelRequestError(message, status_code=status) from exc
    except sdk.no_credentials as exc:
        raise ModelRequestError(
            f'no AWS credentials to call {name}: run with a role or profile that may call Bedrock (or set '
            'AWS_BEARER_TOKEN_BEDROCK)'
        ) from exc
    except sdk.param_error as exc:
        raise ModelRequestError(f'the request to {name} is not valid for Bedrock: {exc}') from exc
    except sdk.transport_errors as exc:
        raise ModelUnavailableError(f'could not reach Bedrock for {name}: {type(exc).__name__}') from exc
