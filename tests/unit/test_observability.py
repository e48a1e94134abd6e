"""Business metrics from parts: failures carry their reason as a dimension (what the alarms and dashboard read)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from functions import _observability as obs


def _emf_documents(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{') and '_aws' in line]


def _failed(kind: str, operation: str, reason: str) -> dict[str, Any]:
    return {'type': f'data-om-{kind}', 'data': {'operationType': operation, 'reason': reason, 'durationMs': 5}}


def test_failures_are_counted_per_reason_with_service_and_reason_dimensions(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a request whose parts hold two observation failures (error, deferred) and a buffered reflection failure
    parts = [
        _failed('observation-failed', 'observation', 'error'),
        _failed('observation-failed', 'observation', 'error'),
        _failed('observation-failed', 'observation', 'deferred'),
        _failed('buffering-failed', 'reflection', 'timeout'),
    ]
    # When its metrics are recorded
    obs.record_parts_metrics(parts)
    # Then each (metric, reason) is one EMF document with exactly the dimensions the alarms use
    found = {}
    for doc in _emf_documents(capsys.readouterr().out):
        (directive,) = doc['_aws']['CloudWatchMetrics']
        (metric,) = directive['Metrics']
        assert directive['Namespace'] == 'ObservationalMemory'
        assert sorted(directive['Dimensions'][0]) == ['reason', 'service']
        found[(metric['Name'], doc['reason'])] = doc[metric['Name']]
    assert found == {
        ('ObservationFailures', 'error'): [2.0],
        ('ObservationFailures', 'deferred'): [1.0],
        ('ReflectionFailures', 'timeout'): [1.0],
    }


def test_completed_cycles_are_split_into_observation_and_reflection_tokens() -> None:
    parts = [
        {'type': 'data-om-observation-start', 'data': {'operationType': 'observation'}},
        {
            'type': 'data-om-observation-end',
            'data': {
                'operationType': 'observation',
                'tokensObserved': 900,
                'observationTokens': 90,
                'durationMs': 1200,
            },
        },
        {
            'type': 'data-om-observation-end',
            'data': {
                'operationType': 'reflection',
                'tokensObserved': 500,
                'observationTokens': 200,
                'durationMs': 3000,
            },
        },
    ]
    obs.metrics.clear_metrics()
    obs.record_parts_metrics(parts)
    recorded = {name: metric['Value'] for name, metric in obs.metrics.provider.metric_set.items()}
    obs.metrics.clear_metrics()
    assert recorded['TokensObserved'] == [900.0] and recorded['ObservationTokens'] == [90.0]
    assert recorded['ReflectionInputTokens'] == [500.0] and recorded['ReflectionOutputTokens'] == [200.0]
    assert recorded['ObservationDurationMs'] == [1200.0] and recorded['ReflectionDurationMs'] == [3000.0]
    assert recorded['ModelCalls'] == [1.0]


def test_archive_moves_and_answer_notes_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    parts = [
        {'type': 'data-om-observations-archived', 'data': {'groupsArchived': 3, 'tokensArchived': 450}},
        {'type': 'data-om-observation-end', 'data': {'operationType': 'reflection', 'notes': ['mostly_prose']}},
    ]
    obs.metrics.clear_metrics()
    obs.record_parts_metrics(parts)
    recorded = {name: metric['Value'] for name, metric in obs.metrics.provider.metric_set.items()}
    obs.metrics.clear_metrics()
    assert recorded['ObservationGroupsArchived'] == [3.0] and recorded['ArchivedObservationTokens'] == [450.0]
    notes = [doc for doc in _emf_documents(capsys.readouterr().out) if 'AnswerNotes' in doc]
    assert [(doc['note'], doc['AnswerNotes']) for doc in notes] == [('mostly_prose', [1.0])]


@pytest.mark.parametrize(
    ('task', 'result', 'error', 'expected'),
    [
        ('release', {'released': True}, 'ModelThrottledError', {('ReflectionFailures', 'error')}),
        ('release', {'released': True}, 'States.Timeout', {('ReflectionFailures', 'timeout')}),
        ('release', {'released': True}, 'ReflectionRejectedError', {('ReflectionFailures', 'rejected')}),
        ('reflect', {'outcome': 'not_smaller'}, None, {('ReflectionFailures', 'not_smaller')}),
        ('reflect', {'outcome': 'invalid_reflection'}, None, {('ReflectionFailures', 'invalid_reflection')}),
        ('reflect', {'outcome': 'reflected'}, None, set()),
        (
            'commit',
            {'outcome': 'committed', 'inputTokens': 500, 'tokens': 200},
            None,
            {('ReflectionsCompleted', None), ('ReflectionInputTokens', None), ('ReflectionOutputTokens', None)},
        ),
        ('check', {'due': True}, None, {('ModelCalls', None)}),
        ('check', {'due': False}, None, set()),
    ],
)
def test_workflow_outcomes_are_counted(
    capsys: pytest.CaptureFixture[str], task: str, result: dict[str, Any], error: str | None, expected: Any
) -> None:
    obs.record_workflow_metrics(task, result, error)
    docs = _emf_documents(capsys.readouterr().out)
    found = set()
    for doc in docs:
        ((metric,),) = [d['Metrics'] for d in doc['_aws']['CloudWatchMetrics']]
        found.add((metric['Name'], doc.get('reason')))
        if metric['Name'] == 'ReflectionInputTokens':
            assert doc['ReflectionInputTokens'] == [500.0]
    assert found == expected


def test_a_traced_handler_sends_its_subsegments_to_the_xray_daemon(tmp_path: Any) -> None:
    # Given a Lambda-like environment (task root, trace header, a daemon address on a local UDP socket), when a
    # traced handler runs, then the X-Ray SDK is patched and the handler's subsegment reaches the daemon, without the
    # response. A fresh process: tracing and patching are process-wide.
    import socket
    import subprocess
    import sys

    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(('127.0.0.1', 0))
    daemon.settimeout(10)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(('POWERTOOLS_TRACE', 'AWS_XRAY'))},
        'LAMBDA_TASK_ROOT': str(tmp_path),
        'AWS_LAMBDA_FUNCTION_NAME': 'om-test',
        'AWS_XRAY_DAEMON_ADDRESS': f'127.0.0.1:{daemon.getsockname()[1]}',
        '_X_AMZN_TRACE_ID': 'Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1',
        'POWERTOOLS_SERVICE_NAME': 'om-test',
    }
    code = (
        'from functions import _observability as obs\n'
        '@obs.traced\n'
        'def lambda_handler(event, context):\n'
        "    return {'secret': 'user text'}\n"
        'print(lambda_handler({}, None), obs._patched)\n'
    )
    try:
        result = subprocess.run(
            [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().endswith('True')  # botocore and the Gemini adapter were patched
        payload = daemon.recv(65536).decode()
    finally:
        daemon.close()
    header, _, body = payload.partition('\n')
    assert json.loads(header) == {'format': 'json', 'version': 1}
    segment = json.loads(body)
    assert segment['name'] == '## lambda_handler' and segment['annotations']['ColdStart'] is True
    assert 'user text' not in payload
