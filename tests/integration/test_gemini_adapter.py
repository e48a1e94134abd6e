"""GeminiLanguageModel with the REAL google-genai client against the loopback fake Gemini server."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from om_lib.adapters.models.gemini import GeminiLanguageModel
from om_lib.clock import SystemClock
from om_lib.errors import DeadlineExceededError, ModelOutputError, ModelRequestError, ModelUnavailableError
from om_lib.llm import Content, FunctionCall, FunctionDeclaration, FunctionResponse, InlineBlob
from om_lib.models.model_router import ModelRouter
from om_lib.models.model_spec import ModelFallbacks, ModelRef
from tests.fakes.fake_gemini import FakeGemini, FakeReply, fake_gemini_env
from tests.fakes.model_guard import ModelRequestBlockedError, loopback_only
from tests.integration.model_adapters import PNG, request

MODEL = 'gemini-2.5-flash'


@pytest.fixture
def server() -> Iterator[FakeGemini]:
    with loopback_only(), FakeGemini() as fake:
        yield fake


@pytest.fixture
def model(server: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> GeminiLanguageModel:
    # The adapter is configured the way production is: through the client's own environment variables.
    monkeypatch.delenv('GOOGLE_API_KEY', raising=False)
    for key, value in fake_gemini_env(server).items():
        monkeypatch.setenv(key, value)
    return GeminiLanguageModel()


def test_gemini_adapter_parses_text_and_usage(server: FakeGemini, model: GeminiLanguageModel) -> None:
    # Given the fake answers with a thought part and a text part
    server.script(MODEL, FakeReply.text('observed', thoughts=('let me think',), output_tokens=5, thought_tokens=3))

    # When the adapter generates
    response = model.generate(MODEL, request(), timeout_s=10)

    # Then the thought is skipped, usage counts thinking as output, and the key came from the env
    assert response.text == 'observed'
    assert response.finish_reason == 'STOP'
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 8)
    (call,) = server.calls
    assert call.model == MODEL
    assert call.status == 200
    assert call.request.api_key == 'test-key'


def test_gemini_adapter_sends_system_settings_and_clamps_output_tokens(
    server: FakeGemini, model: GeminiLanguageModel
) -> None:
    model.generate(MODEL, request(temperature=0.3, max_output_tokens=100_000, thinking_budget=0), timeout_s=10)

    (sent,) = server.requests
    assert sent.system_text == 'You are the memory consciousness.'
    assert sent.user_texts == ['Observe these messages.']
    config = sent.generation_config
    assert config['temperature'] == 0.3
    assert config['maxOutputTokens'] == 65536
    thinking = config['thinkingConfig']
    assert thinking.get('thinkingBudget', thinking.get('thinking_budget')) == 0


def test_gemini_adapter_clamps_to_smaller_model_limit_and_drops_thinking(
    server: FakeGemini, model: GeminiLanguageModel
) -> None:
    model.generate('gemini-2.0-flash', request(max_output_tokens=20_000, thinking_budget=1024), timeout_s=10)

    config = server.requests[0].generation_config
    assert config['maxOutputTokens'] == 8192
    assert 'thinkingConfig' not in config  # 2.0 Flash has no thinking; sending it would be a 400


def test_gemini_adapter_sends_inline_image_bytes(server: FakeGemini, model: GeminiLanguageModel) -> None:
    contents = (Content('user', ('What is in the picture?', InlineBlob('image/png', PNG))),)

    model.generate(MODEL, request(contents=contents), timeout_s=10)

    (sent,) = server.requests
    assert sent.inline_data_count == 1
    (blob,) = sent.inline_data
    assert base64.b64decode(blob['data']) == PNG
    assert blob.get('mimeType', blob.get('mime_type')) == 'image/png'


def test_gemini_adapter_function_calls_round_trip(server: FakeGemini, model: GeminiLanguageModel) -> None:
    # Given a tool and a history with an earlier call and its result
    tool = FunctionDeclaration(
        name='recall',
        description='Look up older messages.',
        parameters={'type': 'object', 'properties': {'query': {'type': 'string'}}, 'required': ['query']},
    )
    history = (
        Content('user', ('What did I say about Lisbon?',)),
        Content('model', (FunctionCall('recall', {'query': 'lisbon'}),)),
        Content('user', (FunctionResponse('recall', {'result': 'moving in May'}),)),
    )
    server.script(MODEL, FakeReply.function_calls(('recall', {'query': 'lisbon flat'})))

    # When the model answers with a function call
    response = model.generate(MODEL, request(contents=history, tools=(tool,)), timeout_s=10)

    # Then the call is parsed, and the tool and history were sent
    assert response.function_calls == (FunctionCall('recall', {'query': 'lisbon flat'}),)
    assert response.text == ''
    (sent,) = server.requests
    assert [decl['name'] for decl in sent.tools] == ['recall']
    roles = [content['role'] for content in sent.body['contents']]
    assert roles == ['user', 'model', 'user']


@pytest.mark.parametrize('status', [429, 500, 503])
def test_gemini_adapter_transient_status_is_unavailable(
    server: FakeGemini, model: GeminiLanguageModel, status: int
) -> None:
    server.script(MODEL, FakeReply.error(status), FakeReply.text('never reached'))

    with pytest.raises(ModelUnavailableError) as info:
        model.generate(MODEL, request(), timeout_s=10)

    assert info.value.status_code == status
    assert len(server.calls) == 1  # the client did not retry on its own
    # A rate limit is named apart: the reflection workflow retries it longer (the error type is what the ASL matches).
    assert (type(info.value).__name__ == 'ModelThrottledError') == (status == 429)


def test_gemini_adapter_reads_retry_after(server: FakeGemini, model: GeminiLanguageModel) -> None:
    # Given a 429 that asks the client to wait 12 s
    server.script(MODEL, FakeReply.error(429, 'slow down', retry_after='12'))
    # Then the error carries it, for the router's backoff and the circuit breaker
    with pytest.raises(ModelUnavailableError) as info:
        model.generate(MODEL, request(), timeout_s=10)
    assert info.value.retry_after_s == 12.0


@pytest.mark.parametrize('status', [400, 403, 404])
def test_gemini_adapter_client_error_is_request_error(
    server: FakeGemini, model: GeminiLanguageModel, status: int
) -> None:
    server.script(MODEL, FakeReply.error(status, 'API key not valid'))

    with pytest.raises(ModelRequestError) as info:
        model.generate(MODEL, request(), timeout_s=10)

    assert info.value.status_code == status
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ('reply', 'finish_reason'),
    [
        (FakeReply.empty(), None),
        (FakeReply.blocked('SAFETY'), 'SAFETY'),
        (FakeReply.blocked('RECITATION'), 'RECITATION'),
        (FakeReply.prompt_blocked('PROHIBITED_CONTENT'), 'PROHIBITED_CONTENT'),
        (FakeReply.text('', finish_reason='STOP'), 'STOP'),
    ],
)
def test_gemini_adapter_unusable_answer_is_output_error(
    server: FakeGemini, model: GeminiLanguageModel, reply: FakeReply, finish_reason: str | None
) -> None:
    server.script(MODEL, reply)

    with pytest.raises(ModelOutputError) as info:
        model.generate(MODEL, request(), timeout_s=10)

    assert info.value.finish_reason == finish_reason


def test_gemini_adapter_max_tokens_with_text_is_returned(server: FakeGemini, model: GeminiLanguageModel) -> None:
    server.script(MODEL, FakeReply.text('partial observations', finish_reason='MAX_TOKENS'))

    response = model.generate(MODEL, request(), timeout_s=10)

    assert response.text == 'partial observations'
    assert response.finish_reason == 'MAX_TOKENS'


def test_gemini_adapter_timeout_is_bounded_by_timeout_s(server: FakeGemini, model: GeminiLanguageModel) -> None:
    # Given the fake takes 5 s to answer
    server.script(MODEL, FakeReply.text('too late', delay_s=5))

    # When the caller has 1 s
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError):
        model.generate(MODEL, request(), timeout_s=1)
    elapsed = time.monotonic() - started

    # Then it gives up after about 1 s, having sent exactly one request
    assert 0.9 <= elapsed < 2.0
    assert len(server.calls) == 1


def test_gemini_adapter_no_time_left_does_not_call(server: FakeGemini, model: GeminiLanguageModel) -> None:
    with pytest.raises(DeadlineExceededError):
        model.generate(MODEL, request(), timeout_s=0)
    assert server.calls == []


def test_gemini_adapter_unreachable_server_is_unavailable(server: FakeGemini) -> None:
    # Given a base URL where nothing listens (the fake, stopped)
    url = server.url
    server.stop()
    model = GeminiLanguageModel(api_key='test-key', base_url=url)

    with pytest.raises(ModelUnavailableError) as info:
        model.generate(MODEL, request(), timeout_s=2)
    assert info.value.status_code is None


def test_gemini_adapter_reuses_its_client(server: FakeGemini, model: GeminiLanguageModel) -> None:
    model.generate(MODEL, request(), timeout_s=10)
    first = model.client()
    model.generate(MODEL, request(), timeout_s=10)

    assert model.client() is first
    assert len(server.calls) == 2


def test_gemini_adapter_without_api_key_is_request_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('GOOGLE_API_KEY', raising=False)
    monkeypatch.delenv('GEMINI_API_KEY', raising=False)

    with pytest.raises(ModelRequestError, match='no Gemini API key'):
        GeminiLanguageModel(base_url='http://127.0.0.1:9').generate(MODEL, request(), timeout_s=1)


def test_router_falls_back_through_real_client(server: FakeGemini) -> None:
    # Given a fallback list: flash answers 503 every time, pro answers text
    server.script(MODEL, FakeReply.error(503), FakeReply.error(503))
    server.script('gemini-2.5-pro', FakeReply.text('from pro'))
    router = ModelRouter(
        {'google': GeminiLanguageModel(api_key='test-key', base_url=server.url)},
        clock=SystemClock(),
        sleep=lambda _seconds: None,  # the backoff policy is unit-tested; keep this test fast
    )
    spec = ModelFallbacks(entries=((ModelRef('google', MODEL), 1), (ModelRef('google', 'gemini-2.5-pro'), 0)))

    # When the router runs it
    response = router.generate(spec, request(), input_tokens=100, deadline=time.monotonic() + 10)

    # Then pro served, as the fake's log shows
    assert response.text == 'from pro'
    assert response.model == 'google/gemini-2.5-pro'
    assert [(call.model, call.status) for call in server.calls] == [
        (MODEL, 503),
        (MODEL, 503),
        ('gemini-2.5-pro', 200),
    ]


def test_model_guard_blocks_non_loopback() -> None:
    with loopback_only(), pytest.raises(ModelRequestBlockedError):
        GeminiLanguageModel(api_key='k', base_url='http://192.0.2.1:80').generate(MODEL, request(), timeout_s=2)


def test_fake_gemini_embeddings_are_deterministic(server: FakeGemini) -> None:
    import json
    import urllib.request

    def post(method: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(
            f'{server.url}/v1beta/models/text-embedding-004:{method}',
            data=json.dumps(body).encode(),
            headers={'Content-Type': 'application/json'},
        )
        with urllib.request.urlopen(req, timeout=5) as answer:
            return json.loads(answer.read())

    single = post('embedContent', {'content': {'parts': [{'text': 'hello'}]}})
    batch = post('batchEmbedContents', {'requests': [{'content': {'parts': [{'text': 'hello'}]}}]})

    assert single['embedding'] == batch['embeddings'][0]  # type: ignore[index]
    assert len(single['embedding']['values']) == 8  # type: ignore[index]


def test_importing_the_adapter_does_not_import_google_genai() -> None:
    code = (
        'import sys, om_lib.adapters.models.gemini, om_lib.models.model_router; sys.exit("google.genai" in sys.modules)'
    )
    assert subprocess.run([sys.executable, '-c', code], check=False).returncode == 0


def test_gemini_adapter_rebuilds_its_client_when_the_key_changes(server: FakeGemini) -> None:
    # A placeholder key snapshotted at deploy, then the real one stored: the next call must use the new key.
    keys = iter(['placeholder', 'placeholder', 'real-key'])
    model = GeminiLanguageModel(base_url=server.url, api_key_provider=lambda: next(keys))
    model.generate('gemini-2.5-flash', request(), timeout_s=5)
    model.generate('gemini-2.5-flash', request(), timeout_s=5)
    model.generate('gemini-2.5-flash', request(), timeout_s=5)
    assert [r.api_key for r in server.requests] == ['placeholder', 'placeholder', 'real-key']


# -- streaming (the chat Actor's reply) --------------------------------------------------------------------------------
def test_gemini_stream_hands_on_text_as_it_arrives(server: FakeGemini, model: GeminiLanguageModel) -> None:
    # Given the fake streams a thought, then an answer of three words with a function call after them
    reply = FakeReply.text('Hello there friend', thoughts=('hmm',), output_tokens=4)
    server.script(MODEL, reply.paced(0.05))
    seen: list[tuple[float, str]] = []

    # When the adapter streams it
    response = model.stream(MODEL, request(), timeout_s=10, on_text=lambda d: seen.append((time.monotonic(), d)))

    # Then each word arrived on its own, the thought did not, and the whole answer reads as one
    assert [d for _, d in seen] == ['Hello', ' there', ' friend']
    assert seen[-1][0] - seen[0][0] >= 0.08  # as they arrived, not after the last one
    assert response.text == 'Hello there friend'
    assert response.finish_reason == 'STOP'
    assert response.usage.output_tokens == 4
    (call,) = server.calls
    assert call.method == 'streamGenerateContent'
    assert call.events_sent == 4


def test_gemini_stream_keeps_function_calls_and_maps_errors(server: FakeGemini, model: GeminiLanguageModel) -> None:
    server.script(
        MODEL,
        FakeReply.function_calls(('recall', {'query': 'x'}), text='Looking'),
        FakeReply.error(503),
        FakeReply.text('cut short here').cut(1),
    )
    calls = model.stream(MODEL, request(), timeout_s=10, on_text=lambda d: None)
    assert calls.text == 'Looking'
    assert [c.name for c in calls.function_calls] == ['recall']
    with pytest.raises(ModelUnavailableError):
        model.stream(MODEL, request(), timeout_s=10, on_text=lambda d: None)
    # A stream that ends without a finish reason broke off: its text is not taken as a whole answer.
    with pytest.raises(ModelUnavailableError, match='broke off'):
        model.stream(MODEL, request(), timeout_s=10, on_text=lambda d: None)


def test_router_retries_a_stream_only_before_its_first_text(server: FakeGemini, model: GeminiLanguageModel) -> None:
    clock = SystemClock()
    router = ModelRouter({'google': model}, clock=clock, sleep=lambda s: None)
    seen: list[str] = []
    # Before any text: a 503 is retried. After some text: a broken stream is final.
    server.script(MODEL, FakeReply.error(503), FakeReply.text('all good'))
    answer = router.generate(
        ModelRef('google', MODEL), request(), input_tokens=1, deadline=clock.monotonic() + 10, on_text=seen.append
    )
    assert answer.text == 'all good' and ''.join(seen) == 'all good'
    server.script(MODEL, FakeReply.text('half an answer').cut(2), FakeReply.text('second answer'))
    seen.clear()
    with pytest.raises(ModelUnavailableError):
        router.generate(
            ModelRef('google', MODEL), request(), input_tokens=1, deadline=clock.monotonic() + 10, on_text=seen.append
        )
    assert ''.join(seen) == 'half an'
    assert server.pending(MODEL) == 1  # not asked again
