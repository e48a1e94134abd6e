"""What the model adapter tests (Gemini, Bedrock, OpenAI) share: the requests they send through the real clients, and
the fake each client is pointed at."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from om_lib.llm import Content, FunctionDeclaration, ModelRequest
from tests.fakes.loopback import LoopbackServer
from tests.fakes.model_guard import loopback_only

Fake = TypeVar('Fake', bound=LoopbackServer[Any, Any])

PNG = b'\x89PNG\r\n\x1a\nfake-image-bytes'
RECALL = FunctionDeclaration(
    name='recall',
    description='Look up older messages.',
    parameters={'type': 'object', 'properties': {'query': {'type': 'string'}}, 'required': ['query']},
)
OBSERVER_REQUEST = ModelRequest(
    purpose='observer',
    system='You are the memory consciousness.',
    contents=(Content('user', ('Observe these messages.',)),),
)
ACTOR_REQUEST = ModelRequest(
    purpose='actor', system='You are a helpful assistant.', contents=(Content('user', ('Hello there.',)),)
)


def request(**overrides: Any) -> ModelRequest:
    """An observer request, with `overrides`."""
    return replace(OBSERVER_REQUEST, **overrides)


def actor_request(**overrides: Any) -> ModelRequest:
    """An actor request, with `overrides`."""
    return replace(ACTOR_REQUEST, **overrides)


@contextmanager
def serving(fake: Fake, env: Callable[[Fake], Mapping[str, str]], monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    """`fake` started (no request may leave the machine meanwhile), its client configured the way production is: by
    the client's own environment variables, `env(fake)`."""
    with loopback_only(), fake:
        for name, value in env(fake).items():
            monkeypatch.setenv(name, value)
        yield fake
