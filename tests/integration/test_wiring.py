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
