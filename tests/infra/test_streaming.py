"""The streamed chat route as deployed: API Gateway response streaming to the chat stream function, whose runtime
streams; the authorizer, the WAF, the body limit and the throttling in front of it as in front of every route."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from infra.constants import (
    CHAT_STREAM_FUNCTION,
    CHAT_STREAM_TIMEOUT_S,
    CHAT_STREAM_WRAPPER,
    LAMBDA_TASK_ROOT,
    REPO_ROOT,
)
from tests.infra.conftest import Resources, of_type, role_of, role_statements, synth_stack


def _resource_paths(resources: Resources) -> dict[str, str]:
    """Logical id of each API Gateway resource → its path (`/threads/{threadId}/chat`)."""
    items = of_type(resources, 'AWS::ApiGateway::Resource')
    paths: dict[str, str] = {}

    def path_of(key: str) -> str:
        if key not in paths:
            parent = items[key]['ParentId']
            prefix = path_of(parent['Ref']) if isinstance(parent, dict) and 'Ref' in parent else ''
            paths[key] = f'{prefix}/{items[key]["PathPart"]}'
        return paths[key]

    for key in items:
        path_of(key)
    return paths


def _methods_by_route(resources: Resources) -> dict[tuple[str, str], dict[str, Any]]:
    paths = _resource_paths(resources)
    routes = {}
    for method in of_type(resources, 'AWS::ApiGateway::Method').values():
        ref = method['ResourceId']
        path = paths[ref['Ref']] if 'Ref' in ref else '/'
        routes[(method['HttpMethod'], path)] = method
    return routes


def test_the_chat_routes_stream_from_the_chat_stream_function(resources: Resources) -> None:
    routes = _methods_by_route(resources)
    alias = next(k for k in of_type(resources, 'AWS::Lambda::Alias') if k.startswith('ChatStreamFunctionAlias'))
    for path in ('/threads/{threadId}/chat', '/threads/{threadId}/chat/stream'):
        method = routes[('POST', path)]
        integration = method['Integration']
        assert integration['Type'] == 'AWS_PROXY'
        assert integration['ResponseTransferMode'] == 'STREAM'
        assert integration['TimeoutInMillis'] == CHAT_STREAM_TIMEOUT_S * 1000
        uri = json.dumps(integration['Uri'])
        assert '/2021-11-15/functions/' in uri and '/response-streaming-invocations' in uri and alias in uri
        # The authorizer stands in front of it as in front of every route
        assert method['AuthorizationType'] == 'AWS_IAM'
    # Everything else on the way goes to the API function, buffered, as before (API Gateway does not fall back to
    # the root's proxy from a more specific resource)
    api = next(k for k in of_type(resources, 'AWS::Lambda::Alias') if k.startswith('ApiFunctionAlias'))
    for route in (
        ('ANY', '/threads'),
        ('ANY', '/threads/{threadId}'),
        ('ANY', '/threads/{threadId}/{proxy+}'),
        ('ANY', '/threads/{threadId}/chat'),
        ('ANY', '/threads/{threadId}/chat/{proxy+}'),
        ('ANY', '/{proxy+}'),
    ):
        integration = routes[route]['Integration']
        assert integration.get('ResponseTransferMode', 'BUFFERED') == 'BUFFERED', route
        assert api in json.dumps(integration['Uri']), route


def test_the_chat_stream_function_runs_its_streaming_runtime(resources: Resources) -> None:
    (function,) = [
        f for f in of_type(resources, 'AWS::Lambda::Function').values() if f['Handler'] == CHAT_STREAM_FUNCTION.handler
    ]
    env = function['Environment']['Variables']
    assert env['AWS_LAMBDA_EXEC_WRAPPER'] == CHAT_STREAM_WRAPPER
    assert function['Timeout'] == CHAT_STREAM_TIMEOUT_S
    # The wrapper is in the asset, executable (git keeps the mode; the asset build copies it)
    wrapper = REPO_ROOT / CHAT_STREAM_WRAPPER.removeprefix(f'{LAMBDA_TASK_ROOT}/')
    assert wrapper.is_file() and os.access(wrapper, os.X_OK)
    mode = subprocess.run(
        ['git', 'ls-files', '-s', str(wrapper.relative_to(REPO_ROOT))], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.split()
    assert mode and mode[0] == '100755', mode
    assert 'functions.api.stream_runtime' in wrapper.read_text()


def test_the_stage_throttle_waf_and_body_limit_cover_the_streamed_routes(resources: Resources) -> None:
    (stage,) = of_type(resources, 'AWS::ApiGateway::Stage').values()
    # The throttle is the stage's, for every resource and method
    settings = {(s['ResourcePath'], s['HttpMethod']): s for s in stage['MethodSettings']}
    assert {'ThrottlingRateLimit', 'ThrottlingBurstLimit'} <= set(settings[('/*', '*')])
    # The web ACL (with its body-size rule) is associated with the whole stage
    (association,) = of_type(resources, 'AWS::WAFv2::WebACLAssociation').values()
    assert 'stages' in json.dumps(association['ResourceArn'])


def test_a_bedrock_actor_may_be_streamed_only_by_the_chat_stream_function() -> None:
    config = {'model': 'default', 'actorModel': 'bedrock/amazon.nova-lite-v1:0'}
    _stack, template = synth_stack({'omConfig': json.dumps(config)})
    resources = template.to_json()['Resources']
    from infra.constants import API_FUNCTION

    def streaming(spec: Any) -> list[Any]:
        statements = role_statements(resources, role_of(resources, spec))
        return [s for s in statements if 'bedrock:InvokeModelWithResponseStream' in json.dumps(s['Action'])]

    (grant,) = streaming(CHAT_STREAM_FUNCTION)
    assert 'foundation-model/amazon.nova-lite-v1:0' in json.dumps(grant['Resource'])
    assert not streaming(API_FUNCTION)


def test_jwt_mode_puts_the_authorizer_in_front_of_the_streamed_routes() -> None:
    _stack, template = synth_stack(
        {'authMode': 'jwt', 'jwtIssuer': 'https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_AbC123'}
    )
    routes = _methods_by_route(template.to_json()['Resources'])
    for path in ('/threads/{threadId}/chat', '/threads/{threadId}/chat/stream'):
        assert routes[('POST', path)]['AuthorizationType'] == 'COGNITO_USER_POOLS'
        assert 'AuthorizerId' in routes[('POST', path)]
