"""Least privilege, the customer-managed key and data protection (issue 19, points 1-3), read from the template."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from infra.constants import (
    ALL_FUNCTIONS,
    API_FUNCTION,
    BUCKET_NONCURRENT_EXPIRY_DAYS,
    BUFFER_WORKER_FUNCTION,
    KMS_ADMIN_ACTIONS,
    REFLECTION_FUNCTION,
    SWEEPER_FUNCTION,
    XRAY_ACTIONS,
    FunctionSpec,
)
from infra.constructs.model_access import configured_models, providers_for
from om_lib.config import OMConfig
from tests.infra.conftest import Resources, as_list, of_type, role_of, role_statements

USE_ACTIONS = {'kms:Decrypt', 'kms:Encrypt', 'kms:GenerateDataKey', 'kms:CreateGrant', 'kms:ReEncryptFrom'}


def _one(resources: Resources, kind: str) -> str:
    (key,) = of_type(resources, kind)
    return key


def _allowed(resources: Resources, spec: FunctionSpec) -> set[str]:
    return {
        action
        for s in role_statements(resources, role_of(resources, spec))
        if s['Effect'] == 'Allow'
        for action in as_list(s['Action'])
    }


def _key_statements(resources: Resources) -> list[dict[str, Any]]:
    (key,) = of_type(resources, 'AWS::KMS::Key').values()
    return list(key['KeyPolicy']['Statement'])


def _principal_is_role(statement: dict[str, Any], role: str) -> bool:
    return statement['Principal'].get('AWS') == {'Fn::GetAtt': [role, 'Arn']}


def _via(statement: dict[str, Any]) -> set[str]:
    """The services of a key statement's kms:ViaService condition (`dynamodb`, `s3`, ...)."""
    values = statement.get('Condition', {}).get('StringEquals', {}).get('kms:ViaService', [])
    # Each value is `{"Fn::Join": ["", ["<service>.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]}`.
    return {(v['Fn::Join'][1][0] if isinstance(v, dict) else v).split('.')[0] for v in values}


def _all_policy_statements(resources: Resources) -> Iterable[tuple[str, dict[str, Any]]]:
    """Every statement of every IAM and resource policy in the template, with its resource's logical id."""
    for key, resource in resources.items():
        props = resource.get('Properties', {})
        documents = [props.get('PolicyDocument'), props.get('KeyPolicy'), props.get('AssumeRolePolicyDocument')]
        documents += [p['PolicyDocument'] for p in props.get('Policies', [])]
        for document in documents:
            for statement in (document or {}).get('Statement', []):
                yield key, statement


# ---- 1. one role per function, only its own actions ----------------------------------------------------------------


def test_each_function_role_grants_exactly_its_declared_access(resources: Resources) -> None:
    # Given each function's FunctionAccess, its role allows those actions (plus its logs, tracing and key use through
    # services, which the key policy carries) and nothing else.
    for spec in ALL_FUNCTIONS:
        access = spec.access
        expected = {'logs:CreateLogStream', 'logs:PutLogEvents', *XRAY_ACTIONS, *access.table_actions}
        expected |= set(access.object_actions) | ({'s3:ListBucket'} if access.lists_bucket else set())
        expected |= {'sqs:SendMessage'} if access.sends_jobs else set()
        expected |= {'states:StartExecution'} if access.starts_reflections else set()
        expected |= {'events:PutEvents'} if access.publishes_events else set()
        expected |= {'secretsmanager:GetSecretValue'} if access.model_roles else set()
        if access.consumes_jobs or access.consumes_upload_events:  # the event source mapping's own grant
            expected |= {'sqs:ReceiveMessage', 'sqs:ChangeMessageVisibility', 'sqs:GetQueueUrl', 'sqs:DeleteMessage'}
            expected |= {'sqs:GetQueueAttributes', 'kms:Decrypt'}
        assert _allowed(resources, spec) == expected, spec.construct_id


