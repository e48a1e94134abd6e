"""MemoryApi: the REST API (one Lambda proxy integration for every route), authenticated by default, throttled,
and with API Gateway's own errors in the service's error shape."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from functions.api.errors import gateway_response_templates
from infra.constants import AUTH_MODES, DEFAULT_AUTH_CLAIM, LOG_RETENTION
from infra.constructs.nag import acknowledge

AuthMode = Literal['iam', 'jwt', 'none']
_USER_POOL_ID = re.compile(r'^(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)_[A-Za-z0-9]+$')
_COGNITO_ISSUER = re.compile(r'^https://cognito-idp\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/(?P<pool>[\w-]+)/?$')


@dataclass(frozen=True)
class ApiAuth:
    """How callers are authenticated (CONTRACT §4).

    - `iam` (default): every method needs a SigV4-signed request (AuthorizationType AWS_IAM).
    - `jwt`: a Cognito user pool authorizer verifies the bearer ID token; the handler then requires its `claim`
      (default `sub`) to equal the request's resourceId.
    - `none`: no authentication at all. Only when asked for explicitly (`-c authMode=none`).
    """

    mode: AuthMode = 'iam'
    claim: str = DEFAULT_AUTH_CLAIM
    user_pool_id: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in AUTH_MODES:
            raise ValueError(f'authMode must be one of {", ".join(AUTH_MODES)}, got {self.mode!r}')
        if not self.claim:
            raise ValueError('authClaim must name a JWT claim (default: sub)')
        if self.mode == 'jwt' and not (self.user_pool_id and _USER_POOL_ID.match(self.user_pool_id)):
            raise ValueError(
                'authMode=jwt needs the Cognito user pool that issues the tokens: -c userPoolId=<region>_<id> '
                'or -c jwtIssuer=https://cognito-idp.<region>.amazonaws.com/<region>_<id> '
                f'(got {self.user_pool_id!r})'
            )

    @classmethod
    def from_issuer(cls, issuer: str, claim: str = DEFAULT_AUTH_CLAIM) -> ApiAuth:
        """JWT auth from a Cognito issuer URL (REST APIs verify Cognito user pool tokens natively, no other issuer)."""
        match = _COGNITO_ISSUER.match(issuer)
        if not match:
            raise ValueError(
                f'jwtIssuer must be a Cognito user pool issuer (https://cognito-idp.<region>.amazonaws.com/<pool id>), '
                f'got {issuer!r}: a REST API authorizer verifies Cognito tokens only'
            )
        return cls(mode='jwt', claim=claim, user_pool_id=match['pool'])


class MemoryApi(Construct):
    """Regional REST API → the API function's alias, for every method and path (`ANY /` and `ANY /{proxy+}`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        handler: lambda_.IFunction,
        auth: ApiAuth,
        stage_name: str,
        rate_limit: float,
        burst_limit: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.auth = auth
        self.access_logs = logs.LogGroup(
            self, 'AccessLogs', retention=logs.RetentionDays[LOG_RETENTION], removal_policy=RemovalPolicy.DESTROY
        )
        self.api = apigw.RestApi(
            self,
            'RestApi',
            description='Observational memory HTTP API',
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # Access and execution logs need API Gateway's account-level CloudWatch role.
            cloud_watch_role=True,
            deploy_options=apigw.StageOptions(
                stage_name=stage_name,
                throttling_rate_limit=rate_limit,
                throttling_burst_limit=burst_limit,
                metrics_enabled=True,
                # Errors only, and never request bodies: they hold users' conversations.
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
            ),
            default_method_options=self._build_method_options(),
        )
        integration = apigw.LambdaIntegration(handler, proxy=True, allow_test_invoke=False)
        self.api.root.add_method('ANY', integration)
        self.api.root.add_proxy(default_integration=integration, any_method=True)
        self._build_gateway_responses()
        self._acknowledge_findings()

    def _acknowledge_findings(self) -> None:
        acknowledge(
            self.api,
            'APIG2',
            'One Lambda proxy integration serves every route; the API function validates each body against its '
            "pydantic models and answers 400/422 in the contract's error shape, which a gateway validator would not.",
        )
        acknowledge(
            self.api,
            'APIG3',
            'WAF is an account-level choice with its own cost; the stage is throttled. Attach a web ACL to the stage '
            'if the API is exposed to untrusted networks.',
        )
        role = self.api.node.try_find_child('CloudWatchRole')
        if role is not None:
            acknowledge(
                role,
                'IAM4',
                "API Gateway's account-level logging role, with the AWS-managed policy AWS documents for it.",
                finding='Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs',
            )
        if self.auth.mode == 'iam':
            acknowledge(
                self.api,
                'COG4',
                'Callers authenticate with IAM (SigV4), the default (CONTRACT §4); Cognito is the authMode=jwt option.',
            )
        elif self.auth.mode == 'none':
            reason = 'authMode=none was requested explicitly (documented in the README); the API has no authorizer.'
            acknowledge(self.api, 'COG4', reason)
            acknowledge(self.api, 'APIG4', reason)

    def _build_method_options(self) -> apigw.MethodOptions:
        if self.auth.mode == 'iam':
            return apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM)
        if self.auth.mode == 'jwt':
            assert self.auth.user_pool_id is not None
            # The pool id starts with its region, which may differ from the stack's.
            region = self.auth.user_pool_id.split('_', 1)[0]
            pool_arn = Stack.of(self).format_arn(
                service='cognito-idp', region=region, resource='userpool', resource_name=self.auth.user_pool_id
            )
            pool = cognito.UserPool.from_user_pool_arn(self, 'UserPool', pool_arn)
            self.authorizer = apigw.CognitoUserPoolsAuthorizer(
                self,
                'Authorizer',
                cognito_user_pools=[pool],
                identity_source=apigw.IdentitySource.header('Authorization'),
            )
            return apigw.MethodOptions(authorization_type=apigw.AuthorizationType.COGNITO, authorizer=self.authorizer)
        return apigw.MethodOptions(authorization_type=apigw.AuthorizationType.NONE)

    def _build_gateway_responses(self) -> None:
        """API Gateway's own answers (auth, throttling, size, timeouts) in `{"error": {code, message, details}}`."""
        responses = gateway_response_templates()
        if self.auth.mode == 'iam':
            # Every path reaches the proxy, so this response can only mean "no SigV4 signature": a 401, not a 404.
            template = responses['UNAUTHORIZED']['template']
            responses['MISSING_AUTHENTICATION_TOKEN'] = {'statusCode': '401', 'template': template}
        known = {
            member.response_type: member
            for name in dir(apigw.ResponseType)
            if name.isupper() and isinstance(member := getattr(apigw.ResponseType, name), apigw.ResponseType)
        }
        for kind, response in sorted(responses.items()):
            if kind not in known:
                raise ValueError(f'unknown API Gateway response type {kind!r} in functions.api.errors')
            response_type = known[kind]
            self.api.add_gateway_response(
                f'Gateway{kind.title().replace("_", "")}',
                type=response_type,
                status_code=response['statusCode'],
                templates={'application/json': response['template']},
                response_headers={'Content-Type': "'application/json'"},
            )
