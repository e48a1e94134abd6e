"""Which bucket events reach the orphan-upload function: one EventBridge pattern, for the CDK app and the local stack.

S3 sends `Object Created` to EventBridge for every new object of a bucket that has EventBridge notifications on; the
rule keeps those of attachment uploads only (`*/threads/*/attachments/*`), so the store's own writes (offloaded
messages, observation logs) never invoke the function.
"""

from __future__ import annotations

from typing import Any

from om_lib.adapters.aws.s3 import ATTACHMENT_KEY_PATTERN


def object_created_pattern(bucket: str) -> dict[str, Any]:
    """The EventBridge event pattern of a new attachment upload in `bucket`."""
    return {
        'source': ['aws.s3'],
        'detail-type': ['Object Created'],
        'detail': {'bucket': {'name': [bucket]}, 'object': {'key': [{'wildcard': ATTACHMENT_KEY_PATTERN}]}},
    }
