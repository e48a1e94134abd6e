"""Which URLs a message part may link: `https:`, `data:`, and `s3:` objects of the caller's own resource.

A stored part's URL is shown to the Actor's model, read back by the engine (`s3:` images go to the model inline) and
rendered by clients and the inspector. So a part may not point at `javascript:`, `file:` or plain `http:` URLs, nor at
another resource's uploads or another bucket (the engine would not read those back anyway, but storing them would
leak a link across tenants). Checked by the routes that store messages, after the caller is authorized, before
anything is written: 422 `validation_error` naming each `…parts[i].url`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from functions import _wiring
from functions.api.errors import ApiError
from functions.api.models import MessageIn
from om_lib.adapters.aws.s3 import resource_prefix
from om_lib.messages import FilePart, ImagePart

ALLOWED_SCHEMES = ('https', 'data', 's3')


def url_problem(url: str, resource_id: str, bucket: str) -> str | None:
    """Why a part may not link `url` (a phrase), or None when it may."""
    scheme, colon, rest = url.partition(':')
    scheme = scheme.strip().lower()
    if not colon or scheme not in ALLOWED_SCHEMES:
        return (
            f'a part may link https:, data: or s3: URLs only (not {scheme[:20] or "a URL without a scheme"}:); '
            'upload files through POST /attachments and link the url it answers'
        )
    if scheme == 's3':
        own = f'//{bucket}/{resource_prefix(resource_id)}'
        if not rest.startswith(own) or len(rest) == len(own):
            return 'an s3: URL must name an upload of this resource (the url POST /attachments answered)'
    return None


def check_part_urls(resource_id: str, messages: Iterable[tuple[str, MessageIn]]) -> None:
    """ApiError 422 naming every part URL of `messages` (field prefix, message) that may not be stored."""
    bucket = _wiring.settings().OM_BUCKET_NAME
    details: list[dict[str, Any]] = []
    for prefix, message in messages:
        for index, part in enumerate(message.parts or ()):
            if isinstance(part, ImagePart | FilePart) and part.url is not None:
                problem = url_problem(part.url, resource_id, bucket)
                if problem is not None:
                    field = f'{prefix}.parts[{index}].url'
                    details.append({'location': 'body', 'field': field, 'type': 'url_not_allowed', 'message': problem})
    if details:
        first = details[0]
        raise ApiError(
            422,
            'validation_error',
            f'the request is invalid ({first["field"]}: {first["message"]}); see details for every field to fix',
            details,
        )