def test_the_sweeper_cannot_read_the_model_key_nor_write_the_bucket(resources: Resources) -> None:
    allowed = _allowed(resources, SWEEPER_FUNCTION)
    assert 'secretsmanager:GetSecretValue' not in allowed
    assert not {'s3:PutObject', 's3:DeleteObject', 's3:ListBucket'} & allowed
    assert not {'dynamodb:PutItem', 'dynamodb:DeleteItem', 'dynamodb:BatchWriteItem'} & allowed
    sweeper = role_of(resources, SWEEPER_FUNCTION)
    key_use = [s for s in _key_statements(resources) if _principal_is_role(s, sweeper)]
    assert not any('secretsmanager' in _via(s) for s in key_use)
    (bucket_use,) = [s for s in key_use if _via(s) == {'s3'}]
    assert as_list(bucket_use['Action']) == ['kms:Decrypt']  # reads objects, never encrypts one
    env = next(
        f['Environment']['Variables']
        for f in of_type(resources, 'AWS::Lambda::Function').values()
        if f['Handler'] == SWEEPER_FUNCTION.handler
    )
    assert 'OM_GEMINI_SECRET_ARN' not in env


def test_only_the_api_and_the_workers_send_jobs_and_only_the_api_erases(resources: Resources) -> None:
    reflection = _allowed(resources, REFLECTION_FUNCTION)
    assert not {'sqs:SendMessage', 'states:StartExecution', 'dynamodb:DeleteItem', 's3:ListBucket'} & reflection
    assert 's3:ListBucket' in _allowed(resources, API_FUNCTION)
    assert 's3:ListBucket' not in _allowed(resources, BUFFER_WORKER_FUNCTION)


def test_table_grants_name_each_index_and_the_attention_index_is_the_sweepers(resources: Resources) -> None:
    table = _one(resources, 'AWS::DynamoDB::GlobalTable')
    for spec in ALL_FUNCTIONS:
        (grant,) = [
            s for s in role_statements(resources, role_of(resources, spec)) if 'dynamodb:GetItem' in s['Action']
        ]
        granted = as_list(grant['Resource'])
        indexes = {json.dumps(r).rsplit('/index/', 1)[1].split('"')[0] for r in granted[1:]}
        assert granted[0] == {'Fn::GetAtt': [table, 'Arn']}
        assert indexes == set(spec.access.indexes), spec.construct_id
        assert ('GSI2' in indexes) == (spec is SWEEPER_FUNCTION)


def test_no_policy_statement_allows_a_wildcard_action_and_star_resources_are_only_tracing(
    resources: Resources,
) -> None:
    # IAM policies, the key policy, bucket/queue/topic policies: no Allow with `*` in an action. (The TLS-only
    # statements are Denies on `s3:*`/`sqs:*`, which is how a deny of everything is written.)
    checked = 0
    for key, statement in _all_policy_statements(resources):
        if statement['Effect'] != 'Allow':
            continue
        checked += 1
        for action in as_list(statement['Action']):
            assert '*' not in action, (key, statement)
    assert checked > 20
    for spec in ALL_FUNCTIONS:
        for statement in role_statements(resources, role_of(resources, spec)):
            if statement['Resource'] == '*':
                assert set(as_list(statement['Action'])) == set(XRAY_ACTIONS), (spec.construct_id, statement)


def test_model_grants_follow_the_configured_providers() -> None:
    # Given a configuration whose Reflector runs offline, the reflection function (it only reflects) cannot read the
    # Gemini key, while the API and the buffer worker (Observer on Gemini) can.
    document = {'observation': {'model': 'google/gemini-2.5-flash'}, 'reflection': {'model': 'offline'}}
    models = configured_models(OMConfig.model_validate(document))
    assert providers_for(REFLECTION_FUNCTION.access.model_roles, models) == {'offline'}
    assert providers_for(BUFFER_WORKER_FUNCTION.access.model_roles, models) == {'google', 'offline'}
    assert providers_for(SWEEPER_FUNCTION.access.model_roles, models) == frozenset()
    with pytest.raises(ValueError, match='unknown model roles'):
        providers_for(['narrator'], models)
    # Semantic search adds the embedder (Gemini by default) to the roles that embed.
    semantic = configured_models(OMConfig.model_validate({'model': 'offline', 'retrieval': {'vector': True}}))
    assert {ref.provider for ref in semantic['embedder']} == {'google'}
    assert providers_for(['observer', 'reflector'], semantic) == {'offline'}


def test_an_offline_only_configuration_creates_no_secret_and_grants_none(variant: Resources) -> None:
    # The variant stack runs every role offline (see conftest): nothing calls Gemini, so there is no secret at all.
    assert not of_type(variant, 'AWS::SecretsManager::Secret')
    ours = [f for f in of_type(variant, 'AWS::Lambda::Function').values() if f['Handler'].startswith('functions.')]
    assert len(ours) == len(ALL_FUNCTIONS)
    for function in ours:
        assert 'OM_GEMINI_SECRET_ARN' not in function['Environment']['Variables']
    assert not [
        s for _, s in _all_policy_statements(variant) if 'secretsmanager:GetSecretValue' in as_list(s['Action'])
    ]


