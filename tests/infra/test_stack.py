"""The synthesised template: what CONTRACT §4 and the issue promise about the deployed stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from infra.app import SettingsError, build_app, settings_from_context
from infra.constants import (
    ALL_FUNCTIONS,
    ASSET_TIKTOKEN_DIR,
    BUFFER_WORKER_FUNCTION,
    CHAT_STREAM_FUNCTION,
    LAMBDA_ARCHITECTURE,
    LAMBDA_PYTHON_VERSION,
    QUEUE_VISIBILITY_FACTOR,
    REPO_ROOT,
    STATE_MACHINE_ASL,
)
from infra.constructs import ServiceFunction
from om_lib.adapters.aws.dynamodb import schema
from om_lib.errors import ConfigError
from tests.infra.conftest import FAST, Resources, of_type, synth_stack


def _ref(resources: Resources, kind: str, path: str) -> str:
    """The logical id of the one `kind` resource at construct path `path` (logical id = path + 8 hex digits)."""
    matches = [key for key, r in resources.items() if r['Type'] == kind and re.fullmatch(path + '[0-9A-F]{8}', key)]
    assert len(matches) == 1, (kind, path, matches)
    return matches[0]


def _statements(resources: Resources) -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = []
    for resource in resources.values():
        props = resource.get('Properties', {})
        if resource['Type'] in {'AWS::IAM::Policy', 'AWS::IAM::ManagedPolicy'}:
            statements += props['PolicyDocument']['Statement']
        if resource['Type'] == 'AWS::IAM::Role':
            for policy in props.get('Policies', []):
                statements += policy['PolicyDocument']['Statement']
    return statements


def _functions(resources: Resources) -> dict[str, dict[str, Any]]:
    return of_type(resources, 'AWS::Lambda::Function')


# ---- storage -----------------------------------------------------------------------------------------------------


def test_table_has_pitr_encryption_ttl_and_the_schema_indexes(template: Any, resources: Resources) -> None:
    # Given the schema the store uses, when the stack is synthesised, then the table is exactly that schema
    template.resource_count_is('AWS::DynamoDB::GlobalTable', 1)
    template.has_resource_properties(
        'AWS::DynamoDB::GlobalTable',
        {
            'KeySchema': schema.KEY_SCHEMA,
            'BillingMode': 'PAY_PER_REQUEST',
            'SSESpecification': {'SSEEnabled': True, 'SSEType': 'KMS'},
            'TimeToLiveSpecification': {'AttributeName': schema.TTL_ATTRIBUTE, 'Enabled': True},
            'LocalSecondaryIndexes': schema.LOCAL_SECONDARY_INDEXES,
            'GlobalSecondaryIndexes': schema.GLOBAL_SECONDARY_INDEXES,
            'Replicas': [
                Match.object_like(
                    {'PointInTimeRecoverySpecification': {'PointInTimeRecoveryEnabled': True}},
                )
            ],
        },
    )
    template.has_resource('AWS::DynamoDB::GlobalTable', {'DeletionPolicy': 'Retain', 'UpdateReplacePolicy': 'Retain'})
    (table,) = of_type(resources, 'AWS::DynamoDB::GlobalTable').values()
    as_set = {(d['AttributeName'], d['AttributeType']) for d in table['AttributeDefinitions']}
    assert as_set == {(d['AttributeName'], d['AttributeType']) for d in schema.ATTRIBUTE_DEFINITIONS}


def test_bucket_is_private_encrypted_tls_only_with_lifecycle_rules(template: Any, resources: Resources) -> None:
    key = _ref(resources, 'AWS::KMS::Key', 'MemoryKey')
    template.has_resource_properties(
        'AWS::S3::Bucket',
        {
            'PublicAccessBlockConfiguration': {
                'BlockPublicAcls': True,
                'BlockPublicPolicy': True,
                'IgnorePublicAcls': True,
                'RestrictPublicBuckets': True,
            },
            'BucketEncryption': {
                'ServerSideEncryptionConfiguration': [
                    {
                        'BucketKeyEnabled': True,
                        'ServerSideEncryptionByDefault': {
                            'SSEAlgorithm': 'aws:kms',
                            'KMSMasterKeyID': {'Fn::GetAtt': [key, 'Arn']},
                        },
                    }
                ]
            },
            'LifecycleConfiguration': {
                'Rules': Match.array_with(
                    [Match.object_like({'AbortIncompleteMultipartUpload': {'DaysAfterInitiation': 1}})]
                )
            },
        },
    )
    (policy,) = of_type(resources, 'AWS::S3::BucketPolicy').values()
    assert any(
        s['Effect'] == 'Deny' and s['Condition'] == {'Bool': {'aws:SecureTransport': 'false'}}
        for s in policy['PolicyDocument']['Statement']
    )


# ---- work queue --------------------------------------------------------------------------------------------------


def test_work_queue_is_encrypted_fifo_with_a_dead_letter_queue(resources: Resources) -> None:
    queues = of_type(resources, 'AWS::SQS::Queue')
    # The work queue, the upload events' queue, a dead-letter queue for each, and the lifecycle bus's dead letters.
    assert len(queues) == 5
    dlq_id = _ref(resources, 'AWS::SQS::Queue', 'WorkQueueDeadLetterQueue')
    work = queues[_ref(resources, 'AWS::SQS::Queue', 'WorkQueue')]
    assert work['FifoQueue'] is True and queues[dlq_id]['FifoQueue'] is True
    assert work['RedrivePolicy'] == {'deadLetterTargetArn': {'Fn::GetAtt': [dlq_id, 'Arn']}, 'maxReceiveCount': 10}
    key = _ref(resources, 'AWS::KMS::Key', 'MemoryKey')
    assert all(q['KmsMasterKeyId'] == {'Fn::GetAtt': [key, 'Arn']} for q in queues.values())
    worker_timeout = next(f for f in ALL_FUNCTIONS if f.construct_id == 'BufferWorkerFunction').timeout_s
    assert work['VisibilityTimeout'] >= QUEUE_VISIBILITY_FACTOR * worker_timeout
    for policy in of_type(resources, 'AWS::SQS::QueuePolicy').values():  # TLS only
        assert policy['PolicyDocument']['Statement'][0]['Condition'] == {'Bool': {'aws:SecureTransport': 'false'}}


def test_buffer_worker_alias_consumes_the_queue_reporting_batch_item_failures(resources: Resources) -> None:
    work_queue = _ref(resources, 'AWS::SQS::Queue', 'WorkQueue')
    (mapping,) = [
        m
        for m in of_type(resources, 'AWS::Lambda::EventSourceMapping').values()
        if m['EventSourceArn'] == {'Fn::GetAtt': [work_queue, 'Arn']}
    ]
    assert mapping['FunctionResponseTypes'] == ['ReportBatchItemFailures']
    assert mapping['EventSourceArn'] == {'Fn::GetAtt': [_ref(resources, 'AWS::SQS::Queue', 'WorkQueue'), 'Arn']}
    # Through the alias (SnapStart runs published versions only).
    assert json.dumps(mapping['FunctionName']).endswith('":live"]]}')
    assert _ref(resources, 'AWS::Lambda::Alias', 'BufferWorkerFunctionAlias') in json.dumps(mapping['FunctionName'])


# ---- workflow and schedule -------------------------------------------------------------------------------------------


def test_state_machine_is_the_shared_asl_document_with_the_reflection_alias(resources: Resources) -> None:
    (machine,) = of_type(resources, 'AWS::StepFunctions::StateMachine').values()
    definition = json.loads(machine['DefinitionString'])
    assert definition == json.loads(STATE_MACHINE_ASL.read_text(encoding='utf-8'))
    for task in ('Check', 'Reflect', 'Validate', 'Commit'):
        assert definition['States'][task]['Parameters']['FunctionName'] == '${ReflectionFunctionArn}'
    alias = _ref(resources, 'AWS::Lambda::Alias', 'ReflectionFunctionAlias')
    assert machine['DefinitionSubstitutions'] == {'ReflectionFunctionArn': {'Ref': alias}}
    assert machine['LoggingConfiguration']['Level'] == 'ALL'
    assert machine['TracingConfiguration'] == {'Enabled': True}


def test_schedule_runs_the_sweeper_alias(resources: Resources) -> None:
    (schedule,) = of_type(resources, 'AWS::Scheduler::Schedule').values()
    assert schedule['ScheduleExpression'].startswith('rate(')
    assert schedule['State'] == 'ENABLED'
    assert schedule['Target']['Arn'] == {'Ref': _ref(resources, 'AWS::Lambda::Alias', 'SweeperFunctionAlias')}


# ---- alarms ------------------------------------------------------------------------------------------------------


def test_alarms_watch_the_dead_letter_queue_and_every_function(resources: Resources) -> None:
    alarms = list(of_type(resources, 'AWS::CloudWatch::Alarm').values())
    dlq = _ref(resources, 'AWS::SQS::Queue', 'WorkQueueDeadLetterQueue')
    assert any(
        a.get('MetricName') == 'ApproximateNumberOfMessagesVisible'
        and {'Name': 'QueueName', 'Value': {'Fn::GetAtt': [dlq, 'QueueName']}} in a['Dimensions']
        for a in alarms
    )
    watched = {d['Value']['Ref'] for a in alarms if a.get('MetricName') == 'Errors' for d in a['Dimensions']}
    assert watched == set(_functions(resources))
    assert all(a['AlarmActions'] for a in alarms)


# ---- API ---------------------------------------------------------------------------------------------------------


def test_api_is_throttled_and_logs_without_bodies(resources: Resources) -> None:
    (stage,) = of_type(resources, 'AWS::ApiGateway::Stage').values()
    (settings,) = stage['MethodSettings']
    assert settings['ThrottlingRateLimit'] > 0 and settings['ThrottlingBurstLimit'] > 0
    assert settings['DataTraceEnabled'] is False
    assert 'AccessLogSetting' in stage


def test_gateway_responses_use_the_error_shape_and_json(resources: Resources) -> None:
    responses = {r['ResponseType']: r for r in of_type(resources, 'AWS::ApiGateway::GatewayResponse').values()}
    required = {'DEFAULT_4XX', 'DEFAULT_5XX', 'UNAUTHORIZED', 'ACCESS_DENIED', 'THROTTLED', 'REQUEST_TOO_LARGE'}
    assert required <= set(responses)
    for kind, response in responses.items():
        assert response['ResponseParameters'] == {
            'gatewayresponse.header.Content-Type': "'application/json'",
            'gatewayresponse.header.X-Content-Type-Options': "'nosniff'",
        }, kind
        template = response['ResponseTemplates']['application/json']
        # Render the template as API Gateway would (messageString is a quoted JSON string).
        body = json.loads(template.replace('$context.error.messageString', '"Too Many Requests"'))
        assert set(body) == {'error'} and set(body['error']) == {'code', 'message', 'details'}, kind
        assert body['error']['code'].islower() and body['error']['details'] == [], kind
    assert responses['THROTTLED']['StatusCode'] == '429'
    assert responses['REQUEST_TOO_LARGE']['StatusCode'] == '413'
    # IAM mode: a request without a SigV4 signature is "unauthenticated", not a missing route.
    assert responses['MISSING_AUTHENTICATION_TOKEN']['StatusCode'] == '401'


def test_every_method_requires_iam_by_default(resources: Resources) -> None:
    methods = of_type(resources, 'AWS::ApiGateway::Method')
    api = _ref(resources, 'AWS::Lambda::Alias', 'ApiFunctionAlias')
    stream = _ref(resources, 'AWS::Lambda::Alias', 'ChatStreamFunctionAlias')
    streamed = {key for key, m in methods.items() if stream in json.dumps(m['Integration']['Uri'])}
    # Every route goes to the API function, but POST on the two chat routes, which stream from their own function
    assert len(streamed) == 2 and all(methods[key]['HttpMethod'] == 'POST' for key in streamed)
    for key, method in methods.items():
        assert method['AuthorizationType'] == 'AWS_IAM'
        assert method['Integration']['Type'] == 'AWS_PROXY'
        assert (stream if key in streamed else api) in json.dumps(method['Integration']['Uri'])
    assert all(f['Environment']['Variables']['OM_AUTH_MODE'] == 'iam' for f in _functions(resources).values())


def test_the_inspector_page_is_served_only_when_asked_for_and_behind_the_same_auth(
    resources: Resources, variant: Resources
) -> None:
    # By default no function serves GET /inspector
    env = lambda f: f.get('Environment', {}).get('Variables', {})  # noqa: E731 - custom resources have none
    assert not any('OM_INSPECTOR' in env(f) for f in _functions(resources).values())
    # With -c inspector=true only the API function does, and every method still requires IAM (the page and its files
    # go through the same proxy methods as every route)
    serving = [key for key, f in _functions(variant).items() if env(f).get('OM_INSPECTOR') == 'true']
    assert serving == [_ref(variant, 'AWS::Lambda::Function', 'ApiFunction')]
    methods = [m for m in of_type(variant, 'AWS::ApiGateway::Method').values() if m['HttpMethod'] != 'OPTIONS']
    assert methods and all(m['AuthorizationType'] == 'AWS_IAM' for m in methods)
    with pytest.raises(SettingsError, match='inspector must be true or false'):
        settings_from_context({'inspector': 'maybe'})


def test_allowed_origins_reach_the_api_function_and_get_preflights_at_the_gateway(
    resources: Resources, variant: Resources
) -> None:
    env = lambda f: f.get('Environment', {}).get('Variables', {})  # noqa: E731 - custom resources have none
    # By default: no origin but the API's own may write, and nothing answers a preflight
    assert not any('OM_ALLOWED_ORIGINS' in env(f) for f in _functions(resources).values())
    assert not [m for m in of_type(resources, 'AWS::ApiGateway::Method').values() if m['HttpMethod'] == 'OPTIONS']
    # With -c allowedOrigins=...: the two functions behind the API (only) get the list ...
    allowing = {
        key: env(f)['OM_ALLOWED_ORIGINS'] for key, f in _functions(variant).items() if 'OM_ALLOWED_ORIGINS' in env(f)
    }
    origins = 'https://app.example.com,http://localhost:5173'
    assert allowing == {
        _ref(variant, 'AWS::Lambda::Function', 'ApiFunction'): origins,
        _ref(variant, 'AWS::Lambda::Function', 'ChatStreamFunction'): origins,
    }
    # ... and the gateway answers the preflights of exactly those origins, on every path, with no credentials needed
    preflights = [m for m in of_type(variant, 'AWS::ApiGateway::Method').values() if m['HttpMethod'] == 'OPTIONS']
    resources_ = of_type(variant, 'AWS::ApiGateway::Resource')
    assert len(preflights) == 1 + len(resources_)  # the root and every resource under it
    for method in preflights:
        assert method['AuthorizationType'] == 'NONE' and method['ApiKeyRequired'] is False
        assert method['Integration']['Type'] == 'MOCK'
        text = json.dumps(method['Integration'])
        assert 'https://app.example.com' in text and 'http://localhost:5173' in text and '*' not in text
    for bad in ('*', 'app.example.com', 'https://app.example.com/path'):
        with pytest.raises(SettingsError, match='allowedOrigins'):
            settings_from_context({'allowedOrigins': bad})


def test_jwt_mode_uses_a_cognito_authorizer_and_passes_the_claim() -> None:
    _stack, template = synth_stack(
        {
            'authMode': 'jwt',
            'jwtIssuer': 'https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_AbC123',
            'authClaim': 'custom:tenant',
        }
    )
    resources = template.to_json()['Resources']
    (authorizer,) = of_type(resources, 'AWS::ApiGateway::Authorizer').values()
    assert authorizer['Type'] == 'COGNITO_USER_POOLS'
    assert authorizer['IdentitySource'] == 'method.request.header.Authorization'
    assert 'cognito-idp:eu-west-1:' in json.dumps(authorizer['ProviderARNs'])
    assert 'userpool/eu-west-1_AbC123' in json.dumps(authorizer['ProviderARNs'])
    for method in of_type(resources, 'AWS::ApiGateway::Method').values():
        assert method['AuthorizationType'] == 'COGNITO_USER_POOLS'
    for function in _functions(resources).values():
        assert function['Environment']['Variables']['OM_AUTH_MODE'] == 'jwt'
        assert function['Environment']['Variables']['OM_AUTH_CLAIM'] == 'custom:tenant'


def test_jwt_mode_takes_a_user_pool_id() -> None:
    auth = settings_from_context({'authMode': 'jwt', 'userPoolId': 'us-east-1_Xyz789'}).auth
    assert (auth.mode, auth.claim, auth.user_pool_id) == ('jwt', 'sub', 'us-east-1_Xyz789')


def test_jwt_mode_without_a_user_pool_is_refused() -> None:
    with pytest.raises(SettingsError, match='userPoolId'):
        settings_from_context({'authMode': 'jwt'})
    with pytest.raises(SettingsError, match='Cognito'):
        settings_from_context({'authMode': 'jwt', 'jwtIssuer': 'https://login.example.com/'})


def test_no_authentication_only_when_asked_for() -> None:
    # Given no auth context, then IAM (never NONE); given authMode=none explicitly, then no authorizer, with a warning.
    assert settings_from_context({}).auth.mode == 'iam'
    stack, template = synth_stack({'authMode': 'none'})
    for method in of_type(template.to_json()['Resources'], 'AWS::ApiGateway::Method').values():
        assert method['AuthorizationType'] == 'NONE'
    warnings = [
        entry.data
        for child in [stack, *stack.node.find_all()]
        for entry in child.node.metadata
        if entry.type == 'aws:cdk:warning'
    ]
    assert any('authMode=none' in str(w) for w in warnings)
    with pytest.raises(SettingsError, match='authMode'):
        settings_from_context({'authMode': 'off'})


# ---- IAM and secrets ---------------------------------------------------------------------------------------------


def test_no_policy_statement_has_a_wildcard_action(resources: Resources) -> None:
    statements = _statements(resources)
    assert statements
    for statement in statements:
        actions = statement['Action'] if isinstance(statement['Action'], list) else [statement['Action']]
        for action in actions:
            assert '*' not in action, statement


def test_each_function_has_its_own_role_without_managed_policies(resources: Resources) -> None:
    roles = {json.dumps(f['Role']) for f in _functions(resources).values()}
    assert len(roles) == len(ALL_FUNCTIONS)
    for key in _functions(resources):
        role = resources[key]['Properties']['Role']['Fn::GetAtt'][0]
        assert 'ManagedPolicyArns' not in resources[role]['Properties']


def test_gemini_key_is_a_secret_referenced_by_arn(resources: Resources) -> None:
    # Given the default configuration (Gemini models), the secret is created; only the functions that call a model
    # get its ARN and may read it.
    (secret_id,) = of_type(resources, 'AWS::SecretsManager::Secret')
    secret = resources[secret_id]['Properties']
    assert 'SecretString' not in secret and 'GenerateSecretString' in secret
    callers = {spec.handler for spec in ALL_FUNCTIONS if spec.access.model_roles}
    for function in _functions(resources).values():
        env = function['Environment']['Variables']
        assert env.get('OM_GEMINI_SECRET_ARN') == ({'Ref': secret_id} if function['Handler'] in callers else None)
        assert not {'GEMINI_API_KEY', 'GOOGLE_API_KEY'} & set(env)
    readers = [s for s in _statements(resources) if s['Action'] == 'secretsmanager:GetSecretValue']
    assert len(readers) == len(callers) == 4  # the API, the chat stream, the buffer worker, the reflection tasks
    assert all(s['Resource'] == {'Ref': secret_id} for s in readers)


def test_an_existing_secret_can_be_imported_by_arn() -> None:
    arn = 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:om/gemini-AbCdEf'
    _stack, template = synth_stack({'geminiSecretArn': arn})
    resources = template.to_json()['Resources']
    assert not of_type(resources, 'AWS::SecretsManager::Secret')
    envs = [f['Environment']['Variables'] for f in _functions(resources).values()]
    assert sorted(env.get('OM_GEMINI_SECRET_ARN', '') for env in envs) == ['', '', arn, arn, arn, arn]
    readers = [s for s in _statements(resources) if s['Action'] == 'secretsmanager:GetSecretValue']
    assert {s['Resource'] for s in readers} == {arn}


# ---- functions ---------------------------------------------------------------------------------------------------


def test_functions_share_runtime_architecture_json_logs_and_snapstart(resources: Resources) -> None:
    functions = _functions(resources)
    assert {f['Handler'] for f in functions.values()} == {spec.handler for spec in ALL_FUNCTIONS}
    by_handler = {f['Handler']: f for f in functions.values()}
    for spec in ALL_FUNCTIONS:
        function = by_handler[spec.handler]
        assert function['Runtime'] == f'python{LAMBDA_PYTHON_VERSION}'
        assert function['Architectures'] == [LAMBDA_ARCHITECTURE]
        # SnapStart restores the managed runtime's init; the chat stream runs a runtime of its own (starts cold)
        snap = None if spec is CHAT_STREAM_FUNCTION else {'ApplyOn': 'PublishedVersions'}
        assert function.get('SnapStart') == snap
        assert function['LoggingConfig']['LogFormat'] == 'JSON'
        assert (function['MemorySize'], function['Timeout']) == (spec.memory_mb, spec.timeout_s)
        module = spec.handler.rsplit('.', 1)[0]
        assert (REPO_ROOT / (module.replace('.', '/') + '.py')).is_file(), module
    assert len(of_type(resources, 'AWS::Lambda::Alias')) == len(ALL_FUNCTIONS)
    assert ServiceFunction.RUNTIME.name == f'python{LAMBDA_PYTHON_VERSION}'


def test_function_environment_carries_the_validated_config_and_the_tokenizer_cache(resources: Resources) -> None:
    for function in _functions(resources).values():
        env = function['Environment']['Variables']
        assert json.loads(env['OM_CONFIG']) == {}
        assert env['TIKTOKEN_CACHE_DIR'] == f'/var/task/{ASSET_TIKTOKEN_DIR}'
        expected = {'OM_TABLE_NAME', 'OM_BUCKET_NAME', 'OM_WORK_QUEUE_URL', 'OM_REFLECTION_STATE_MACHINE_ARN'}
        assert expected <= set(env)
        assert {'POWERTOOLS_SERVICE_NAME', 'POWERTOOLS_METRICS_NAMESPACE', 'OM_REQUEST_TIME_BUDGET_S'} <= set(env)


def test_config_context_reaches_the_functions() -> None:
    document = {'model': 'default', 'observation': {'messageTokens': 20000}}
    _stack, template = synth_stack({'omConfig': json.dumps(document)})
    for function in _functions(template.to_json()['Resources']).values():
        assert json.loads(function['Environment']['Variables']['OM_CONFIG']) == document


# ---- configuration validated at synth ------------------------------------------------------------------------------


def test_invalid_config_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r'observation\.messageTokens'):
        settings_from_context({'omConfig': '{"observation": {"messageTokens": "lots"}}'})
    with pytest.raises(ConfigError, match='observaton'):
        build_app({**FAST, 'omConfig': '{"observaton": {}}'})
    with pytest.raises(ConfigError, match='not valid JSON'):
        settings_from_context({'omConfig': '{observation'})


def test_invalid_config_fails_python_infra_app(tmp_path: Path) -> None:
    # The script itself: non-zero exit, the field named on stderr, nothing synthesised.
    env = {**os.environ, 'CDK_OUTDIR': str(tmp_path / 'out')}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / 'infra' / 'app.py'),
            '-c',
            'omAssetMode=source',
            '-c',
            'omConfig={"observation": {"bufferTokens": "x"}}',
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert 'observation.bufferTokens' in result.stderr
    assert not (tmp_path / 'out' / 'manifest.json').exists()


# ---- outputs and cdk-nag -----------------------------------------------------------------------------------------


def test_outputs_have_fixed_ids(template: Any) -> None:
    outputs = template.to_json()['Outputs']
    for name in (
        'ApiUrl',
        'TableName',
        'BucketName',
        'WorkQueueUrl',
        'DeadLetterQueueUrl',
        'ReflectionStateMachineArn',
        'GeminiSecretArn',
    ):
        assert name in outputs


def test_the_local_stack_gives_its_worker_the_deployed_timeout():
    # A job's deadline is what is left of the worker's invocation, so a shorter local timeout would fail jobs that
    # succeed when deployed (and the other way round).
    from om_cli.local_stack import BUFFER_WORKER_TIMEOUT_S

    assert BUFFER_WORKER_TIMEOUT_S == BUFFER_WORKER_FUNCTION.timeout_s
