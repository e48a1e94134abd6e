"""The tools the integrations offer a model: `recall` (`POST /recall`) and `updateWorkingMemory`
(`PUT .../working-memory`), each with one declaration and one way to run it.

The memory system message (`StepResult.system`) already tells the model when and how to use them. Recall's
`threadId` argument names the thread to read (the current one when left out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from om_client.errors import APIError
from om_client.models import RecallResult

RECALL_NAME = 'recall'
RECALL_DESCRIPTION = (
    'Browse raw conversation history behind your observations. mode "messages" (default) pages through messages from '
    'a cursor (one end of an observation section\'s range such as `#12` from "## Messages #12–#19", or a message id), '
    'forward with page 1, 2... or backward with page -1, -2...; detail "high" with partIndex shows one part in full. '
    'mode "threads" lists the user\'s threads; threadId reads another thread. mode "search" finds messages by meaning '
    '(when the service has vectors). mode "observations" pages through archived observations, newest first.'
)
RECALL_PARAMETERS: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'mode': {
            'type': 'string',
            'enum': ['messages', 'threads', 'search', 'observations'],
            'description': 'What to retrieve.',
        },
        'query': {'type': 'string', 'description': 'Search text (mode "search").'},
        'cursor': {'type': 'string', 'description': 'A message id to page from.'},
        'threadId': {'type': 'string', 'description': 'The thread to read (default: this conversation).'},
        'page': {
            'type': 'integer',
            'description': 'Messages: +n forward, -n backward from the cursor. Threads: from 0.',
        },
        'limit': {'type': 'integer', 'description': 'Items per page (default 20).'},
        'detail': {'type': 'string', 'enum': ['low', 'high'], 'description': '"low" (default) or "high".'},
        'partIndex': {'type': 'integer', 'description': 'One part of the cursor message, in full.'},
        'before': {'type': 'string', 'description': 'Threads created before this ISO 8601 date (mode "threads").'},
        'after': {'type': 'string', 'description': 'Threads created after this ISO 8601 date (mode "threads").'},
    },
}
_ARGS = {
    'mode': 'mode',
    'query': 'query',
    'cursor': 'cursor',
    'page': 'page',
    'limit': 'limit',
    'detail': 'detail',
    'partIndex': 'part_index',
    'before': 'before',
    'after': 'after',
}


def recall_call(args: Mapping[str, Any] | str | None, default_thread_id: str) -> tuple[str, dict[str, Any]]:
    """`(thread_id, client.recall keyword arguments)` from the model's arguments (JSON text or an object).

    Raises:
        ValueError: The arguments are not a JSON object.
    """
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise ValueError('recall arguments must be a JSON object')
    kwargs = {python: args[wire] for wire, python in _ARGS.items() if args.get(wire) is not None}
    thread_id = args.get('threadId') or default_thread_id
    return str(thread_id), kwargs


def recall_answer(result: RecallResult) -> str:
    """The tool's returns as the JSON text a model reads."""
    return json.dumps(result.to_wire(), ensure_ascii=False)


def recall_error(exc: APIError | ValueError) -> str:
    """A failed call as the model reads it (the service's message says what to change)."""
    message = exc.message if isinstance(exc, APIError) else str(exc)
    return json.dumps({'error': message}, ensure_ascii=False)


WORKING_MEMORY_NAME = 'updateWorkingMemory'
WORKING_MEMORY_DESCRIPTION = (
    'Update the working memory: Markdown replaces it (send the complete text, following the template), a JSON object '
    'is merged into it (null deletes a field). Keep everything that is still true.'
)
WORKING_MEMORY_PARAMETERS: dict[str, Any] = {
    'type': 'object',
    'properties': {
        'memory': {
            'anyOf': [{'type': 'string'}, {'type': 'object'}],
            'description': 'The updated working memory: Markdown text, or an object of the fields to change.',
        }
    },
    'required': ['memory'],
}


def working_memory_value(args: Mapping[str, Any] | str | None) -> str | dict[str, Any]:
    """The `memory` argument of an `updateWorkingMemory` call.

    Raises:
        ValueError: No `memory` argument.
    """
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, Mapping) or not isinstance(args.get('memory'), str | dict):
        raise ValueError('updateWorkingMemory needs one argument, `memory`: Markdown text or an object')
    value: str | dict[str, Any] = args['memory']
    return value


def json_object_text(value: str | dict[str, Any]) -> dict[str, Any] | None:
    """The object a model sent as JSON text (some send objects that way), else None."""
    if not isinstance(value, str) or not value.lstrip().startswith('{'):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def working_memory_answer(ok: bool, error: str | None = None) -> str:
    """The tool's answer as the model reads it (the server's own tool answers the same)."""
    return json.dumps({'success': True} if ok else {'success': False, 'error': error}, ensure_ascii=False)