# ---- 2. the customer-managed key ---------------------------------------------------------------------------------


def test_one_customer_managed_key_with_rotation_encrypts_everything_stored(template: Any, resources: Resources) -> None:
    key = _one(resources, 'AWS::KMS::Key')
    arn = {'Fn::GetAtt': [key, 'Arn']}
    template.has_resource('AWS::KMS::Key', {'DeletionPolicy': 'Retain', 'UpdateReplacePolicy': 'Retain'})
    assert resources[key]['Properties']['EnableKeyRotation'] is True
    (table,) = of_type(resources, 'AWS::DynamoDB::GlobalTable').values()
    assert table['SSESpecification'] == {'SSEEnabled': True, 'SSEType': 'KMS'}
    assert table['Replicas'][0]['SSESpecification'] == {'KMSMasterKeyId': arn}
    (bucket,) = of_type(resources, 'AWS::S3::Bucket').values()
    (rule,) = bucket['BucketEncryption']['ServerSideEncryptionConfiguration']
    assert rule['ServerSideEncryptionByDefault'] == {'SSEAlgorithm': 'aws:kms', 'KMSMasterKeyID': arn}
    queues = of_type(resources, 'AWS::SQS::Queue')
    # The work queue, the upload events' queue, a dead-letter queue for each, and the lifecycle bus's dead letters.
    assert len(queues) == 5 and all(q['KmsMasterKeyId'] == arn for q in queues.values())
    (bus,) = of_type(resources, 'AWS::Events::EventBus').values()
    assert bus['KmsKeyIdentifier'] == arn
    log_groups = of_type(resources, 'AWS::Logs::LogGroup')
    # Six functions, the state machine's logs and the API's access logs.
    assert len(log_groups) == 8 and all(g['KmsKeyId'] == arn for g in log_groups.values())
    (topic,) = of_type(resources, 'AWS::SNS::Topic').values()
    assert topic['KmsMasterKeyId'] == arn
    (secret,) = of_type(resources, 'AWS::SecretsManager::Secret').values()
    assert secret['KmsKeyId'] == arn


def test_the_key_policy_lets_only_the_stacks_roles_and_cloudwatch_use_the_key(resources: Resources) -> None:
    statements = _key_statements(resources)
    roles = {role_of(resources, spec): spec for spec in ALL_FUNCTIONS}
    for statement in statements:
        actions = set(as_list(statement['Action']))
        principal = statement['Principal']
        assert statement['Effect'] == 'Allow' and principal != '*' and principal.get('AWS') != '*', statement
        if statement['Sid'] == 'Administration':
            assert ':root' in json.dumps(principal) and actions == set(KMS_ADMIN_ACTIONS)
            assert not actions & USE_ACTIONS  # administering the key is not using it
            continue
        service = principal.get('Service')
        if service is not None:
            assert service in ('cloudwatch.amazonaws.com', 'events.amazonaws.com') or 'logs.' in json.dumps(service)
            if 'logs.' in json.dumps(service):
                assert 'kms:EncryptionContext:aws:logs:arn' in json.dumps(statement['Condition'])
            if service == 'events.amazonaws.com' and actions == {'kms:DescribeKey'}:  # checking the bus's key
                assert statement['Condition'] == {'StringEquals': {'aws:SourceAccount': {'Ref': 'AWS::AccountId'}}}
            elif service == 'events.amazonaws.com':  # the upload rule's queue, the lifecycle bus and its dead letters
                assert actions == {'kms:Decrypt', 'kms:GenerateDataKey'}, statement
                source = json.dumps(statement['Condition']['ArnEquals']['aws:SourceArn'])
                rule = ':rule/' in source and '-orphan-uploads' in source
                assert rule or ':event-bus/' in source and '-lifecycle' in source, statement
            continue
        # A role: one of the functions' (through its services only), or the deployment role (DynamoDB and
        # Secrets Manager only, to create the table and the secret).
        assert statement.get('Condition', {}).get('StringEquals', {}).get('kms:ViaService'), statement
        role = principal['AWS'].get('Fn::GetAtt', [None])[0] if isinstance(principal['AWS'], dict) else None
        if role in roles:
            continue
        assert 'cfn-exec-role' in json.dumps(principal) and _via(statement) == {'dynamodb', 'secretsmanager'}
    used_by = {s['Principal']['AWS']['Fn::GetAtt'][0] for s in statements if 'Fn::GetAtt' in json.dumps(s['Principal'])}
    assert used_by == set(roles)


