"""The edge, concurrency and retries, tracing, alarms, the dashboard and cdk-nag (issue 19, points 4-7)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from functions.api.edge import MAX_BODY_BYTES
from infra.app import SettingsError, build_app, settings_from_context
from infra.constants import (
    ALARMED_FAILURE_REASONS,
    ALL_FUNCTIONS,
    API_5XX_RATE_THRESHOLD,
    API_P99_LATENCY_MS,
    QUEUE_MAX_CONCURRENCY,
    REFLECTION_FUNCTION,
    STATE_MACHINE_ASL,
    SWEEPER_FUNCTION,
    UPLOAD_EVENTS_MAX_CONCURRENCY,
    WAF_RATE_LIMIT_PER_5_MIN,
)
from infra.constructs.api_firewall import decimal_greater_than
from tests.infra.conftest import FAST, VARIANT, Resources, assert_nag_clean_and_listed_in_readme, of_type


def _ours(resources: Resources) -> dict[str, dict[str, Any]]:
    """The service's four functions (not CDK's custom-resource providers)."""
    return {
        k: f for k, f in of_type(resources, 'AWS::Lambda::Function').items() if f['Handler'].startswith('functions.')
    }


def _by_handler(resources: Resources) -> dict[str, dict[str, Any]]:
    return {f['Handler']: f for f in _ours(resources).values()}


# ---- 4. the edge ---------------------------------------------------------------------------------------------------


def test_a_waf_web_acl_guards_the_api_stage(resources: Resources) -> None:
    (acl_id,) = of_type(resources, 'AWS::WAFv2::WebACL')
    acl = resources[acl_id]['Properties']
    assert acl['Scope'] == 'REGIONAL' and acl['DefaultAction'] == {'Allow': {}}
    rules = {rule['Name']: rule for rule in acl['Rules']}
    groups = {
        r['Statement']['ManagedRuleGroupStatement']['Name']
        for r in rules.values()
        if 'ManagedRuleGroupStatement' in r['Statement']
    }
    assert groups == {'AWSManagedRulesCommonRuleSet', 'AWSManagedRulesKnownBadInputsRuleSet'}
    rate = rules['PerIpRate']['Statement']['RateBasedStatement']
    assert rate == {'AggregateKeyType': 'IP', 'Limit': WAF_RATE_LIMIT_PER_5_MIN, 'EvaluationWindowSec': 300}
    assert rules['PerIpRate']['Action']['Block']['CustomResponse']['ResponseCode'] == 429
    body = rules['BodyOverLimit']
    assert body['Action']['Block']['CustomResponse']['ResponseCode'] == 413
    regex = body['Statement']['RegexMatchStatement']
    assert regex['FieldToMatch'] == {'SingleHeader': {'Name': 'content-length'}}
    assert regex['RegexString'] == decimal_greater_than(MAX_BODY_BYTES)
    # Rejections in the service's error shape.
    for response in acl['CustomResponseBodies'].values():
        assert set(json.loads(response['Content'])['error']) == {'code', 'message', 'details'}
    # Body-inspecting managed rules count (conversations hold code, HTML, paths); every other managed rule blocks.
    common = rules['AWSManagedRulesCommonRuleSet']['Statement']['ManagedRuleGroupStatement']
    counted = {o['Name'] for o in common['RuleActionOverrides'] if o['ActionToUse'] == {'Count': {}}}
    assert 'SizeRestrictions_BODY' in counted and all(name.endswith('_BODY') for name in counted)
    (association,) = of_type(resources, 'AWS::WAFv2::WebACLAssociation').values()
    assert association['WebACLArn'] == {'Fn::GetAtt': [acl_id, 'Arn']}
    (stage_id,) = of_type(resources, 'AWS::ApiGateway::Stage')
    assert {'Ref': stage_id} in association['ResourceArn']['Fn::Join'][1]


@pytest.mark.parametrize('limit', [0, 9, 10, 99, 6_291_456, 999_999, 1_000_000, MAX_BODY_BYTES])
def test_the_body_limit_pattern_matches_exactly_the_larger_lengths(limit: int) -> None:
    pattern = re.compile(decimal_greater_than(limit))
    rng = random.Random(limit)
    samples = {0, 1, limit - 1, limit, limit + 1, limit * 10, 10 ** len(str(limit))}
    samples |= {rng.randrange(0, 3 * limit + 20) for _ in range(2000)}
    for n in sorted(s for s in samples if s >= 0):
        assert bool(pattern.match(str(n))) == (n > limit), (limit, n)
    assert pattern.match('0' + str(limit + 1)) and not pattern.match('0' + str(limit))  # leading zeros
    assert not pattern.match('') and not pattern.match('12a')


def test_the_stage_is_throttled_traced_and_logs_json_access_logs(resources: Resources, variant: Resources) -> None:
    (stage,) = of_type(resources, 'AWS::ApiGateway::Stage').values()
    assert stage['TracingEnabled'] is True
    (settings,) = stage['MethodSettings']
    assert (settings['ThrottlingRateLimit'], settings['ThrottlingBurstLimit']) == (50, 100)
    fields = json.loads(stage['AccessLogSetting']['Format'])  # JSON, one field per key
    assert {'requestId', 'ip', 'status', 'requestTime', 'resourcePath'} <= set(fields)
    (variant_stage,) = of_type(variant, 'AWS::ApiGateway::Stage').values()
    (variant_settings,) = variant_stage['MethodSettings']
    assert (variant_settings['ThrottlingRateLimit'], variant_settings['ThrottlingBurstLimit']) == (20, 40)
    (acl,) = of_type(variant, 'AWS::WAFv2::WebACL').values()
    (rate,) = [r for r in acl['Rules'] if r['Name'] == 'PerIpRate']
    assert rate['Statement']['RateBasedStatement']['Limit'] == 500


def test_api_keys_and_a_usage_plan_only_when_asked_for(resources: Resources, variant: Resources) -> None:
    assert not of_type(resources, 'AWS::ApiGateway::UsagePlan')
    assert all('ApiKeyRequired' not in m for m in of_type(resources, 'AWS::ApiGateway::Method').values())
    (plan_id,) = of_type(variant, 'AWS::ApiGateway::UsagePlan')
    plan = variant[plan_id]['Properties']
    assert plan['Throttle'] and plan['Quota']['Period'] == 'DAY'
    keys = of_type(variant, 'AWS::ApiGateway::ApiKey')
    assert sorted(k['Name'] for k in keys.values()) == ['partner-a', 'partner-b']
    assert all('Value' not in k for k in keys.values())  # generated by API Gateway, never in the template
    assert len(of_type(variant, 'AWS::ApiGateway::UsagePlanKey')) == 2
    methods = of_type(variant, 'AWS::ApiGateway::Method').values()
    # Every method but the CORS preflights (a browser sends no key with those; they answer without the API)
    assert all(m['ApiKeyRequired'] is (m['HttpMethod'] != 'OPTIONS') for m in methods)
    responses = {r['ResponseType']: r for r in of_type(variant, 'AWS::ApiGateway::GatewayResponse').values()}
    assert responses['INVALID_API_KEY']['StatusCode'] == '403'


@pytest.mark.parametrize(
    ('context', 'message'),
    [
        ({'removalPolicy': 'sometimes'}, 'removalPolicy'),
        ({'wafRateLimit': '5'}, 'wafRateLimit'),
        ({'apiKeys': 'partner a'}, 'apiKeys'),
        ({'apiKeys': 'a,a'}, 'apiKeys'),
        ({'operatorRoleArns': 'admin'}, 'operatorRoleArns'),
        ({'deployRoleArn': 'arn:aws:iam::123:user/x'}, 'deployRoleArn'),
        ({'reservedConcurrency': 'maybe'}, 'reservedConcurrency'),
    ],
)
def test_bad_deployment_context_is_refused_naming_the_key(context: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings_from_context(context)


# ---- 5. concurrency and retries --------------------------------------------------------------------------------------


def test_workers_cannot_take_the_apis_concurrency(resources: Resources, variant: Resources) -> None:
    limits = sorted(
        m['ScalingConfig']['MaximumConcurrency'] for m in of_type(resources, 'AWS::Lambda::EventSourceMapping').values()
    )
    assert limits == sorted([QUEUE_MAX_CONCURRENCY, UPLOAD_EVENTS_MAX_CONCURRENCY])  # the work queue, upload events
    functions = _by_handler(resources)
    for spec in ALL_FUNCTIONS:
        assert functions[spec.handler].get('ReservedConcurrentExecutions') == spec.reserved_concurrency
    assert functions[REFLECTION_FUNCTION.handler]['ReservedConcurrentExecutions'] >= 1
    assert functions[SWEEPER_FUNCTION.handler]['ReservedConcurrentExecutions'] == 1
    # -c reservedConcurrency=false: no reservations (accounts with a small concurrency quota).
    assert all('ReservedConcurrentExecutions' not in f for f in _ours(variant).values())


def test_the_workflow_retries_throttling_with_backoff_and_jitter() -> None:
    states = json.loads(STATE_MACHINE_ASL.read_text(encoding='utf-8'))['States']
    reflect = states['Reflect']['Retry']
    (throttled,) = [r for r in reflect if r['ErrorEquals'] == ['ModelThrottledError']]
    assert throttled['BackoffRate'] > 1 and throttled['JitterStrategy'] == 'FULL' and throttled['MaxDelaySeconds']
    (unavailable,) = [r for r in reflect if 'ModelUnavailableError' in r['ErrorEquals']]
    # A throttle waits longer than an outage, and is tried before it (Step Functions takes the first match).
    assert throttled['IntervalSeconds'] > unavailable['IntervalSeconds'] and reflect.index(throttled) == 0
    for name in ('Check', 'Reflect', 'Validate', 'Commit'):
        (lambda_throttle,) = [r for r in states[name]['Retry'] if 'Lambda.TooManyRequestsException' in r['ErrorEquals']]
        assert lambda_throttle['JitterStrategy'] == 'FULL' and lambda_throttle['BackoffRate'] > 1, name
    assert states['Release']['Parameters']['Payload']['error.$'] == '$.error.Error'


# ---- 6. tracing, alarms, dashboard -----------------------------------------------------------------------------------


def test_every_function_and_the_state_machine_are_traced(resources: Resources) -> None:
    for function in _ours(resources).values():
        assert function['TracingConfig'] == {'Mode': 'Active'}
    (machine,) = of_type(resources, 'AWS::StepFunctions::StateMachine').values()
    assert machine['TracingConfiguration'] == {'Enabled': True}
    import functions.api.handler as api
    import functions.buffer_worker.handler as worker
    import functions.reflection.handler as reflection
    import functions.sweeper.handler as sweeper

    for module in (api, worker, reflection, sweeper):
        # `traced` (Powertools' capture_lambda_handler) marks its wrapper; functools.wraps carries the mark outwards.
        chain, handler = [], module.lambda_handler
        while handler is not None:
            chain.append(handler)
            handler = getattr(handler, '__wrapped__', None)
        assert any(vars(h).get('om_traced') for h in chain if hasattr(h, '__dict__')), module.__name__


def _alarms(resources: Resources) -> dict[str, dict[str, Any]]:
    return of_type(resources, 'AWS::CloudWatch::Alarm')


def test_alarms_cover_dead_letters_executions_functions_and_the_api(resources: Resources) -> None:
    alarms = list(_alarms(resources).values())
    (topic_id,) = of_type(resources, 'AWS::SNS::Topic')
    assert all(a['AlarmActions'] == [{'Ref': topic_id}] and a['OKActions'] == [{'Ref': topic_id}] for a in alarms)
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for alarm in alarms:
        by_metric.setdefault(alarm.get('MetricName', 'math'), []).append(alarm)
    # The jobs', the upload events' and the lifecycle bus's dead letters.
    assert len(by_metric['ApproximateNumberOfMessagesVisible']) == 3
    for metric in ('ExecutionsFailed', 'ExecutionsTimedOut'):
        assert len(by_metric[metric]) == 1
    functions = set(_ours(resources))
    for metric in ('Errors', 'Throttles'):
        watched = {d['Value']['Ref'] for a in by_metric[metric] for d in a['Dimensions']}
        assert watched == functions, metric
    (rate,) = by_metric['5XXError']
    assert (rate['Statistic'], rate['Threshold']) == ('Average', API_5XX_RATE_THRESHOLD)
    (latency,) = by_metric['Latency']
    assert (latency['ExtendedStatistic'], latency['Threshold']) == ('p99', API_P99_LATENCY_MS)


def test_failure_alarms_sum_each_reason_over_the_functions_that_report_it(resources: Resources) -> None:
    math = [a for a in _alarms(resources).values() if 'Metrics' in a]
    seen = {}
    for alarm in math:
        metrics = [m['MetricStat']['Metric'] for m in alarm['Metrics'] if 'MetricStat' in m]
        names = {m['MetricName'] for m in metrics}
        reasons = {d['Value'] for m in metrics for d in m['Dimensions'] if d['Name'] == 'reason'}
        services = {d['Value'] for m in metrics for d in m['Dimensions'] if d['Name'] == 'service'}
        (name,) = names
        (reason,) = reasons
        seen[(name, reason)] = services
    expected_reporters = {
        'ObservationFailures': {'om-api', 'om-chat-stream', 'om-buffer-worker'},
        'ReflectionFailures': {'om-api', 'om-chat-stream', 'om-buffer-worker', 'om-reflection'},
    }
    assert seen == {(n, r): s for n, s in expected_reporters.items() for r in ALARMED_FAILURE_REASONS}


def test_a_dashboard_shows_steps_models_tokens_compression_failures_and_backlog(resources: Resources) -> None:
    (dashboard,) = of_type(resources, 'AWS::CloudWatch::Dashboard').values()
    body = json.dumps(dashboard['DashboardBody'])
    for needle in (
        'StepLatencyMs',
        'ModelCalls',
        'ObservationDurationMs',
        'TokensObserved',
        'ObservationTokens',
        'ReflectionInputTokens',
        'Compression',
        'ObservationFailures',
        'ReflectionFailures',
        'ApproximateNumberOfMessagesVisible',
        'ApproximateAgeOfOldestMessage',
        'ExecutionsFailed',
    ):
        assert needle in body, needle


def test_outputs_name_the_alarm_topic_key_acl_and_dashboard(template: Any, variant_stack: Any) -> None:
    outputs = template.to_json()['Outputs']
    assert {'AlarmTopicArn', 'KeyArn', 'WebAclArn', 'DashboardName', 'GeminiSecretArn'} <= set(outputs)
    variant_outputs = variant_stack[1].to_json()['Outputs']
    assert 'UsagePlanId' in variant_outputs and 'GeminiSecretArn' not in variant_outputs


# ---- 7. cdk-nag ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'context',
    [{}, {'authMode': 'none'}, {'authMode': 'jwt', 'userPoolId': 'eu-west-1_AbC123'}, VARIANT],
    ids=['iam', 'none', 'jwt', 'variant'],
)
def test_cdk_nag_has_no_unacknowledged_finding_and_the_readme_lists_each(
    tmp_path: Path, context: dict[str, str]
) -> None:
    app, _stack = build_app({**FAST, **context}, outdir=str(tmp_path))
    app.synth()  # raises on any unacknowledged AwsSolutions finding
    assert_nag_clean_and_listed_in_readme(tmp_path)
