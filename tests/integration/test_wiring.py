"""The service wiring: the Gemini key comes from Secrets Manager on use, never frozen at init."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from functions._wiring import SecretKey


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch):
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        yield boto3.client('secretsmanager', region_name='us-east-1')


def test_secret_key_is_cached_then_reread_after_invalidation(secrets) -> None:
    arn = secrets.create_secret(Name='gemini', SecretString='placeholder')['ARN']
    key = SecretKey(arn, ttl_s=300)
    assert key() == 'placeholder'
    secrets.put_secret_value(SecretId=arn, SecretString='real-key')
    assert key() == 'placeholder'  # cached within the TTL
    key.invalidate()  # what a SnapStart restore does
    assert key() == 'real-key'


def test_secret_key_rereads_after_its_ttl(secrets) -> None:
    arn = secrets.create_secret(Name='gemini-ttl', SecretString='one')['ARN']
    key = SecretKey(arn, ttl_s=0)
    assert key() == 'one'
    secrets.put_secret_value(SecretId=arn, SecretString='two')
    assert key() == 'two'


# ---- providers: Bedrock and OpenAI-compatible beside Gemini -------------------------------------------------------
@pytest.fixture
def wiring(monkeypatch: pytest.MonkeyPatch):
    """The wiring with a clean model environment (names only: nothing is called unless a test does)."""
    from functions import _wiring

    for name in (
        'GEMINI_API_KEY',
        'GOOGLE_API_KEY',
        'GOOGLE_GEMINI_BASE_URL',
        'OPENAI_API_KEY',
        'OPENAI_BASE_URL',
        'AWS_ENDPOINT_URL_BEDROCK_RUNTIME',
        'OM_BEDROCK_PROFILE',
        'OM_GEMINI_SECRET_ARN',
        'OM_OPENAI_SECRET_ARN',
        'OM_CONFIG_FILE',
        'OM_EMBEDDING_MODEL',
        'OM_EMBEDDING_DIMENSIONS',
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('OM_TABLE_NAME', 'om-test')
    monkeypatch.setenv('OM_BUCKET_NAME', 'om-test')
    _wiring.reset()
    yield _wiring
    _wiring.reset()


def _use(monkeypatch: pytest.MonkeyPatch, config: dict, **env: str) -> None:
    import json

    monkeypatch.setenv('OM_CONFIG', json.dumps(config))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


ALL_BEDROCK = {'model': 'bedrock/us.amazon.nova-lite-v1:0', 'actorModel': 'openai/gpt-4o-mini'}


def test_local_runs_fall_back_per_provider_and_say_which(wiring, monkeypatch, caplog) -> None:
    from om_lib.adapters.models.bedrock import BedrockLanguageModel
    from om_lib.models.offline_model import OfflineLanguageModel

    # Given a local run (offline fallback allowed) using Bedrock and OpenAI, with only an OpenAI key
    _use(monkeypatch, ALL_BEDROCK, OM_OFFLINE_FALLBACK='1', OPENAI_API_KEY='k')
    with caplog.at_level('WARNING'):
        providers = wiring.providers()
    # Then Bedrock (no endpoint of its own: the local AWS is an emulator) runs offline and says so; OpenAI is real
    assert isinstance(providers['bedrock'], OfflineLanguageModel)
    assert not isinstance(providers['openai'], OfflineLanguageModel)
    notices = [r.getMessage() for r in caplog.records]
    assert any('bedrock/' in n and 'AWS_ENDPOINT_URL_BEDROCK_RUNTIME' in n for n in notices)
    assert not any('GEMINI_API_KEY' in n for n in notices)  # Gemini is not used: nothing to say about it

    # When Bedrock has its endpoint, it is the real adapter
    wiring.reset()
    monkeypatch.setenv('AWS_ENDPOINT_URL_BEDROCK_RUNTIME', 'http://127.0.0.1:9')
    assert isinstance(wiring.providers()['bedrock'], BedrockLanguageModel)


def test_deployed_functions_never_fall_back(wiring, monkeypatch) -> None:
    from om_lib.models.offline_model import OfflineLanguageModel

    _use(monkeypatch, ALL_BEDROCK)
    providers = wiring.providers()
    assert not any(isinstance(providers[name], OfflineLanguageModel) for name in ('google', 'bedrock', 'openai'))


def test_embedders_are_chosen_and_checked_at_start_up(wiring, monkeypatch) -> None:
    from pydantic import ValidationError

    from om_lib.adapters.embedders.bedrock import BedrockEmbedder
    from om_lib.adapters.embedders.openai import OpenAIEmbedder

    semantic = {**ALL_BEDROCK, 'retrieval': {'vector': True}}
    _use(monkeypatch, semantic, OM_EMBEDDING_MODEL='bedrock/amazon.titan-embed-text-v2:0')
    assert isinstance(wiring.embedder(), BedrockEmbedder)
    wiring.reset()
    monkeypatch.setenv('OM_EMBEDDING_MODEL', 'openai/text-embedding-3-small')
    embedder = wiring.embedder()
    assert isinstance(embedder, OpenAIEmbedder) and embedder.name == 'openai/text-embedding-3-small@256'
    wiring.reset()
    monkeypatch.setenv('OM_EMBEDDING_MODEL', 'bedrock/amazon.titan-embed-text-v2:0')
    monkeypatch.setenv('OM_EMBEDDING_DIMENSIONS', '300')
    with pytest.raises(ValueError, match='256, 512, 1024'):
        wiring.embedder()
    wiring.reset()
    monkeypatch.setenv('OM_EMBEDDING_MODEL', 'cohere/embed')
    with pytest.raises(ValidationError, match='is not an embedder'):
        wiring.settings()


def test_the_openai_key_comes_from_secrets_manager(wiring, monkeypatch, secrets) -> None:
    from om_lib.llm import Content, ModelRequest
    from tests.fakes.fake_openai import FakeOpenAI

    # Given a deployed function: the key's ARN in the environment, the endpoint a gateway
    arn = secrets.create_secret(Name='openai', SecretString='sk-from-secrets-manager')['ARN']
    with FakeOpenAI() as server:
        _use(monkeypatch, ALL_BEDROCK, OM_OPENAI_SECRET_ARN=arn, OPENAI_BASE_URL=server.base_url)
        # When the Actor's provider is called
        request = ModelRequest('actor', 'system', (Content('user', ('hello',)),))
        wiring.providers()['openai'].generate('gpt-4o-mini', request, timeout_s=5)
        # Then the request carried the secret's value
        assert server.chat_requests[0].headers['authorization'] == 'Bearer sk-from-secrets-manager'
