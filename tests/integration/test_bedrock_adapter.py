"""BedrockLanguageModel and BedrockEmbedder with the REAL boto3 `bedrock-runtime` client against the loopback fake."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from om_lib.adapters.embedders.bedrock import BedrockEmbedder
from om_lib.adapters.models.bedrock import BedrockLanguageModel
from om_lib.clock import SystemClock
from om_lib.errors import (
    DeadlineExceededError,
    ModelOutputError,
    ModelRequestError,
    ModelThrottledError,
    ModelUnavailableError,
)
from om_lib.llm import Content, FunctionCall, FunctionResponse, InlineBlob
from om_lib.models.model_router import ModelRouter
from om_lib.models.model_spec import ModelFallbacks, ModelRef
from tests.fakes.fake_bedrock import ConverseReply, FakeBedrock, fake_bedrock_env
from tests.integration.model_adapters import PNG, RECALL, request, serving

NOVA = 'us.amazon.nova-lite-v1:0'
CLAUDE = 'anthropic.claude-3-5-haiku-20241022-v1:0'


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBedrock]:
    # Dummy credentials sign the requests; the fake reads no signature. Configured the way production is: boto3's
    # own endpoint variable, which must win over the general AWS_ENDPOINT_URL (here: a port where nothing listens).
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ENDPOINT_URL': 'http://127.0.0.1:9',
    }.items():
        monkeypatch.setenv(name, value)
    with serving(FakeBedrock(), fake_bedrock_env, monkeypatch) as fake:
        yield fake


@pytest.fixture
def model(server: FakeBedrock) -> BedrockLanguageModel:
    return BedrockLanguageModel()


def test_bedrock_adapter_sends_system_settings_and_cache_point(
    server: FakeBedrock, model: BedrockLanguageModel
) -> None:
    # Given a cacheable model that answers with usage including cache reads
    server.script(NOVA, ConverseReply.text('observed', input_tokens=20, output_tokens=5, cache_read_tokens=300))

    # When the adapter generates with settings above the model's output limit
    response = model.generate(NOVA, request(temperature=0.3, max_output_tokens=100_000), timeout_s=10)

    # Then the answer and every input token (cached ones included) come back; the request was signed and shaped
    assert response.text == 'observed'
    assert response.finish_reason == 'end_turn'
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        320,
        5,
        300,
        0,
    )
    (sent,) = server.converse_requests
    assert sent.signed and sent.model_id == NOVA
    assert sent.system_text == 'You are the memory consciousness.'
    assert sent.system_cache_points == 1
    assert sent.roles == ['user'] and sent.user_texts == ['Observe these messages.']
    assert sent.inference_config == {'maxTokens': 10000, 'temperature': 0.3}


def test_bedrock_adapter_passes_unknown_ids_and_arns_unchanged(
    server: FakeBedrock, model: BedrockLanguageModel
) -> None:
    arn = 'arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3'
    model.generate(arn, request(max_output_tokens=100_000), timeout_s=10)
    model.generate('meta.llama3-70b-instruct-v1:0', request(), timeout_s=10)

    first, second = server.converse_requests
    assert first.model_id == arn
    assert first.inference_config['maxTokens'] == 100_000  # no table entry: sent as configured
    assert first.system_cache_points == 0  # caching only where the model is known to support it
    assert second.inference_config.get('temperature') is None


def test_bedrock_adapter_sends_images_and_documents_as_bytes(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    contents = (
        Content(
            'user',
            (
                'What is in the picture and the file?',
                InlineBlob('image/png', PNG),
                InlineBlob('application/pdf', b'%PDF-1.7 fake'),
                InlineBlob('audio/mpeg', b'ID3'),
            ),
        ),
    )

    model.generate(CLAUDE.replace('3-5-haiku', '3-7-sonnet'), request(contents=contents), timeout_s=10)
    model.generate('amazon.nova-micro-v1:0', request(contents=contents), timeout_s=10)

    vision, text_only = server.converse_requests
    assert vision.images == [('png', PNG)]
    (document,) = vision.blocks('document')
    assert document['format'] == 'pdf' and document['name'] == 'document 1'
    assert any('audio/mpeg' in text and 'cannot read' in text for text in vision.user_texts)
    # A text-only model is told about the image instead of being sent it (Bedrock would refuse the request)
    assert text_only.images == []
    assert any('image/png' in text for text in text_only.user_texts)


def test_bedrock_adapter_tool_use_round_trips(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    # Given the model asks for the recall tool
    server.script(CLAUDE, ConverseReply.tool_use(('recall', {'query': 'lisbon'}), text='Let me look.'))
    first = model.generate(CLAUDE, request(purpose='actor', tools=(RECALL,)), timeout_s=10)
    (call,) = first.function_calls
    assert (call.name, call.args, first.text, first.finish_reason) == (
        'recall',
        {'query': 'lisbon'},
        'Let me look.',
        'tool_use',
    )
    assert call.id

    # When the history with the call and its result goes back
    history = (
        Content('user', ('Where am I moving?',)),
        Content('model', ('Let me look.', call)),
        Content('user', (FunctionResponse('recall', {'result': 'moving to Lisbon in May'}, id=call.id),)),
    )
    second = model.generate(CLAUDE, request(purpose='actor', contents=history, tools=(RECALL,)), timeout_s=10)

    # Then Bedrock saw the tool, the toolUse and the matching toolResult, and the final answer is text
    assert second.text.startswith('fake answer')
    sent = server.converse_requests[-1]
    assert sent.tool_names == ['recall']
    assert sent.roles == ['user', 'assistant', 'user']
    (use,) = sent.blocks('toolUse')
    (result,) = sent.tool_results
    assert use['toolUseId'] == result['toolUseId'] == call.id
    assert 'Lisbon' in result['content'][0]['text']


def test_bedrock_adapter_sends_loose_tool_turns_as_text(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    # Given history that starts with the assistant and holds a client tool call that was never answered
    history = (
        Content('model', ('Earlier reply.', FunctionCall('get_weather', {'city': 'Porto'}, id='c1'))),
        Content('user', ('And now?',)),
    )

    model.generate(CLAUDE, request(purpose='actor', contents=history, tools=(RECALL,)), timeout_s=10)
    model.generate(CLAUDE, request(purpose='actor', contents=history), timeout_s=10)

    # Then the conversation starts with the user, and the loose call is text (no toolUse Bedrock would refuse)
    for sent in server.converse_requests:
        assert sent.roles == ['user', 'assistant', 'user']
        assert sent.blocks('toolUse') == []
        assert any('get_weather' in text for text in sent.blocks('text'))


@pytest.mark.parametrize(
    ('code', 'status', 'throttled'),
    [
        ('ThrottlingException', 429, True),
        ('ServiceQuotaExceededException', 400, True),
        ('ServiceUnavailableException', 503, False),
        ('InternalServerException', 500, False),
        ('ModelTimeoutException', 408, False),
        ('ModelNotReadyException', 429, False),
    ],
)
def test_bedrock_adapter_transient_errors_are_unavailable(
    server: FakeBedrock, model: BedrockLanguageModel, code: str, status: int, throttled: bool
) -> None:
    server.script(NOVA, ConverseReply.error(code), ConverseReply.text('never reached'))

    with pytest.raises(ModelUnavailableError) as info:
        model.generate(NOVA, request(), timeout_s=10)

    assert info.value.status_code == status and code in str(info.value)
    # A rate limit or quota is ModelThrottledError: the reflection workflow waits longer before retrying it
    assert isinstance(info.value, ModelThrottledError) == throttled
    assert info.value.retry_after_s is None  # Bedrock sent no Retry-After
    assert len(server.calls) == 1  # botocore did not retry on its own


@pytest.mark.parametrize(
    ('code', 'bedrock_says', 'we_say'),
    [
        ('AccessDeniedException', "You don't have access to the model with the specified model ID.", 'Model access'),
        ('ResourceNotFoundException', 'Could not resolve the foundation model.', 'inference-profile id'),
        ('ValidationException', 'Input is too long for requested model.', 'Input is too long'),
    ],
)
def test_bedrock_adapter_permanent_errors_name_the_model_and_the_fix(
    server: FakeBedrock, model: BedrockLanguageModel, code: str, bedrock_says: str, we_say: str
) -> None:
    server.script(CLAUDE, ConverseReply.error(code, bedrock_says))

    with pytest.raises(ModelRequestError) as info:
        model.generate(CLAUDE, request(), timeout_s=10)

    message = str(info.value)
    assert f'bedrock/{CLAUDE}' in message or repr(CLAUDE) in message
    assert we_say in message and bedrock_says.rstrip('.') in message
    assert info.value.__cause__ is not None


@pytest.mark.parametrize('stop_reason', ['content_filtered', 'guardrail_intervened', 'malformed_tool_use'])
def test_bedrock_adapter_unusable_answer_is_output_error(
    server: FakeBedrock, model: BedrockLanguageModel, stop_reason: str
) -> None:
    server.script(NOVA, ConverseReply.text('withheld', stop_reason=stop_reason), ConverseReply(content=()))

    with pytest.raises(ModelOutputError) as info:
        model.generate(NOVA, request(), timeout_s=10)
    assert info.value.finish_reason == stop_reason
    with pytest.raises(ModelOutputError, match='no text and no tool call'):
        model.generate(NOVA, request(), timeout_s=10)


def test_bedrock_adapter_max_tokens_with_text_is_returned(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    server.script(NOVA, ConverseReply.text('partial observations', stop_reason='max_tokens'))

    response = model.generate(NOVA, request(), timeout_s=10)

    assert (response.text, response.finish_reason) == ('partial observations', 'max_tokens')


def test_bedrock_adapter_timeout_is_bounded_by_timeout_s(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    # Given the model takes 3 s and the caller has 0.5 s
    server.script(NOVA, ConverseReply.text('too late', delay_s=3))

    started = time.monotonic()
    with pytest.raises(ModelUnavailableError, match='ReadTimeout'):
        model.generate(NOVA, request(), timeout_s=0.5)

    # Then botocore's per-request read timeout stopped it, after one request
    assert 0.4 <= time.monotonic() - started < 2.0
    assert len(server.calls) == 1
    with pytest.raises(DeadlineExceededError):
        model.generate(NOVA, request(), timeout_s=0)
    assert len(server.calls) == 1


def test_router_retries_throttling_and_never_retries_access_denied(
    server: FakeBedrock, model: BedrockLanguageModel
) -> None:
    sleeps: list[float] = []
    router = ModelRouter({'bedrock': model}, clock=SystemClock(), sleep=sleeps.append)
    deadline = time.monotonic() + 30

    # Throttled twice (the second time with a Retry-After, as a gateway in front of Bedrock may send), then an
    # answer: retried with backoff on the same model, waiting at least as long as asked
    server.script(
        NOVA, ConverseReply.error('ThrottlingException'), ConverseReply.error('ThrottlingException', retry_after='9')
    )
    answer = router.generate(ModelRef('bedrock', NOVA), request(), input_tokens=10, deadline=deadline)
    assert answer.model == f'bedrock/{NOVA}'
    assert [call.status for call in server.calls] == [429, 429, 200]
    assert len(sleeps) == 2 and sleeps[0] < 2 and sleeps[1] == 9.0

    # Access denied: not retried; a fallback list moves on to its next model at once
    server.reset()
    server.script(CLAUDE, ConverseReply.error('AccessDeniedException', 'no access'))
    spec = ModelFallbacks(entries=((ModelRef('bedrock', CLAUDE), 3), (ModelRef('bedrock', NOVA), 0)))
    answer = router.generate(spec, request(), input_tokens=10, deadline=deadline)
    assert answer.model == f'bedrock/{NOVA}'
    assert [(call.model_id, call.status) for call in server.calls] == [(CLAUDE, 403), (NOVA, 200)]


def test_titan_embedder_asks_for_dimensions_and_normalises(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    embedder = BedrockEmbedder(model, model_id='amazon.titan-embed-text-v2:0', dimensions=256)

    vectors = embedder.embed(
        ['the dog at the shelter', 'my flight to Tokyo', 'the dog at the shelter'], kind='document', timeout_s=10
    )

    assert embedder.name == 'bedrock/amazon.titan-embed-text-v2:0@256'
    assert [len(v) for v in vectors] == [256, 256, 256]
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]  # in order, one request per text
    bodies = [r.body for r in server.invoke_requests]
    assert len(bodies) == 3
    assert all(body['dimensions'] == 256 and body['normalize'] is True for body in bodies)


def test_titan_embedder_refuses_sizes_and_models_it_cannot_serve(model: BedrockLanguageModel) -> None:
    with pytest.raises(ValueError, match='256, 512, 1024'):
        BedrockEmbedder(model, model_id='amazon.titan-embed-text-v2:0', dimensions=300)
    with pytest.raises(ValueError, match='bedrock/amazon.titan-embed-text-v2:0'):
        BedrockEmbedder(model, model_id='cohere.embed-english-v3', dimensions=256)


def test_titan_embedder_errors_use_the_same_table(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    embedder = BedrockEmbedder(model, model_id='amazon.titan-embed-text-v2:0', dimensions=256)
    server.script('amazon.titan-embed-text-v2:0', ConverseReply.error('ThrottlingException'))
    with pytest.raises(ModelUnavailableError):
        embedder.embed(['hello'], kind='query', timeout_s=10)
    server.script('amazon.titan-embed-text-v2:0', ConverseReply.error('AccessDeniedException', 'no access'))
    with pytest.raises(ModelRequestError, match='Model access'):
        embedder.embed(['hello'], kind='query', timeout_s=10)


def test_importing_the_adapters_imports_no_sdk() -> None:
    code = (
        'import sys, om_lib.adapters.models.bedrock, om_lib.adapters.embedders.bedrock, om_lib.adapters.models.openai, '
        'om_lib.adapters.embedders.openai; sys.exit(any(m in sys.modules for m in ("boto3", "botocore", "openai")))'
    )
    assert subprocess.run([sys.executable, '-c', code], check=False).returncode == 0


def test_a_bedrock_profile_signs_bedrock_calls_only_and_skips_the_emulator_endpoint(
    server: FakeBedrock, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # Given the local stack's situation: emulator credentials and endpoint in the environment, a real profile on disk
    config = tmp_path / 'config'
    config.write_text('[profile bedrock-dev]\naws_access_key_id = AKIABEDROCKDEV\naws_secret_access_key = s\n')
    monkeypatch.setenv('AWS_CONFIG_FILE', str(config))

    # When Bedrock is given the profile and its own endpoint, the call is signed with the profile's key
    BedrockLanguageModel(profile_name='bedrock-dev').generate(NOVA, request(), timeout_s=10)
    assert 'Credential=AKIABEDROCKDEV/' in server.converse_requests[0].headers['authorization']

    # And without a Bedrock endpoint it goes to Bedrock's own, never to the emulator's AWS_ENDPOINT_URL
    monkeypatch.delenv('AWS_ENDPOINT_URL_BEDROCK_RUNTIME')
    client = BedrockLanguageModel(profile_name='bedrock-dev').client()
    assert client.meta.endpoint_url == 'https://bedrock-runtime.us-east-1.amazonaws.com'


# -- ConverseStream (the chat Actor's reply) --------------------------------------------------------------------------
def test_bedrock_stream_hands_on_text_and_reads_tool_use(server: FakeBedrock, model: BedrockLanguageModel) -> None:
    # Given ConverseStream answers of three words (paced), then a tool call after some text
    paced = ConverseReply(content=({'text': 'Hello there friend'},), output_tokens=4, chunk_delay_s=0.05)
    server.script(NOVA, paced, ConverseReply.tool_use(('recall', {'query': 'x'}), text='Looking'))
    seen: list[tuple[float, str]] = []

    # When the adapter streams them through the real boto3 event-stream parser
    response = model.stream(NOVA, request(), timeout_s=10, on_text=lambda d: seen.append((time.monotonic(), d)))
    calls = model.stream(NOVA, request(tools=(RECALL,)), timeout_s=10, on_text=lambda d: None)

    # Then each word arrived as it was sent, and the whole answers read as Converse answers
    assert [d for _, d in seen] == ['Hello', ' there', ' friend']
    assert seen[-1][0] - seen[0][0] >= 0.08
    assert (response.text, response.finish_reason, response.usage.output_tokens) == (
        'Hello there friend',
        'end_turn',
        4,
    )
    assert calls.text == 'Looking'
    assert [(c.name, c.args, c.id) for c in calls.function_calls] == [('recall', {'query': 'x'}, 'tooluse_recall_0')]
    assert [c.operation for c in server.calls] == ['converse-stream', 'converse-stream']


def test_bedrock_stream_maps_errors_before_and_during_the_stream(
    server: FakeBedrock, model: BedrockLanguageModel
) -> None:
    server.script(
        NOVA,
        ConverseReply.error('AccessDeniedException', 'no access'),
        ConverseReply(content=({'text': 'half an answer here'},), stream_error_after=3),
    )
    with pytest.raises(ModelRequestError, match='Model access'):
        model.stream(NOVA, request(), timeout_s=10, on_text=lambda d: None)
    seen: list[str] = []
    # A throttling exception event mid-stream is the throttling it names (transient), after the text it cut.
    with pytest.raises(ModelThrottledError):
        model.stream(NOVA, request(), timeout_s=10, on_text=seen.append)
    assert ''.join(seen) == 'half an'
