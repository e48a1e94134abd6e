"""`POST /attachments`: a presigned S3 upload under the resource's prefix, for a thread the caller owns.

The object key lives under the thread's prefix (`om_lib.adapters.aws.s3.attachment_key`), so erasing the thread or the
resource deletes the upload too, and the engine reads it back only for this resource. A URL used after the erase stores
an object that the bucket reports and `functions/orphan_uploads` deletes (`om_lib.uploads`). The presigned PUT is signed
with the declared Content-Type: the client must send the same header.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from functions import _wiring
from functions._observability import logger
from functions.api.models import AttachmentIn, AttachmentOut
from functions.api.routes import _errors, _ok, authorize, json_response
from om_lib.adapters.aws.s3 import attachment_key
from om_lib.messages import iso
from om_lib.uploads import Upload, incarnation

if TYPE_CHECKING:
    pass

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools leaves __init__ unannotated

UPLOAD_URL_TTL = timedelta(minutes=15)


@router.post(
    '/attachments',
    summary='Get a presigned S3 upload URL for an attachment',
    responses={**_ok(AttachmentOut, 201, 'Created'), **_errors(400, 401, 403, 404, 413, 415, 422, 500, 503)},
    tags=['attachments'],
)
def create_attachment(body: Annotated[AttachmentIn, Body()]) -> Response[Any]:
    authorize(body.resource_id)
    thread = _wiring.service().get_thread(body.resource_id, body.thread_id)  # 404 for a missing (or another's) thread
    bucket = _wiring.settings().OM_BUCKET_NAME
    # The key names this incarnation of the thread: an upload that lands after the thread was erased (and maybe
    # created again) is deleted when the bucket reports it (functions/orphan_uploads).
    upload = Upload(body.resource_id, body.thread_id, incarnation(thread))
    key = attachment_key(upload, body.filename, uuid.uuid4().hex)
    expires_at = datetime.now(UTC) + UPLOAD_URL_TTL
    # Content-Length is signed, so the declared (size-checked) size is the size S3 accepts. Encryption: a deployed
    # bucket encrypts with the stack's key by default (and refuses any other), so the uploader sends no SSE header;
    # without a key (local runs) SSE-S3 is signed in.
    params: dict[str, object] = {
        'Bucket': bucket,
        'Key': key,
        'ContentType': body.media_type,
        'ContentLength': body.size,
    }
    if not _wiring.settings().OM_BUCKET_KMS_KEY_ARN:
        params['ServerSideEncryption'] = 'AES256'
    upload_url = _wiring.upload_signer().generate_presigned_url(
        'put_object', Params=params, ExpiresIn=int(UPLOAD_URL_TTL.total_seconds())
    )
    logger.info('attachment presigned', extra={'thread_id': body.thread_id, 'size': body.size})
    return json_response({'url': f's3://{bucket}/{key}', 'uploadUrl': upload_url, 'expiresAt': iso(expires_at)}, 201)
