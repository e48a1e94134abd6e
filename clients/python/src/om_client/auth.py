"""Authentication as `httpx.Auth` flows: none, IAM (SigV4 for `execute-api`) or a bearer token.

    MemoryClient(url)                                    # 'none': the local stack, or a stack without auth
    MemoryClient(url, auth='iam')                        # SigV4 with the default AWS credential chain
    MemoryClient(url, auth=IAMAuth(region='eu-west-1'))  # the region of a custom domain
    MemoryClient(url, auth=BearerAuth(get_token))        # JWT/Cognito: a string, or a callable returning a fresh one

IAM needs the `aws` extra (`pip install 'om-client[aws]'`, botocore). Credentials are read per request from the
chain, so refreshed role credentials are used as soon as botocore refreshes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from botocore.credentials import Credentials

__all__ = ['AuthLike', 'BearerAuth', 'IAMAuth', 'NoAuth', 'region_from_url', 'resolve_auth']

# https://{api-id}.execute-api.{region}.amazonaws.com[.cn] (and the vpce- form {api-id}-{vpce-id}.execute-api...)
_EXECUTE_API_HOST = re.compile(r'\.execute-api\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$')


def region_from_url(url: str) -> str | None:
    """The AWS region in an `execute-api` URL, or None (custom domains, loopback)."""
    host = urlsplit(url).hostname or ''
    match = _EXECUTE_API_HOST.search(host)
    return match['region'] if match else None


class NoAuth(httpx.Auth):
    """No credentials (the local stack; a deployment with `authMode=none`)."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        yield request


class BearerAuth(httpx.Auth):
    """`Authorization: Bearer <token>`, from a string or a callable.

    With a callable, the token is asked for before every request (cache inside it if minting is costly), and once
    more after a 401, which is retried with the new token.
    """

    def __init__(self, token: str | Callable[[], str]) -> None:
        if isinstance(token, str) and not token.strip():
            raise ValueError('the bearer token is empty: pass the token (a JWT) or a callable that returns one')
        self._token = token

    def _current(self) -> str:
        token = self._token() if callable(self._token) else self._token
        if not isinstance(token, str) or not token.strip():
            raise ValueError('the bearer token callable returned no token')
        return token.strip()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers['Authorization'] = f'Bearer {self._current()}'
        response = yield request
        if response.status_code == 401 and callable(self._token):
            request.headers['Authorization'] = f'Bearer {self._current()}'
            yield request


class IAMAuth(httpx.Auth):
    """AWS Signature Version 4 for API Gateway (`execute-api`), with the default credential chain.

    Args:
        region: The API's region. Default: from an `execute-api` URL, else the AWS configuration (`AWS_REGION`,
            `AWS_DEFAULT_REGION`, the profile).
        credentials: Fixed botocore credentials (default: the chain: environment, profile, SSO, container, instance).
        service: The signing name (`execute-api` for API Gateway).
    """

    requires_request_body = True

    def __init__(
        self, region: str | None = None, *, credentials: Credentials | None = None, service: str = 'execute-api'
    ) -> None:
        try:
            import botocore.session
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError("IAM authentication needs botocore: pip install 'om-client[aws]'") from exc
        self._session: Any = botocore.session.get_session()
        self._credentials = credentials
        self.region = region
        self.service = service

    def bind(self, api_url: str) -> IAMAuth:
        """Fill in the region from the API URL when none was given."""
        if self.region is None:
            self.region = region_from_url(api_url) or self._session.get_config_variable('region')
        return self

    def _frozen_credentials(self) -> Any:
        credentials = self._credentials or self._session.get_credentials()
        if credentials is None:
            raise ValueError(
                'no AWS credentials found for IAM authentication: configure the default credential chain '
                '(AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, SSO, or an instance/container role)'
            )
        return credentials.get_frozen_credentials()

    def sign(self, request: httpx.Request) -> None:
        """Add `Authorization`, `X-Amz-Date` (and `X-Amz-Security-Token`) for this exact request."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        if not self.region:
            raise ValueError(
                'the AWS region of the API is unknown: pass IAMAuth(region=...) or set AWS_REGION '
                '(it is read from execute-api URLs automatically)'
            )
        # Sign only what is sent and cannot change on the way: host, the body's hash, and our own headers.
        headers = {'host': request.url.netloc.decode('ascii')}
        for name in ('content-type',):
            if name in request.headers:
                headers[name] = request.headers[name]
        aws_request = AWSRequest(method=request.method, url=str(request.url), data=request.content, headers=headers)
        SigV4Auth(self._frozen_credentials(), self.service, self.region).add_auth(aws_request)
        for name, value in aws_request.headers.items():
            if name.lower() in ('authorization', 'x-amz-date', 'x-amz-security-token', 'x-amz-content-sha256'):
                request.headers[name] = value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        self.sign(request)
        yield request


AuthLike = Literal['none', 'iam'] | httpx.Auth | None


def resolve_auth(auth: AuthLike, api_url: str, *, region: str | None = None) -> httpx.Auth:
    """The auth flow for `auth` (`'none'`, `'iam'`, or an `httpx.Auth` such as `BearerAuth`)."""
    if auth is None or auth == 'none':
        return NoAuth()
    if auth == 'iam':
        return IAMAuth(region).bind(api_url)
    if isinstance(auth, IAMAuth):
        return auth.bind(api_url)
    if isinstance(auth, httpx.Auth):
        return auth
    raise ValueError(f"auth must be 'none', 'iam' or an httpx.Auth such as BearerAuth(token), not {auth!r}")
