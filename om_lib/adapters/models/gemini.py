"""`LanguageModel` on Google's Gemini API through the google-genai client (mirrors pydantic-ai's `GoogleModel`).

One `generate` call is one HTTP request: the client's own retries are switched off and each request carries the
caller's remaining time as its timeout, so `om_lib.models.model_router.ModelRouter` owns every retry and the path's
single deadline holds. google-genai is imported on first use, not at import (it costs about half a second).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from om_lib.adapters.models.provider_calls import KeyedClient, unavailable_error
from om_lib.errors import (
    DeadlineExceededError,
    ModelOutputError,
    ModelRequestError,
    ModelUnavailableError,
)
from om_lib.llm import (
    Content,
    ContentPart,
    FunctionCall,
    FunctionResponse,
    InlineBlob,
    ModelRequest,
    ModelResponse,
    Usage,
)
from om_lib.ports import TextSink

if TYPE_CHECKING:
    from google import genai
    from google.genai import types as genai_types

logger = logging.getLogger(__name__)

# HTTP statuses that say "try again later" rather than "this request is wrong" (reference §12.9).
_TRANSIENT_STATUSES = frozenset({408, 425, 429})

# Finish reasons that mean the answer was withheld or is not usable as-is, even if some text came back.
# OTHER is the reference's "incomplete response" (§12.9): treated as unusable so the router samples again.
_UNUSABLE_FINISH_REASONS = frozenset(
    {
        'SAFETY',
        'RECITATION',
        'BLOCKLIST',
        'PROHIBITED_CONTENT',
        'SPII',
        'LANGUAGE',
        'OTHER',
        'IMAGE_SAFETY',
        'IMAGE_PROHIBITED_CONTENT',
        'IMAGE_RECITATION',
        'MODEL_ARMOR',
        'MALFORMED_FUNCTION_CALL',
        'MALFORMED_RESPONSE',
        'UNEXPECTED_TOOL_CALL',
        'TOO_MANY_TOOL_CALLS',
        'MISSING_THOUGHT_SIGNATURE',
    }
)

# The API's documented ceiling for models we do not know; a larger value is a 400 on every current model.
_DEFAULT_MAX_OUTPUT_TOKENS = 65536


@dataclass(frozen=True)
class _ModelProfile:
    """What a model family accepts; matched by model-id prefix, most specific first."""

    prefix: str
    max_output_tokens: int
    thinking: bool
    # Thinking-budget bounds (tokens) for families that document them; -1 (dynamic) is always passed through.
    min_thinking_budget: int | None = None
    max_thinking_budget: int | None = None
    can_disable_thinking: bool = True


_PROFILES: tuple[_ModelProfile, ...] = (
    _ModelProfile('gemini-2.0-flash', 8192, thinking=False),
    _ModelProfile('gemini-2.5-flash-lite', 65536, thinking=True, min_thinking_budget=512, max_thinking_budget=24576),
    _ModelProfile('gemini-2.5-flash', 65536, thinking=True, min_thinking_budget=1, max_thinking_budget=24576),
    _ModelProfile(
        'gemini-2.5-pro',
        65536,
        thinking=True,
        min_thinking_budget=128,
        max_thinking_budget=32768,
        can_disable_thinking=False,
    ),
    _ModelProfile('gemini-3', 65536, thinking=True),
)


def _profile(model_id: str) -> _ModelProfile | None:
    bare = model_id.removeprefix('models/')
    return next((profile for profile in _PROFILES if bare.startswith(profile.prefix)), None)


def clamp_max_output_tokens(model_id: str, requested: int | None) -> int | None:
    """The output-token limit to send: `requested`, lowered to what the model allows (None stays None)."""
    if requested is None:
        return None
    profile = _profile(model_id)
    limit = profile.max_output_tokens if profile else _DEFAULT_MAX_OUTPUT_TOKENS
    return max(1, min(requested, limit))


def _thinking_budget(profile: _ModelProfile, budget: int) -> int:
    if budget == -1:
        return budget
    if budget <= 0:
        # 2.5 Pro cannot switch thinking off; the smallest budget is the closest it gets.
        return 0 if profile.can_disable_thinking else (profile.min_thinking_budget or 0)
    if profile.min_thinking_budget is not None:
        budget = max(budget, profile.min_thinking_budget)
    if profile.max_thinking_budget is not None:
        budget = min(budget, profile.max_thinking_budget)
    return budget


@dataclass(frozen=True)
class _Sdk:
    genai: Any
    types: Any
    errors: Any
    transport_errors: tuple[type[BaseException], ...]


@functools.cache
def _sdk() -> _Sdk:
    """Import google-genai once, on first use (guarded, with an install hint)."""
    try:
        from google import genai
        from google.genai import errors, types
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'GeminiLanguageModel needs the google-genai package: `pip install google-genai` '
            '(it is a dependency of om-serverless)'
        ) from exc
    # google-genai runs on httpx or its fork httpx2, whichever is installed; their exception classes are distinct.
    transport: list[type[BaseException]] = []
    for module_name in ('httpx', 'httpx2'):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        # RequestError covers connect/read/write errors, timeouts, protocol and decoding errors.
        transport.append(module.RequestError)
    return _Sdk(genai=genai, types=types, errors=errors, transport_errors=tuple(transport))


class GeminiLanguageModel:
    """Gemini models (`google/<model_id>`) via the google-genai client."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: genai.Client | None = None,
        api_key_provider: Callable[[], str | None] | None = None,
    ) -> None:
        """Create the adapter; the client is built on the first `generate` and then reused.

        Args:
            api_key: Gemini API key. None lets the client read `GOOGLE_API_KEY` / `GEMINI_API_KEY`.
            api_key_provider: Asked for the key on every call instead (e.g. a cached Secrets Manager read); the
                client is rebuilt when the key changes, so a rotated key (or the real key stored after a deploy that
                snapshotted a placeholder) is picked up without a new version.
            base_url: API root (a gateway or a test double). None lets the client read `GOOGLE_GEMINI_BASE_URL`,
                falling back to Google's endpoint.
            client: A ready client to use instead (tests, custom transports). Its retry settings are the caller's.
        """
        self._base_url = base_url
        self._client = KeyedClient(
            self._build_client, api_key=api_key, api_key_provider=api_key_provider, client=client
        )

    def warm_up(self) -> None:
        """Import google-genai now (Lambda init / SnapStart snapshots it); sends no request and reads no key.

        The client itself is built on the first call, with the key current at that moment.
        """
        _sdk()

    def _prepared(self, model_id: str, request: ModelRequest, timeout_s: float) -> tuple[Any, Any, Any, list[Any]]:
        """The SDK, the client, the request's config and contents, for `generate` and `stream` alike."""
        if timeout_s <= 0:
            raise DeadlineExceededError(f'no time left to call {model_id}')
        sdk = _sdk()
        client = self.client()
        config = self._config(sdk, model_id, request, timeout_s)
        contents = [_to_content(sdk, content) for content in request.contents]
        if not any(content.parts for content in contents):
            # The client refuses this before sending anything (a bare ValueError); say it in our own terms.
            raise ModelRequestError(f'nothing to send to {model_id}: the request has no content', model=model_id)
        return sdk, client, config, contents

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Run one generateContent request: one attempt, no client retries, at most `timeout_s` seconds.

        Not idempotent. Raises ModelUnavailableError (408/425/429/5xx, timeouts, network), ModelRequestError
        (other 4xx, no API key), ModelOutputError (no candidates, no content, blocked or unusable answer), and
        DeadlineExceededError when `timeout_s` is already spent.
        """
        sdk, client, config, contents = self._prepared(model_id, request, timeout_s)
        with _map_errors(sdk, model_id):
            response = client.models.generate_content(model=model_id, contents=contents, config=config)
        return _to_model_response(response, model_id)

    def stream(self, model_id: str, request: ModelRequest, *, timeout_s: float, on_text: TextSink) -> ModelResponse:
        """`generate` over `:streamGenerateContent` (server-sent events): each chunk's answer text goes to `on_text` as
        it arrives; the chunks are then read as one answer (same checks, same errors as `generate`)."""
        sdk, client, config, contents = self._prepared(model_id, request, timeout_s)
        parts: list[Any] = []
        finish_reason: Any = None
        usage: Any = None
        feedback: Any = None
        with _map_errors(sdk, model_id):
            for chunk in client.models.generate_content_stream(model=model_id, contents=contents, config=config):
                feedback = chunk.prompt_feedback or feedback
                usage = chunk.usage_metadata or usage
                if not chunk.candidates:
                    continue
                candidate = chunk.candidates[0]
                finish_reason = candidate.finish_reason or finish_reason
                for part in (candidate.content.parts if candidate.content is not None else None) or []:
                    parts.append(part)
                    if part.text and not part.thought:
                        on_text(part.text)
        if parts and finish_reason is None:
            # Gemini ends every stream with a finish reason: without one the connection broke off mid-answer.
            raise ModelUnavailableError(f'the answer from {model_id} broke off before it was finished')
        types = sdk.types
        candidates = [types.Candidate(content=types.Content(role='model', parts=parts), finish_reason=finish_reason)]
        whole = types.GenerateContentResponse(
            candidates=candidates if parts or finish_reason else [], usage_metadata=usage, prompt_feedback=feedback
        )
        return _to_model_response(whole, model_id)

    def client(self) -> genai.Client:
        """The google-genai client for the current key (the embedder shares it)."""
        return self._client.get()

    def _build_client(self, key: str | None) -> genai.Client:
        sdk = _sdk()
        http_options = sdk.types.HttpOptions(
            base_url=self._base_url,
            # attempts=1: the client must not retry behind the router's back and past its deadline.
            retry_options=sdk.types.HttpRetryOptions(attempts=1),
        )
        try:
            return cast('genai.Client', sdk.genai.Client(api_key=key, http_options=http_options))
        except ValueError as exc:
            # The client refuses to start without an API key; that is a permanent setup problem.
            raise ModelRequestError('no Gemini API key: pass api_key or set GEMINI_API_KEY / GOOGLE_API_KEY') from exc

    @staticmethod
    def _config(sdk: _Sdk, model_id: str, request: ModelRequest, timeout_s: float) -> genai_types.GenerateContentConfig:
        types = sdk.types
        profile = _profile(model_id)
        thinking_config = None
        if request.thinking_budget is not None:
            if profile is not None and profile.thinking:
                thinking_config = types.ThinkingConfig(
                    thinking_budget=_thinking_budget(profile, request.thinking_budget)
                )
            else:
                # Sending a thinking config to a model without thinking is a 400; the budget is only a hint.
                logger.debug('thinking budget ignored', extra={'model': model_id})
        tools = None
        if request.tools:
            tools = [
                types.Tool(
                    function_declarations=[
                        types.FunctionDeclaration(
                            name=tool.name, description=tool.description, parameters_json_schema=tool.parameters
                        )
                        for tool in request.tools
                    ]
                )
            ]
        return cast(
            'genai_types.GenerateContentConfig',
            types.GenerateContentConfig(
                system_instruction=request.system or None,
                temperature=request.temperature,
                max_output_tokens=clamp_max_output_tokens(model_id, request.max_output_tokens),
                thinking_config=thinking_config,
                tools=tools,
                # We hand function calls back to the caller; the SDK must not try to execute them.
                automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
                http_options=types.HttpOptions(
                    # HttpOptions.timeout is in milliseconds, and 0 would mean "no timeout" to the client.
                    timeout=max(1, math.ceil(timeout_s * 1000)),
                    retry_options=types.HttpRetryOptions(attempts=1),
                ),
            ),
        )


@contextmanager
def _map_errors(sdk: _Sdk, model_id: str) -> Iterator[None]:
    """The one translation table from google-genai / transport errors to om_lib's model errors."""
    try:
        yield
    except sdk.errors.APIError as exc:
        status = exc.code
        if isinstance(status, int) and 400 <= status < 500 and status not in _TRANSIENT_STATUSES:
            raise ModelRequestError(
                f'Gemini refused the request to {model_id}: {status} {exc.status or ""}'.rstrip(),
                status_code=status,
            ) from exc
        raise unavailable_error(
            f'Gemini is unavailable for {model_id}: {status} {exc.status or ""}'.rstrip(),
            status_code=status if isinstance(status, int) else None,
            throttled=status == 429,
            headers=getattr(getattr(exc, 'response', None), 'headers', None),
        ) from exc
    except sdk.errors.UnknownApiResponseError as exc:
        # A body that is not JSON comes from a proxy or load balancer in trouble, not from the model.
        raise ModelUnavailableError(f'Gemini returned a non-JSON response for {model_id}') from exc
    except sdk.transport_errors as exc:
        raise ModelUnavailableError(f'could not reach Gemini for {model_id}: {type(exc).__name__}') from exc