def test_each_role_uses_the_key_only_through_the_services_it_calls(resources: Resources) -> None:
    statements = _key_statements(resources)
    for spec in ALL_FUNCTIONS:
        role = role_of(resources, spec)
        services = set().union(*(_via(s) for s in statements if _principal_is_role(s, role)))
        access = spec.access
        consumes = access.sends_jobs or access.consumes_jobs or access.consumes_upload_events
        expected = {'dynamodb', 's3'} | ({'sqs'} if consumes else set())
        expected |= {'secretsmanager'} if access.model_roles else set()
        assert services == expected, spec.construct_id


def test_operators_named_in_context_may_put_the_model_key_and_redrive(variant: Resources) -> None:
    (operators,) = [s for s in _key_statements(variant) if s['Sid'] == 'OperatorsPutTheModelKeyAndRedriveJobs']
    assert operators['Principal']['AWS'] == 'arn:aws:iam::123456789012:role/om-operator'
    assert _via(operators) == {'secretsmanager', 'sqs'}


# ---- 3. protection -------------------------------------------------------------------------------------------------


def test_table_is_retained_with_deletion_protection_and_pitr(template: Any, resources: Resources) -> None:
    template.has_resource('AWS::DynamoDB::GlobalTable', {'DeletionPolicy': 'Retain', 'UpdateReplacePolicy': 'Retain'})
    (table,) = of_type(resources, 'AWS::DynamoDB::GlobalTable').values()
    (replica,) = table['Replicas']
    assert replica['DeletionProtectionEnabled'] is True
    assert replica['PointInTimeRecoverySpecification'] == {'PointInTimeRecoveryEnabled': True}


def test_bucket_is_versioned_retained_and_refuses_other_encryption(template: Any, resources: Resources) -> None:
    template.has_resource('AWS::S3::Bucket', {'DeletionPolicy': 'Retain', 'UpdateReplacePolicy': 'Retain'})
    (bucket,) = of_type(resources, 'AWS::S3::Bucket').values()
    assert bucket['VersioningConfiguration'] == {'Status': 'Enabled'}
    rules = {r['Id']: r for r in bucket['LifecycleConfiguration']['Rules']}
    assert rules['expire-noncurrent-versions']['NoncurrentVersionExpiration'] == {
        'NoncurrentDays': BUCKET_NONCURRENT_EXPIRY_DAYS
    }
    assert set(bucket['PublicAccessBlockConfiguration'].values()) == {True}
    (policy,) = of_type(resources, 'AWS::S3::BucketPolicy').values()
    denies = [
        s for s in policy['PolicyDocument']['Statement'] if s['Effect'] == 'Deny' and s['Action'] == 's3:PutObject'
    ]
    headers = {next(iter(s['Condition']['StringNotEquals'])) for s in denies}
    assert headers == {'s3:x-amz-server-side-encryption', 's3:x-amz-server-side-encryption-aws-kms-key-id'}
    assert all(s['Condition']['Null'] == dict.fromkeys(s['Condition']['StringNotEquals'], 'false') for s in denies)


def test_log_groups_are_retained_by_default(template: Any, resources: Resources) -> None:
    for key in of_type(resources, 'AWS::Logs::LogGroup'):
        assert resources[key]['DeletionPolicy'] == 'Retain', key


def test_a_throwaway_stack_removes_everything_on_delete(variant_stack: Any, variant: Resources) -> None:
    # Given -c removalPolicy=destroy: no deletion protection, Delete policies, the bucket emptied on delete.
    _stack, template = variant_stack
    template.has_resource('AWS::DynamoDB::GlobalTable', {'DeletionPolicy': 'Delete'})
    (table,) = of_type(variant, 'AWS::DynamoDB::GlobalTable').values()
    assert table['Replicas'][0]['DeletionProtectionEnabled'] is False
    template.has_resource('AWS::S3::Bucket', {'DeletionPolicy': 'Delete'})
    template.has_resource('AWS::KMS::Key', {'DeletionPolicy': 'Delete'})
    assert of_type(variant, 'Custom::S3AutoDeleteObjects')
    for key in of_type(variant, 'AWS::Logs::LogGroup'):
        assert variant[key]['DeletionPolicy'] == 'Delete'
