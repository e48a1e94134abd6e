"""Who is calling, and may they touch this resourceId (CONTRACT §4: authentication is on by default).

Modes (`OM_AUTH_MODE`):
- `iam` (default): API Gateway has already verified a SigV4 signature against the API's resource policy; the caller
  is a trusted service, so any resourceId is allowed. A request without an IAM identity is refused with 401 (it can
  only arrive through a misconfigured stage).
- `jwt`: a Cognito/JWT authorizer verified the token; its claim `OM_AUTH_CLAIM` (default `sub`) must equal the
  request's resourceId (403 otherwise, 401 without claims).
- `none`: no checks. Only for the local stack or a deployment that explicitly opts out (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from functions.api.errors import ApiError

AuthMode = Literal['iam', 'jwt', 'none']


@dataclass(frozen=True)
class Caller:
    """The verified identity of a request."""

    mode: AuthMode
    principal: str | None
    claims: Mapping[str, Any]


def _authorizer(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((event.get('requestContext') or {}).get('authorizer')) or {}


def _claims(event: Mapping[str, Any]) -> Mapping[str, Any]:
    authorizer = _authorizer(event)
    # REST API Cognito authorizer: authorizer.claims; HTTP API JWT authorizer: authorizer.jwt.claims.
    claims = authorizer.get('claims') or (authorizer.get('jwt') or {}).get('claims') or {}
    return claims if isinstance(claims, Mapping) else {}


def identify(event: Mapping[str, Any], mode: AuthMode, claim: str = 'sub') -> Caller:
    """The caller of `event`, or ApiError 401 when the mode needs an identity and there is none."""
    if mode == 'none':
        return Caller(mode, None, {})
    if mode == 'iam':
        identity = (event.get('requestContext') or {}).get('identity') or {}
        principal = identity.get('userArn') or identity.get('caller')
        if not principal:
            raise ApiError(401, 'unauthenticated', 'sign the request with AWS SigV4 (IAM) credentials')
        return Caller(mode, str(principal), {})
    claims = _claims(event)
    subject = claims.get(claim)
    if not subject:
        raise ApiError(401, 'unauthenticated', f'send a valid bearer token whose `{claim}` claim names your resourceId')
    return Caller(mode, str(subject), claims)


def require_owner(caller: Caller, resource_id: str) -> None:
    """ApiError 403 unless `caller` may act for `resource_id` (only `jwt` binds a caller to one resource)."""
    if caller.mode == 'jwt' and caller.principal != resource_id:
        raise ApiError(403, 'forbidden', 'the token does not belong to this resourceId; use your own resourceId')
