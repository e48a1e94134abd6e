"""OpenAILanguageModel and OpenAIEmbedder with the REAL openai client against the loopback fake OpenAI server."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from om_lib.adapters.embedders.openai import OpenAIEmbedder
from om_lib.adapters.models.openai import OpenAILanguageModel
from om_lib.clock import SystemClock
from om_lib.errors import ModelOutputError, ModelRequestError, ModelThrottledError, ModelUnavailableError
from om_lib.llm import Content, FunctionCall, FunctionResponse, InlineBlob
from om_lib.models.model_router import ModelRouter
from om_lib.models.model_spec import ModelRef
from tests.fakes.fake_openai import ChatReply, FakeOpenAI, ToolCall, fake_openai_env
from tests.integration.model_adapters import PNG, RECALL, serving
from tests.integration.model_adapters import actor_request as request

MODEL = 'gpt-4o-mini'


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with serving(FakeOpenAI(), fake_openai_env, monkeypatch) as fake:
        yield fake


@pytest.fixture
def model(server: FakeOpenAI) -> OpenAILanguageModel:
    return OpenAILanguageModel()


def test_openai_adapter_sends_system_settings_and_reads_usage(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    server.script(replace(ChatReply.text('hi!'), prompt_tokens=40, cached_tokens=32))

    response = model.generate(MODEL, request(temperature=0.3, max_output_tokens=100_000), timeout_s=10)

    assert (response.text, response.finish_reason) == ('hi!', 'stop')
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.cache_read_tokens) == (40, 7, 32)
    (sent,) = server.chat_requests
    assert sent.headers['authorization'] == 'Bearer test-key'
    assert [m['role'] for m in sent.messages] == ['system', 'user']
    assert sent.system_text == 'You are a helpful assistant.' and sent.last_user_text == 'Hello there.'
    assert sent.body['max_completion_tokens'] == 16384  # clamped to gpt-4o's limit
    assert sent.body['temperature'] == 0.3


def test_openai_adapter_leaves_out_what_a_model_refuses(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    model.generate('gpt-5-mini', request(temperature=0.3), timeout_s=10)  # reasoning models take no temperature
    model.generate('llama3.1:8b', request(temperature=0.2, max_output_tokens=50_000), timeout_s=10)

    reasoning, gateway = server.chat_requests
    assert 'temperature' not in reasoning.body
    assert gateway.body['temperature'] == 0.2 and gateway.body['max_completion_tokens'] == 50_000


def test_openai_adapter_sends_images_and_pdfs_as_data_urls(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    contents = (
        Content('user', ('What is in these?', InlineBlob('image/png', PNG), InlineBlob('application/pdf', b'%PDF-1'))),
    )

    model.generate(MODEL, request(contents=contents), timeout_s=10)

    (sent,) = server.chat_requests
    (url,) = sent.image_urls
    assert url.startswith('data:image/png;base64,') and base64.b64decode(url.split(',', 1)[1]) == PNG
    parts = sent.messages[-1]['content']
    (file_part,) = [p for p in parts if p['type'] == 'file']
    assert file_part['file']['file_data'].startswith('data:application/pdf;base64,')


def test_openai_adapter_tool_calls_round_trip(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    # Given the model asks for the recall tool
    server.script(ChatReply.tool_calls(ToolCall('recall', {'query': 'lisbon'}, id='call_1')), ChatReply.text('Lisbon.'))
    first = model.generate(MODEL, request(tools=(RECALL,)), timeout_s=10)
    assert first.function_calls == (FunctionCall('recall', {'query': 'lisbon'}, id='call_1'),)

    # When the call and its result go back
    history = (
        Content('user', ('Where am I moving?',)),
        Content('model', first.function_calls),
        Content('user', (FunctionResponse('recall', {'result': 'moving to Lisbon'}, id='call_1'),)),
    )
    second = model.generate(MODEL, request(contents=history, tools=(RECALL,)), timeout_s=10)

    # Then the tool message follows the assistant's call, paired by id
    assert second.text == 'Lisbon.'
    sent = server.chat_requests[-1]
    assert sent.tool_names == ['recall']
    assert [m['role'] for m in sent.messages] == ['system', 'user', 'assistant', 'tool']
    assert sent.tool_calls[0]['id'] == sent.messages[-1]['tool_call_id'] == 'call_1'
    assert json.loads(sent.tool_results[0]) == {'result': 'moving to Lisbon'}


def test_openai_adapter_sends_an_unanswered_call_as_text(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    history = (
        Content('user', ('Weather?',)),
        Content('model', (FunctionCall('get_weather', {'city': 'Porto'}, id='c9'),)),
        Content('user', ('Never mind.',)),
    )

    model.generate(MODEL, request(contents=history), timeout_s=10)

    (sent,) = server.chat_requests
    assert sent.tool_calls == []  # OpenAI refuses a call with no tool message after it
    assert 'get_weather' in sent.texts('assistant')[0]


@pytest.mark.parametrize(('status', 'code'), [(429, None), (500, None), (503, None), (408, None)])
def test_openai_adapter_transient_errors_are_unavailable(
    server: FakeOpenAI, model: OpenAILanguageModel, status: int, code: str | None
) -> None:
    server.script(ChatReply.error(status, code=code), ChatReply.text('never reached'))

    with pytest.raises(ModelUnavailableError) as info:
        model.generate(MODEL, request(), timeout_s=10)

    assert info.value.status_code == status
    assert isinstance(info.value, ModelThrottledError) == (status == 429)
    assert len(server.chat_requests) == 1  # the client did not retry on its own


def test_openai_adapter_reads_retry_after_and_the_router_waits_for_it(
    server: FakeOpenAI, model: OpenAILanguageModel
) -> None:
    # Given a rate limit asking for 2.5 s (OpenAI's retry-after-ms) and an outage asking for 4 s (Retry-After)
    server.script(
        ChatReply.error(429, 'slow down', code='rate_limit_exceeded', headers={'retry-after-ms': '2500'}),
        ChatReply.error(503, 'overloaded', headers={'Retry-After': '4'}),
        ChatReply.text('at last'),
    )
    sleeps: list[float] = []
    router = ModelRouter({'openai': model}, clock=SystemClock(), sleep=sleeps.append)

    answer = router.generate(ModelRef('openai', MODEL), request(), input_tokens=10, deadline=time.monotonic() + 30)

    # Then the router retried after at least as long as each answer asked (its own backoff is ~1 s, then ~2 s)
    assert answer.text == 'at last'
    assert sleeps == [2.5, 4.0]
    assert [call.status for call in server.calls] == [429, 503, 200]


@pytest.mark.parametrize(
    ('status', 'code', 'hint'),
    [
        (401, None, 'OPENAI_API_KEY'),
        (404, 'model_not_found', 'no such model'),
        (400, None, 'refused the request'),
        (429, 'insufficient_quota', 'no quota left'),
    ],
)
def test_openai_adapter_permanent_errors_are_request_errors(
    server: FakeOpenAI, model: OpenAILanguageModel, status: int, code: str | None, hint: str
) -> None:
    server.script(ChatReply.error(status, 'scripted refusal', code=code))

    with pytest.raises(ModelRequestError) as info:
        model.generate(MODEL, request(), timeout_s=10)

    assert info.value.status_code == status
    assert f'openai/{MODEL}' in str(info.value) and hint in str(info.value) and 'scripted refusal' in str(info.value)


def test_openai_adapter_unusable_answers_are_output_errors(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    server.script(
        ChatReply.text('withheld', finish_reason='content_filter'),
        ChatReply.tool_calls(ToolCall('recall', '{"query": ')),
        ChatReply.text(''),
    )
    for match in ('content filter', 'malformed arguments', 'no text and no tool call'):
        with pytest.raises(ModelOutputError, match=match):
            model.generate(MODEL, request(tools=(RECALL,)), timeout_s=10)


def test_openai_adapter_timeout_is_bounded_by_timeout_s(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    server.script(ChatReply.text('too late', delay_s=3))

    started = time.monotonic()
    with pytest.raises(ModelUnavailableError, match='did not answer in time'):
        model.generate(MODEL, request(), timeout_s=0.5)

    assert 0.4 <= time.monotonic() - started < 2.0


def test_openai_adapter_without_key_or_endpoint_is_request_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('OPENAI_API_KEY', raising=False)
    monkeypatch.delenv('OPENAI_BASE_URL', raising=False)

    with pytest.raises(ModelRequestError, match='OPENAI_API_KEY'):
        OpenAILanguageModel().generate(MODEL, request(), timeout_s=1)


def test_openai_adapter_gateway_without_key_gets_a_placeholder(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An Ollama or local vLLM endpoint needs no key; the client needs one to start
    monkeypatch.delenv('OPENAI_API_KEY')
    OpenAILanguageModel().generate('llama3.1:8b', request(), timeout_s=5)
    assert server.chat_requests[0].headers['authorization'] == 'Bearer not-needed'


def test_openai_adapter_rebuilds_its_client_when_the_key_changes(server: FakeOpenAI) -> None:
    keys = iter(['placeholder', 'real-key'])
    model = OpenAILanguageModel(base_url=server.base_url, api_key_provider=lambda: next(keys))
    model.generate(MODEL, request(), timeout_s=5)
    model.generate(MODEL, request(), timeout_s=5)
    assert [r.headers['authorization'] for r in server.chat_requests] == ['Bearer placeholder', 'Bearer real-key']


def test_openai_embedder_asks_for_dimensions_and_normalises(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    embedder = OpenAIEmbedder(model, model_id='text-embedding-3-small', dimensions=256)

    vectors = embedder.embed(['a dog at the shelter', 'a flight to Tokyo'], kind='document', timeout_s=10)

    assert embedder.name == 'openai/text-embedding-3-small@256'
    assert [len(v) for v in vectors] == [256, 256]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    (sent,) = server.embedding_requests
    assert sent.body['dimensions'] == 256 and sent.body['encoding_format'] == 'float'
    assert sent.inputs == ['a dog at the shelter', 'a flight to Tokyo']


def test_openai_embedder_says_which_size_a_fixed_size_model_needs(
    server: FakeOpenAI, model: OpenAILanguageModel
) -> None:
    # A gateway model that takes no `dimensions` returns its own size (the fake's default: 8)
    embedder = OpenAIEmbedder(model, model_id='nomic-embed-text', dimensions=256)

    with pytest.raises(ModelOutputError, match='OM_EMBEDDING_DIMENSIONS=8'):
        embedder.embed(['hello'], kind='query', timeout_s=10)
    assert 'dimensions' not in server.embedding_requests[0].body


# -- streaming (the chat Actor's reply) --------------------------------------------------------------------------------
def test_openai_stream_hands_on_text_and_reads_tool_calls(server: FakeOpenAI, model: OpenAILanguageModel) -> None:
    server.script(
        ChatReply.text('Hello there, friend').paced(0.05),
        ChatReply.tool_calls(('recall', {'query': 'x'}), text='Looking'),
        ChatReply.error(429, 'slow down'),
    )
    seen: list[tuple[float, str]] = []
    response = model.stream(
        'gpt-4o-mini', request(), timeout_s=10, on_text=lambda d: seen.append((time.monotonic(), d))
    )
    assert ''.join(d for _, d in seen) == 'Hello there, friend' and len(seen) == 3
    assert seen[-1][0] - seen[0][0] >= 0.08  # pieces arrived as they were sent
    assert (response.text, response.finish_reason, response.usage.output_tokens) == ('Hello there, friend', 'stop', 7)
    calls = model.stream('gpt-4o-mini', request(tools=(RECALL,)), timeout_s=10, on_text=lambda d: None)
    assert calls.text == 'Looking' and [(c.name, c.args) for c in calls.function_calls] == [('recall', {'query': 'x'})]
    with pytest.raises(ModelThrottledError):
        model.stream('gpt-4o-mini', request(), timeout_s=10, on_text=lambda d: None)
    assert all(r.stream for r in server.chat_requests)
    assert server.chat_requests[0].body['stream_options'] == {'include_usage': True}
