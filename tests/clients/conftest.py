"""One local stack for the client tests (offline Observer, small thresholds, recall with vectors, working memory),
and a fake OpenAI-compatible model server for the agent frameworks.

The stack is shared by the whole package (it takes ~3 s to start); tests use their own thread ids.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from om_cli.local_stack import LocalStack
from tests.fakes.fake_openai import FakeOpenAI

# One long user message and its reply pass messageTokens: turns schedule an observation, the next step sees it.
CLIENT_STACK_CONFIG: dict[str, Any] = {
    'model': 'offline',
    'observation': {'messageTokens': 400, 'bufferTokens': False},
    'reflection': {'observationTokens': 6000},
    'retrieval': {'vector': True},
    'workingMemory': {'enabled': True},
}


@pytest.fixture(scope='package')
def stack() -> Iterator[LocalStack]:
    if os.environ.get('AWS_ENDPOINT_URL'):
        pytest.skip('AWS_ENDPOINT_URL is set; the client tests need the embedded emulator')
    env = {
        'OM_EMBEDDING_MODEL': 'hashing',  # keyword vectors: instant, and enough to find a word again
        'POWERTOOLS_LOG_LEVEL': 'WARNING',
        'POWERTOOLS_METRICS_DISABLED': 'true',
    }
    with LocalStack(port=0, config=CLIENT_STACK_CONFIG, env=env, sweep_interval_s=None, visibility_timeout_s=2) as s:
        yield s


@pytest.fixture(scope='package')
def openai_fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_model(openai_fake: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """The fake model server with an empty script and log for this test."""
    openai_fake.reset()
    yield openai_fake
    openai_fake.reset()


@pytest.fixture
def thread_id() -> str:
    return f't-{uuid.uuid4().hex[:12]}'


@pytest.fixture
def resource_id() -> str:
    return f'r-{uuid.uuid4().hex[:12]}'
