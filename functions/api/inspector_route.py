"""`GET /inspector`: the memory inspector page and its files, when the deployment turns it on (`OM_INSPECTOR`).

Off by default in a deployed stack (CDK context `inspector`); `om serve` turns it on. It sits behind the same
authentication as every other route (the edge identifies the caller before any route runs), and it reads nothing: the
page itself calls the API routes, which authorize each call as usual. Not part of the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from functions import _wiring
from functions.api import inspector
from functions.api.errors import ApiError

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated

_OFF = (
    'the memory inspector is off on this deployment: deploy with `-c inspector=true`, or run '
    '`om inspect --api-url URL` to serve it on your machine'
)


def _served(body: bytes, media_type: str) -> Response[Any]:
    if not _wiring.settings().OM_INSPECTOR:
        raise ApiError(404, 'not_found', _OFF)
    return Response(
        status_code=200, content_type=media_type, body=body.decode('utf-8'), headers=dict(inspector.SECURITY_HEADERS)
    )


@router.get('/inspector', include_in_schema=False, enable_validation=False)
def inspector_page() -> Response[Any]:
    return _served(inspector.page(trailing_slash=router.current_event.path.endswith('/')), inspector.HTML)


@router.get('/inspector/<name>', include_in_schema=False, enable_validation=False)
def inspector_asset(name: str) -> Response[Any]:
    found = inspector.asset(name)
    if found is None:
        raise ApiError(404, 'not_found', f'the inspector has no file {name!r}')
    return _served(*found)