def _to_content(sdk: _Sdk, content: Content) -> genai_types.Content:
    return cast(
        'genai_types.Content', sdk.types.Content(role=content.role, parts=[_to_part(sdk, p) for p in content.parts])
    )


def _to_part(sdk: _Sdk, part: ContentPart) -> genai_types.Part:
    return cast('genai_types.Part', _sdk_part(sdk, part))


def _sdk_part(sdk: _Sdk, part: ContentPart) -> Any:
    types = sdk.types
    if isinstance(part, str):
        return types.Part.from_text(text=part)
    if isinstance(part, InlineBlob):
        return types.Part.from_bytes(data=part.data, mime_type=part.mime_type)
    if isinstance(part, FunctionCall):
        return types.Part(function_call=types.FunctionCall(name=part.name, args=part.args, id=part.id))
    if isinstance(part, FunctionResponse):
        return types.Part(function_response=types.FunctionResponse(name=part.name, response=part.response, id=part.id))
    raise TypeError(f'unsupported content part: {type(part).__name__}')


def _enum_value(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, 'value', value))


def _to_model_response(response: genai_types.GenerateContentResponse, model_id: str) -> ModelResponse:
    feedback = response.prompt_feedback
    block_reason = _enum_value(feedback.block_reason) if feedback is not None else None
    if block_reason:
        raise ModelOutputError(f'Gemini blocked the prompt to {model_id}: {block_reason}', finish_reason=block_reason)
    if not response.candidates:
        raise ModelOutputError(f'Gemini returned no candidates for {model_id}')
    candidate = response.candidates[0]
    finish_reason = _enum_value(candidate.finish_reason)
    if finish_reason in _UNUSABLE_FINISH_REASONS:
        raise ModelOutputError(
            f'Gemini withheld or cut the answer from {model_id}: {finish_reason}', finish_reason=finish_reason
        )
    parts = candidate.content.parts if candidate.content is not None else None
    if not parts:
        raise ModelOutputError(f'Gemini returned no content from {model_id}', finish_reason=finish_reason)
    # Thought summaries are the model's scratchpad, not its answer.
    text = ''.join(part.text for part in parts if part.text and not part.thought)
    calls = tuple(
        FunctionCall(
            name=part.function_call.name or '', args=dict(part.function_call.args or {}), id=part.function_call.id
        )
        for part in parts
        if part.function_call is not None
    )
    if not text and not calls:
        raise ModelOutputError(
            f'Gemini answered {model_id} with no text and no function call', finish_reason=finish_reason
        )
    metadata = response.usage_metadata
    usage = Usage()
    if metadata is not None:
        # Thinking tokens are billed as output, so they count toward output usage.
        usage = Usage(
            input_tokens=metadata.prompt_token_count or 0,
            output_tokens=(metadata.candidates_token_count or 0) + (metadata.thoughts_token_count or 0),
        )
    return ModelResponse(text=text, model=model_id, function_calls=calls, usage=usage, finish_reason=finish_reason)
