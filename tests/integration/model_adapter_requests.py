"""The requests the model adapter tests (Gemini, Bedrock, OpenAI) send through the real clients to the fakes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from om_lib.llm import Content, FunctionDeclaration, ModelRequest

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
