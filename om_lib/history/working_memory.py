"""Working memory (seed 003): a block the agent keeps up to date about the user, shown in every Actor system message.

Two formats, never both (`workingMemory.template` or `workingMemory.schema`):

- **Markdown** (a template, or the default one): replace semantics. Every update is the complete new text.
- **JSON** (a JSON Schema): merge semantics. An update names only what changes: objects are deep-merged, `null`
  deletes a field, arrays (and every other value) are replaced. The merged document must satisfy the schema.

Scope: `resource` (default; shared by every thread of the resource) or `thread` (each thread has its own). The same
update rules apply everywhere an update comes from: the Actor's `updateWorkingMemory` tool, the working-memory
routes and a thread's `metadata.workingMemory` (the initial value). An invalid update is refused with
`InvalidWorkingMemoryError` (what was wrong, field by field) and changes nothing. Writes are conditional on the
stored version; a lost race re-reads, re-applies and retries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from om_lib.config import WorkingMemoryConfig
from om_lib.errors import (
    InvalidInputError,
    InvalidWorkingMemoryError,
    OMError,
    VersionConflictError,
    WorkingMemoryDisabledError,
    WorkingMemoryTooLargeError,
)
from om_lib.llm import FunctionDeclaration
from om_lib.ports import Clock, MemoryStore
from om_lib.records import WorkingMemoryRecord

Format = Literal['markdown', 'json']

TOOL_NAME = 'updateWorkingMemory'
# Stored documents stay far below DynamoDB's 400 KB item limit.
MAX_WORKING_MEMORY_BYTES = 64 * 1024
MAX_ATTEMPTS = 4
# Errors listed in a refusal (a schema can produce many).
MAX_DETAILS = 20
# Nesting of a JSON update (merging and validation recurse; nobody's profile is this deep).
MAX_DEPTH = 32

# The seed's default template (used when neither `template` nor `schema` is set).
DEFAULT_TEMPLATE = """# User Information
- **First Name**:
- **Last Name**:
- **Location**:
- **Occupation**:
- **Interests**:
- **Goals**:
- **Events**:
- **Facts**:
- **Projects**:
"""


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` merged into `base`: objects deep-merged, `None` deletes a field, anything else (arrays too) replaces."""
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        elif isinstance(value, Mapping):
            merged[key] = deep_merge({}, value)  # nulls inside a new object mean "absent"
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True)
class WorkingMemoryView:
    """What the routes answer: the value (None when nothing is stored), its scope and its format."""

    value: str | dict[str, Any] | None
    scope: Literal['thread', 'resource']
    format: Format

    def to_json(self) -> dict[str, Any]:
        """`{workingMemory, scope, format}` (CONTRACT §2)."""
        return {'workingMemory': self.value, 'scope': self.scope, 'format': self.format}


