"""The local stack (embedded moto server, workers and the HTTP API in this process) with a fake Gemini behind it.

One stack per module: it takes a few seconds to start. The real google-genai client talks to the loopback fake
(`GOOGLE_GEMINI_BASE_URL`), which answers as the Observer, the Reflector or the Actor depending on the system prompt;
tests switch it to failing or slow with `gemini_mode`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from functions import _wiring
from om_cli.local_stack import LocalStack
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest, fake_gemini_env

# Small thresholds: one long message is due for observation, three observations for reflection.
E2E_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 200, 'bufferTokens': False},
    'reflection': {'observationTokens': 300},
}
ACTOR_REPLY = 'Noted. I will remember that.'
REFLECTION = '<observations>\nDate: Mar 3, 2025\n* 🔴 (09:00) User shared several facts (condensed)\n</observations>'


def observer_block(n: int) -> str:
    lines = '\n'.join(
        f'* 🔴 (09:{i:02d}) User stated fact {n}.{i} about the migration plan and its owners' for i in range(6)
    )
    task = f'<current-task>\nPrimary: item {n}\n</current-task>'
    return f'<observations>\nDate: Mar 3, 2025\n{lines}\n</observations>\n{task}'


@dataclass
class GeminiMode:
    """The fake's behaviour: `fail_status` fails every call with that status; `observer_delay_s` slows the Observer."""

    fail_status: int | None = None
    observer_delay_s: float = 0.0


class RoleAwareGemini:
    """Answers as the Observer, the Reflector or the Actor, told apart by the system prompt."""

    def __init__(self) -> None:
        self.mode = GeminiMode()
        self.observations = 0
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        mode = self.mode
        if mode.fail_status is not None:
            return FakeReply.error(mode.fail_status, 'scripted outage')
        system = request.system_text
        if 'observation reflector' in system:
            return FakeReply.text(REFLECTION)
        if 'You are the memory of an AI assistant' in system:
            with self._lock:
                self.observations += 1
                n = self.observations
            return FakeReply.text(observer_block(n), delay_s=mode.observer_delay_s)
        return FakeReply.text(ACTOR_REPLY)


@pytest.fixture(scope='module')
def gemini() -> Iterator[tuple[FakeGemini, RoleAwareGemini]]:
    behaviour = RoleAwareGemini()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@contextmanager
def running_stack(
    server: FakeGemini, config: dict[str, Any], extra_env: dict[str, str] | None = None
) -> Iterator[LocalStack]:
    """A local stack with `config`, its functions pointed at the fake Gemini `server` (skips outside a clean env).

    `extra_env` adds to the functions' environment (other fakes' endpoints, OM_EMBEDDING_MODEL, ...).
    """
    for name in ('AWS_ENDPOINT_URL', 'GOOGLE_API_KEY'):
        if os.environ.get(name):
            pytest.skip(f'{name} is set; the e2e stack needs the embedded emulator and the fake Gemini only')
    env = {
        **fake_gemini_env(server),
        'POWERTOOLS_LOG_LEVEL': 'WARNING',
        'POWERTOOLS_METRICS_DISABLED': 'true',
        **(extra_env or {}),
    }
    # Short visibility timeout: a failed job is redelivered (and a poison one dead-lettered) within seconds.
    with LocalStack(port=0, config=config, env=env, sweep_interval_s=None, visibility_timeout_s=2) as running:
        yield running


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, _ = gemini
    with running_stack(server, E2E_CONFIG) as running:
        yield running


@pytest.fixture
def mode(gemini) -> Iterator[GeminiMode]:
    """The fake's behaviour for this test (reset afterwards)."""
    _, behaviour = gemini
    behaviour.mode = GeminiMode()
    yield behaviour.mode
    behaviour.mode = GeminiMode()


@pytest.fixture
def settings_env(stack) -> Iterator[Callable[..., None]]:
    """Change the functions' environment for one test (the wiring is rebuilt; restored afterwards)."""
    saved: dict[str, str | None] = {}

    def apply(**values: str) -> None:
        for name, value in values.items():
            saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        _wiring.reset()

    yield apply
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _wiring.reset()


class Api:
    """A tiny JSON client over real HTTP (urllib)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        sent = {'Content-Type': 'application/json'} if headers is None else headers
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = response.read()
                return response.status, json.loads(payload) if payload else None
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            return exc.code, json.loads(payload) if payload else None

    def get(self, path: str) -> tuple[int, Any]:
        return self.request('GET', path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request('POST', path, body)

    def delete(self, path: str) -> tuple[int, Any]:
        return self.request('DELETE', path)


class Storage:
    """Everything the stack has stored: every table item and every bucket object (with its ETag)."""

    def __init__(self, stack: LocalStack) -> None:
        self.ddb = stack.client('dynamodb')
        self.s3 = stack.client('s3')
        self.names = stack.names

    def snapshot(self) -> tuple[list[str], list[str]]:
        items = [
            json.dumps(item, sort_keys=True)
            for page in self.ddb.get_paginator('scan').paginate(TableName=self.names.table, ConsistentRead=True)
            for item in page['Items']
        ]
        objects = [
            f'{o["Key"]} {o["ETag"]}'
            for page in self.s3.get_paginator('list_objects_v2').paginate(Bucket=self.names.bucket)
            for o in page.get('Contents', [])
        ]
        return sorted(items), sorted(objects)


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail with a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f'condition not met within {timeout} s')
        time.sleep(interval)
