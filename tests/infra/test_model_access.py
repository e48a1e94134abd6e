"""Each function gets exactly the model access its roles need: Bedrock ARNs (never `*`), API-key secrets only when used.

The rule (the pure half of infra/constructs/model_access.py) is tested on plain values first; synthesised stacks then
show it in the template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.app import SettingsError, build_app, settings_from_context
from infra.constants import (
    API_FUNCTION,
    BUFFER_WORKER_FUNCTION,
    CHAT_STREAM_FUNCTION,
    ORPHAN_UPLOADS_FUNCTION,
    REFLECTION_FUNCTION,
    SWEEPER_FUNCTION,
)
from infra.constructs.model_access import Arns, ModelGrants, bedrock_resources, function_grants
from om_lib.config import OMConfig
from tests.infra.conftest import FAST, assert_nag_clean_and_listed_in_readme, synth_stack

ARNS = Arns(partition='aws', region='eu-west-1', account='111122223333')
NOVA_PROFILE = 'arn:aws:bedrock:eu-west-1:111122223333:inference-profile/eu.amazon.nova-lite-v1:0'
ALL_BEDROCK = {
    'observation': {'model': 'bedrock/eu.amazon.nova-lite-v1:0'},
    'reflection': {'model': 'bedrock/amazon.nova-pro-v1:0'},
    'actorModel': [
        {'model': 'bedrock/eu.anthropic.claude-3-7-sonnet-20250219-v1:0', 'maxRetries': 1},
        {'model': 'bedrock/amazon.nova-pro-v1:0'},
    ],
    'semanticRecall': {'topK': 2},
}


def access(document: dict[str, Any], embedding: str = 'bedrock/amazon.titan-embed-text-v2:0') -> dict[str, ModelGrants]:
    return function_grants(OMConfig.model_validate(document), ARNS, embedding_model=embedding)


# ---- the rule ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ('model_id', 'direct', 'through'),
    [
        ('amazon.nova-pro-v1:0', ['arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0'], {}),
        (
            'eu.amazon.nova-lite-v1:0',
            [NOVA_PROFILE],
            {NOVA_PROFILE: ('arn:aws:bedrock:*::foundation-model/amazon.nova-lite-v1:0',)},
        ),
        (
            NOVA_PROFILE.replace('eu-west-1', 'eu-central-1'),
            [NOVA_PROFILE.replace('eu-west-1', 'eu-central-1')],
            {
                NOVA_PROFILE.replace('eu-west-1', 'eu-central-1'): (
                    'arn:aws:bedrock:*::foundation-model/amazon.nova-lite-v1:0',
                )
            },
        ),
        (
            'arn:aws:bedrock:eu-west-1:111122223333:application-inference-profile/abc123',
            ['arn:aws:bedrock:eu-west-1:111122223333:application-inference-profile/abc123'],
            {
                'arn:aws:bedrock:eu-west-1:111122223333:application-inference-profile/abc123': (
                    'arn:aws:bedrock:*::foundation-model/*',
                )
            },
        ),
        (
            'arn:aws:bedrock:eu-west-1:111122223333:provisioned-model/xyz',
            ['arn:aws:bedrock:eu-west-1:111122223333:provisioned-model/xyz'],
            {},
        ),
    ],
    ids=['foundation-model', 'profile-id', 'profile-arn', 'application-profile', 'provisioned'],
)
def test_bedrock_model_ids_become_their_arns(model_id: str, direct: list[str], through: dict[str, Any]) -> None:
    resources, via = bedrock_resources(model_id, ARNS)
    assert list(resources) == direct
    assert via == through


def test_each_function_gets_only_the_models_its_roles_call() -> None:
    grants = access(ALL_BEDROCK)
    claude_profile = NOVA_PROFILE.replace('amazon.nova-lite', 'anthropic.claude-3-7-sonnet-20250219')
    nova_pro = 'arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0'
    titan = 'arn:aws:bedrock:eu-west-1::foundation-model/amazon.titan-embed-text-v2:0'

    api = grants[API_FUNCTION.construct_id]
    assert set(api.bedrock) == {NOVA_PROFILE, nova_pro, claude_profile, titan}  # both fallback entries
    assert set(api.bedrock_via_profile) == {NOVA_PROFILE, claude_profile}
    worker = grants[BUFFER_WORKER_FUNCTION.construct_id]
    assert set(worker.bedrock) == {NOVA_PROFILE, nova_pro, titan}  # no Actor in the background
    assert grants[REFLECTION_FUNCTION.construct_id].bedrock == (nova_pro,)  # the Reflector only
    assert grants[REFLECTION_FUNCTION.construct_id].bedrock_via_profile == {}
    assert grants[SWEEPER_FUNCTION.construct_id].empty  # it only queues work
    assert not any(grant.secrets for grant in grants.values())
    every_arn = [
        arn for g in grants.values() for arn in [*g.bedrock, *(a for t in g.bedrock_via_profile.values() for a in t)]
    ]
    assert '*' not in every_arn


def test_api_keys_are_needed_only_where_their_models_run() -> None:
    mixed = {
        'observation': {'model': 'bedrock/amazon.nova-pro-v1:0'},
        'reflection': {'model': 'google/gemini-2.5-flash'},
    }
    grants = access({**mixed, 'actorModel': 'openai/gpt-4o-mini'})
    assert grants[API_FUNCTION.construct_id].secrets == {'google', 'openai'}
    assert grants[BUFFER_WORKER_FUNCTION.construct_id].secrets == {'google'}
    assert grants[REFLECTION_FUNCTION.construct_id].secrets == {'google'}
    # Embeddings count only when semantic search is on
    assert not access({**mixed, 'actorModel': 'offline'}, embedding='openai/x')[API_FUNCTION.construct_id].secrets - {
        'google'
    }
    on = access({**mixed, 'actorModel': 'offline', 'retrieval': {'vector': True}}, embedding='openai/x')
    assert on[BUFFER_WORKER_FUNCTION.construct_id].secrets == {'google', 'openai'}


# ---- the template ------------------------------------------------------------------------------------------------


def _policy_statements(template: dict[str, Any], role_prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, resource in template['Resources'].items():
        if resource['Type'] == 'AWS::IAM::Policy' and key.startswith(role_prefix):
            out += resource['Properties']['PolicyDocument']['Statement']
    return out


def _bedrock(statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in statements if s['Action'] == 'bedrock:InvokeModel']


def _text(value: Any) -> str:
    """An ARN as the template writes it, joined, pseudo parameters named."""
    if isinstance(value, str):
        return value
    return ''.join(p if isinstance(p, str) else '{' + p['Ref'] + '}' for p in value['Fn::Join'][1])


def test_an_all_bedrock_stack_has_no_secret_and_scoped_invoke_grants(tmp_path: Path) -> None:
    # Given an all-Bedrock configuration with Titan embeddings, synthesised with cdk-nag on
    context = {
        **FAST,
        'omConfig': json.dumps(ALL_BEDROCK),
        'embeddingModel': 'bedrock/amazon.titan-embed-text-v2:0',
        'embeddingDimensions': '512',
    }
    app, stack = build_app(context, outdir=str(tmp_path))
    app.synth()  # raises on any unacknowledged cdk-nag finding
    assert_nag_clean_and_listed_in_readme(tmp_path)  # the region wildcards of the profiles' models included
    from aws_cdk.assertions import Template

    template = Template.from_stack(stack).to_json()

    # Then there is no secret, no secret variable and no secret read anywhere
    assert not [r for r in template['Resources'].values() if r['Type'] == 'AWS::SecretsManager::Secret']
    assert 'GeminiSecretArn' not in template['Outputs']
    functions = [r['Properties'] for r in template['Resources'].values() if r['Type'] == 'AWS::Lambda::Function']
    for function in functions:
        env = function['Environment']['Variables']
        assert 'OM_GEMINI_SECRET_ARN' not in env and 'OM_OPENAI_SECRET_ARN' not in env
        assert (env['OM_EMBEDDING_MODEL'], env['OM_EMBEDDING_DIMENSIONS']) == (
            'bedrock/amazon.titan-embed-text-v2:0',
            '512',
        )
    every = [
        s
        for r in template['Resources'].values()
        if r['Type'] == 'AWS::IAM::Policy'
        for s in r['Properties']['PolicyDocument']['Statement']
    ]
    assert not [s for s in every if str(s['Action']).startswith('secretsmanager')]

    # And each function may invoke exactly its models: ARNs, never `*`, foundation models of profiles only through them
    api = _bedrock(_policy_statements(template, 'ApiFunctionRole'))
    direct = [_text(arn) for s in api if 'Condition' not in s for arn in s['Resource']]
    assert direct == [
        'arn:{AWS::Partition}:bedrock:{AWS::Region}:{AWS::AccountId}:inference-profile/eu.amazon.nova-lite-v1:0',
        'arn:{AWS::Partition}:bedrock:{AWS::Region}::foundation-model/amazon.nova-pro-v1:0',
        'arn:{AWS::Partition}:bedrock:{AWS::Region}:{AWS::AccountId}:inference-profile/eu.anthropic.claude-3-7-sonnet-20250219-v1:0',
        'arn:{AWS::Partition}:bedrock:{AWS::Region}::foundation-model/amazon.titan-embed-text-v2:0',
    ]
    fenced = {
        _text(s['Resource']): _text(s['Condition']['StringEquals']['bedrock:InferenceProfileArn'])
        for s in api
        if 'Condition' in s
    }
    assert fenced == {
        'arn:{AWS::Partition}:bedrock:*::foundation-model/amazon.nova-lite-v1:0': direct[0],
        'arn:{AWS::Partition}:bedrock:*::foundation-model/anthropic.claude-3-7-sonnet-20250219-v1:0': direct[2],
    }
    reflection = _bedrock(_policy_statements(template, 'ReflectionFunctionRole'))
    assert [_text(s['Resource']) for s in reflection] == [direct[1]]
    assert _bedrock(_policy_statements(template, 'SweeperFunctionRole')) == []
    for statement in [*api, *reflection]:
        resources = statement['Resource'] if isinstance(statement['Resource'], list) else [statement['Resource']]
        assert all(_text(arn) != '*' for arn in resources)


def test_an_openai_actor_gets_its_own_secret_read_by_the_api_only() -> None:
    # Given Bedrock observing, Gemini reflecting and an OpenAI Actor behind a gateway
    config = {
        'observation': {'model': 'bedrock/amazon.nova-pro-v1:0'},
        'reflection': {'model': 'google/gemini-2.5-flash'},
        'actorModel': 'openai/gpt-4o-mini',
    }
    _stack, template = synth_stack({'omConfig': json.dumps(config), 'openaiBaseUrl': 'https://gw.example.com/v1'})
    resources = template.to_json()['Resources']
    secrets = {k.split('Secret')[0]: k for k, r in resources.items() if r['Type'] == 'AWS::SecretsManager::Secret'}
    assert set(secrets) == {'Gemini', 'OpenAI'}
    # Both are encrypted with the stack's key
    (key_id,) = [k for k, r in resources.items() if r['Type'] == 'AWS::KMS::Key']
    for secret_id in secrets.values():
        assert resources[secret_id]['Properties']['KmsKeyId'] == {'Fn::GetAtt': [key_id, 'Arn']}

    # Then only the API (the Actor) reads the OpenAI key; every function that reflects reads the Gemini key
    readers: dict[str, set[str]] = {}
    for key, r in resources.items():
        if r['Type'] != 'AWS::IAM::Policy':
            continue
        for statement in r['Properties']['PolicyDocument']['Statement']:
            if statement['Action'] == 'secretsmanager:GetSecretValue':
                readers.setdefault(statement['Resource']['Ref'], set()).add(key.split('Role')[0])
    assert readers == {
        secrets['OpenAI']: {'ApiFunction', 'ChatStreamFunction'},
        secrets['Gemini']: {'ApiFunction', 'ChatStreamFunction', 'BufferWorkerFunction', 'ReflectionFunction'},
    }
    # And each function's environment names only the keys it may read; the gateway URL goes where OpenAI is called
    for r in resources.values():
        if r['Type'] != 'AWS::Lambda::Function' or not r['Properties']['Handler'].startswith('functions.'):
            continue
        env = r['Properties']['Environment']['Variables']
        api = r['Properties']['Handler'] in (API_FUNCTION.handler, CHAT_STREAM_FUNCTION.handler)  # the Actor's
        assert env.get('OM_OPENAI_SECRET_ARN') == ({'Ref': secrets['OpenAI']} if api else None)
        assert env.get('OPENAI_BASE_URL') == ('https://gw.example.com/v1' if api else None)
        no_model = r['Properties']['Handler'] in (SWEEPER_FUNCTION.handler, ORPHAN_UPLOADS_FUNCTION.handler)
        assert env.get('OM_GEMINI_SECRET_ARN') == (None if no_model else {'Ref': secrets['Gemini']})
        assert 'OPENAI_API_KEY' not in env
    # One key-policy statement per reader, however many of the stack's secrets it reads
    (key,) = [r for r in resources.values() if r['Type'] == 'AWS::KMS::Key']
    sids = [st['Sid'] for st in key['Properties']['KeyPolicy']['Statement'] if st['Sid'].endswith('ReadsTheModelKey')]
    readers_of_gemini = ('ApiFunction', 'ChatStreamFunction', 'BufferWorkerFunction', 'ReflectionFunction')
    assert sorted(sids) == sorted(f'{function}ReadsTheModelKey' for function in readers_of_gemini)
    assert {'OpenAISecretArn', 'GeminiSecretArn'} <= set(template.to_json()['Outputs'])


@pytest.mark.parametrize(
    ('context', 'message'),
    [
        ({'embeddingModel': 'cohere/embed-v3'}, 'is not an embedder'),
        ({'embeddingModel': 'bedrock/amazon.titan-embed-text-v2:0', 'embeddingDimensions': '300'}, '256, 512, 1024'),
        ({'embeddingModel': 'bedrock/cohere.embed-english-v3'}, 'Bedrock embeddings support'),
        ({'openaiSecretArn': 'my-secret'}, 'openaiSecretArn must be a Secrets Manager ARN'),
    ],
)
def test_bad_model_context_is_refused_at_synth(context: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings_from_context(context)