class WorkingMemory:
    """Working memory for one configuration, over a store.

    Args:
        config: The `workingMemory` options (enabled).
        store: Where working memory is kept.
        clock: Write times.
    """

    def __init__(self, config: WorkingMemoryConfig, store: MemoryStore, clock: Clock) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.format: Format = 'json' if config.json_schema is not None else 'markdown'
        self.template = config.template if config.template is not None else DEFAULT_TEMPLATE
        self._validator = None
        if config.json_schema is not None:
            # Imported here: jsonschema costs ~60 ms of every function's cold start, and only schema mode needs it.
            from jsonschema import Draft202012Validator
            from jsonschema.validators import validator_for

            cls = validator_for(config.json_schema, default=Draft202012Validator)
            self._validator = cls(config.json_schema)

    @property
    def scope(self) -> Literal['thread', 'resource']:
        """The configured scope."""
        return self.config.scope

    def _owner(self, thread_id: str | None) -> str | None:
        """The store key's thread part: the thread in thread scope, None (the resource) in resource scope."""
        if self.scope == 'thread':
            if thread_id is None:
                raise WorkingMemoryDisabledError(
                    "working memory is thread-scoped in this configuration (workingMemory.scope: 'thread'): "
                    'use /threads/{threadId}/working-memory'
                )
            return thread_id
        return None

    # -- reading and writing ----------------------------------------------------------------------------------------
    def get(self, resource_id: str, thread_id: str | None) -> WorkingMemoryView:
        """The working memory a thread sees (`thread_id`), or the resource's (`thread_id=None`, resource scope)."""
        stored = self.store.get_working_memory(resource_id, self._owner(thread_id))
        value = stored.content if stored is not None and stored.format == self.format else None
        return WorkingMemoryView(value, self.scope, self.format)

    def check(self, update: Any, current: str | dict[str, Any] | None = None) -> str | dict[str, Any]:
        """The working memory after `update` (replace or merge), or InvalidWorkingMemoryError; writes nothing."""
        if self.format == 'markdown':
            if not isinstance(update, str):
                raise InvalidWorkingMemoryError(
                    f'working memory is Markdown text here (replace semantics): send the whole text as a string, '
                    f'not {_json_type(update)}',
                    [{'field': 'workingMemory', 'type': 'type_error', 'message': 'expected a string'}],
                )
            result: str | dict[str, Any] = update
        else:
            if not isinstance(update, Mapping):
                raise InvalidWorkingMemoryError(
                    'working memory is a JSON object here (merge semantics): send an object with the fields to add '
                    f'or change (null deletes a field), not {_json_type(update)}',
                    [{'field': 'workingMemory', 'type': 'type_error', 'message': 'expected an object'}],
                )
            if _depth(update) > MAX_DEPTH:
                raise InvalidWorkingMemoryError(
                    f'the update is nested more than {MAX_DEPTH} levels deep; keep working memory flat',
                    [{'field': 'workingMemory', 'type': 'too_deep', 'message': f'more than {MAX_DEPTH} levels'}],
                )
            base = current if isinstance(current, Mapping) else {}
            result = deep_merge(base, update)
            assert self._validator is not None
            errors = sorted(self._validator.iter_errors(result), key=lambda e: list(e.absolute_path))
            if errors:
                details = [
                    {
                        'field': '/'.join(str(p) for p in e.absolute_path) or '(root)',
                        'type': 'schema_violation',
                        'message': e.message,
                    }
                    for e in errors[:MAX_DETAILS]
                ]
                first = details[0]
                raise InvalidWorkingMemoryError(
                    f'the working memory would not match workingMemory.schema: {first["field"]}: {first["message"]}'
                    + (f' (and {len(errors) - 1} more)' if len(errors) > 1 else '')
                    + '; nothing was changed',
                    details,
                )
        size = len(json.dumps(result, ensure_ascii=False).encode())
        if size > MAX_WORKING_MEMORY_BYTES:
            raise WorkingMemoryTooLargeError(
                f'the working memory would be {size} bytes; at most {MAX_WORKING_MEMORY_BYTES} are kept. '
                'Keep it short: it is sent with every message',
                [
                    {
                        'field': 'workingMemory',
                        'type': 'too_large',
                        'message': f'{size} > {MAX_WORKING_MEMORY_BYTES}',
                        'limit': MAX_WORKING_MEMORY_BYTES,
                    }
                ],
            )
        return result

    def update(self, resource_id: str, thread_id: str | None, update: Any) -> WorkingMemoryView:
        """Apply one update (Markdown replaces, JSON merges) and store it; refused updates change nothing.

        Raises:
            InvalidWorkingMemoryError: The update does not fit the format or the schema.
            ThreadNotFoundError: Thread scope, and the thread is missing or another resource's.
            VersionConflictError: Lost the race `MAX_ATTEMPTS` times in a row.
        """
        owner = self._owner(thread_id)
        for attempt in range(MAX_ATTEMPTS):
            stored = self.store.get_working_memory(resource_id, owner)
            current = stored.content if stored is not None and stored.format == self.format else None
            value = self.check(update, current)
            record = WorkingMemoryRecord(
                scope=self.scope,
                resource_id=resource_id,
                thread_id=owner,
                format=self.format,
                content=value,
                updated_at=self.clock.now(),
            )
            try:
                self.store.put_working_memory(record, expected_version=stored.version if stored else None)
            except VersionConflictError:
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                continue
            return WorkingMemoryView(value, self.scope, self.format)
        raise AssertionError('unreachable')

    # -- what the Actor sees ----------------------------------------------------------------------------------------
    def system_text(self, resource_id: str, thread_id: str, *, read_only: bool) -> str:
        """The working-memory block of the Actor's system message (the template or schema, and what is stored)."""
        value = self.get(resource_id, thread_id).value
        writable = not (read_only or self.config.read_only)
        where = 'across all conversations with this user' if self.scope == 'resource' else 'for this conversation'
        lines = [
            '<working_memory>',
            f'Working memory: what you keep about the user and the task {where}. Treat it as known facts.',
        ]
        if self.format == 'markdown':
            data = value if isinstance(value, str) and value.strip() else '(empty: nothing stored yet)'
            if writable:
                lines.append(
                    f'When you learn something worth keeping (name, preferences, goals, facts), call {TOOL_NAME} with '
                    'the complete updated Markdown, following the template: it replaces what is stored, so keep '
                    'everything that is still true. Do not mention working memory to the user.'
                )
            lines += ['<working_memory_template>', self.template.strip(), '</working_memory_template>']
        else:
            data = json.dumps(value or {}, ensure_ascii=False, indent=2)
            if writable:
                lines.append(
                    f'When you learn something worth keeping, call {TOOL_NAME} with a JSON object holding only the '
                    'fields to add or change: objects are merged, null deletes a field, arrays are replaced whole. '
                    'It must fit the schema. Do not mention working memory to the user.'
                )
            schema = json.dumps(self.config.json_schema, ensure_ascii=False)
            lines += ['<working_memory_schema>', schema, '</working_memory_schema>']
        if not writable:
            lines.append('Working memory is read-only here: use it, but you cannot change it.')
        lines += ['<working_memory_data>', data, '</working_memory_data>', '</working_memory>']
        return '\n'.join(lines)

    def tool(self) -> FunctionDeclaration:
        """The `updateWorkingMemory` declaration for this format."""
        if self.format == 'markdown':
            memory: dict[str, Any] = {
                'type': 'string',
                'description': 'The complete working memory in Markdown, following the template (replaces it).',
            }
            description = 'Replace the working memory with updated Markdown (keep what is still true).'
        else:
            memory = {
                'type': 'object',
                'description': (
                    'Only the fields to add or change: objects are merged, null deletes a field, arrays are replaced. '
                    'The result must match this JSON Schema: ' + json.dumps(self.config.json_schema, ensure_ascii=False)
                ),
            }
            description = 'Update the working memory (JSON, merged into what is stored).'
        return FunctionDeclaration(
            name=TOOL_NAME,
            description=description,
            parameters={'type': 'object', 'properties': {'memory': memory}, 'required': ['memory']},
        )

    def tools(self, *, read_only: bool) -> list[FunctionDeclaration]:
        """The tools to offer the Actor: `updateWorkingMemory` unless read-only (configured or for this request)."""
        return [] if read_only or self.config.read_only else [self.tool()]

    def run_tool(self, args: Any, resource_id: str, thread_id: str) -> tuple[dict[str, Any], bool]:
        """Run one `updateWorkingMemory` call: `({success: true}, False)`, or `({success: false, error}, True)`."""
        if not isinstance(args, Mapping) or 'memory' not in args:
            return {'success': False, 'error': f'{TOOL_NAME} needs one argument, `memory`'}, True
        memory = args['memory']
        if self.format == 'json' and isinstance(memory, str):
            # Some models send the object as JSON text.
            try:
                memory = json.loads(memory)
            except ValueError:
                pass
        try:
            self.update(resource_id, thread_id, memory)
        except InvalidInputError as exc:
            return {'success': False, 'error': str(exc)}, True
        except OMError as exc:
            return {'success': False, 'error': f'working memory could not be saved right now ({exc.code})'}, True
        return {'success': True}, False


def working_memory_of(config: WorkingMemoryConfig | None, store: MemoryStore, clock: Clock) -> WorkingMemory | None:
    """A `WorkingMemory` when the configuration turns it on, else None."""
    return WorkingMemory(config, store, clock) if config is not None and config.enabled else None


def _depth(value: Any) -> int:
    """How deeply objects and arrays nest in `value` (iterative: a hostile document cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _json_type(value: Any) -> str:
    if value is None:
        return 'null'
    if isinstance(value, bool):
        return 'a boolean'
    if isinstance(value, int | float):
        return 'a number'
    if isinstance(value, str):
        return 'a string'
    if isinstance(value, list):
        return 'an array'
    return 'an object'
