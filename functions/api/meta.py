"""`GET /openapi.json` and `GET /health`: public, no identity needed, no store touched."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from functions.api.models import HealthOut
from functions.api.routes import _ok, json_response

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated

TITLE = 'Observational Memory API'
PACKAGE = 'om-serverless'
PUBLIC_PATHS = frozenset({'/health', '/openapi.json'})


@lru_cache(maxsize=1)
def version() -> str:
    """The installed package version, or `0.0.0+unknown` when running from a tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(PACKAGE)
    except PackageNotFoundError:
        return '0.0.0+unknown'


@router.get('/health', summary='Liveness', responses=_ok(HealthOut), tags=['meta'], enable_validation=False)
def health() -> Response[Any]:
    return json_response({'status': 'ok', 'version': version()})


@router.get('/openapi.json', summary='This API’s OpenAPI 3 document', tags=['meta'], enable_validation=False)
def openapi() -> Response[Any]:
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=openapi_document())


_document: str | None = None


def openapi_document() -> str:
    """The OpenAPI document, generated once per process (generation takes a noticeable fraction of a second)."""
    global _document
    if _document is None:
        resolver = router.api_resolver
        assert isinstance(resolver, APIGatewayRestResolver), 'the router is included in the API resolver'
        generated = resolver.get_openapi_json_schema(
            title=TITLE,
            version=version(),
            description='Observational memory for LLM agents. Every error has the shape {"error": {code, message, '
            'details}}.',
        )
        _document = json.dumps(_with_our_error_shape(json.loads(generated)), separators=(',', ':'))
    return _document


def _with_our_error_shape(document: dict[str, Any]) -> dict[str, Any]:
    # Powertools documents a 422 with its own `{detail: [...]}` body on every operation; ours answer ErrorOut, and
    # operations without parameters or a body cannot fail validation at all.
    for operations in document.get('paths', {}).values():
        for operation in operations.values():
            responses = operation.get('responses', {})
            if '422' not in responses:
                continue
            if not operation.get('parameters') and 'requestBody' not in operation:
                del responses['422']
            else:
                responses['422'] = {
                    'description': 'Validation Error',
                    'content': {'application/json': {'schema': {'$ref': '#/components/schemas/ErrorOut'}}},
                }
    schemas = document.get('components', {}).get('schemas', {})
    for name in ('HTTPValidationError', 'ResponseValidationError', 'ValidationError'):
        schemas.pop(name, None)
    return document
