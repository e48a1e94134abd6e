"""What the local stack's functions ask of AWS and of models, per function, counted from the services' answers.

`AwsMeter` hooks boto3's event system (no domain code is touched): every API call made by a boto3 client is recorded
with the function that made it (the handler running on that thread), the IAM action it needs and the resource it
names. DynamoDB calls get `ReturnConsumedCapacity=INDEXES` added, so the capacity units are the service's own answer
(dynalite computes them by DynamoDB's rules; moto answers a fixed number). Handlers wrapped with `wrap_handler` count
invocations and their wall time (what Lambda bills, rounded up to 1 ms); model calls are counted per purpose
(Observer, Reflector, title, Actor) with the o200k tokenizer.

Used by `bench/cost.py` (billable units per turn) and by `tests/infra` (every action a function takes is one its
deployed role grants).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# IAM actions of the operations whose name differs from the action (the rest are `<prefix>:<Operation>`).
_ACTIONS = {
    ('s3', 'ListObjectsV2'): 's3:ListBucket',
    ('s3', 'ListObjects'): 's3:ListBucket',
    ('s3', 'DeleteObjects'): 's3:DeleteObject',
    ('s3', 'HeadObject'): 's3:GetObject',
    ('sqs', 'SendMessageBatch'): 'sqs:SendMessage',
    ('sqs', 'DeleteMessageBatch'): 'sqs:DeleteMessage',
}
_PREFIXES = {'stepfunctions': 'states'}
# Operations that accept ReturnConsumedCapacity.
_CAPACITY_OPERATIONS = frozenset(
    {
        'GetItem',
        'PutItem',
        'UpdateItem',
        'DeleteItem',
        'Query',
        'Scan',
        'BatchGetItem',
        'BatchWriteItem',
        'TransactGetItems',
        'TransactWriteItems',
    }
)
_READS = frozenset({'GetItem', 'Query', 'Scan', 'BatchGetItem', 'TransactGetItems'})
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
_FIRST_ONLY = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*if_not_exists\(\s*\1\s*,[^)]*\)')


@dataclass(frozen=True)
class AwsCall:
    """One API call: who made it, what it needs (`action`, `resource`) and what the service said it consumed."""

    function: str
    service: str
    operation: str
    action: str
    resource: str
    status: int
    read_units: float = 0.0
    write_units: float = 0.0
    index_write_units: float = 0.0
    messages: int = 0
    bytes_sent: int = 0


@dataclass
class ModelUse:
    """Model calls of one purpose in one function, and their o200k tokens."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class AwsMeter:
    """Counts AWS calls, Lambda invocations and model tokens per function (see the module docstring)."""

    calls: list[AwsCall] = field(default_factory=list)
    invocations: Counter[str] = field(default_factory=Counter)
    billed_ms: Counter[str] = field(default_factory=Counter)
    models: dict[tuple[str, str], ModelUse] = field(default_factory=lambda: defaultdict(ModelUse))
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _session: Any = None

    # -- attribution -------------------------------------------------------------------------------------------------
    @property
    def current(self) -> str:
        """The function running on this thread, else `stack:<thread name>` (the local stack's own plumbing)."""
        return getattr(self._local, 'function', None) or f'stack:{threading.current_thread().name}'

    @contextmanager
    def acting_as(self, function: str) -> Iterator[None]:
        """Attribute calls on this thread to `function` for the duration of the block."""
        previous = getattr(self._local, 'function', None)
        self._local.function = function
        try:
            yield
        finally:
            self._local.function = previous

    def wrap_handler(self, function: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        """`handler`, counting its invocations and billed milliseconds and attributing its calls to `function`."""

        def metered(event: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                with self.acting_as(function):
                    return handler(event, context)
            finally:
                elapsed_ms = (time.perf_counter() - started) * 1000
                with self._lock:
                    self.invocations[function] += 1
                    self.billed_ms[function] += max(1, math.ceil(elapsed_ms))

        return metered

    @contextmanager
    def metering_local_stack(self) -> Iterator[AwsMeter]:
        """Hook boto3 and wrap every handler the local stack starts (`local_stack.handler_for`) for the block."""
        import om_cli.local_stack as local_stack

        original_handler_for = local_stack.handler_for
        self.install()
        local_stack.handler_for = lambda function: self.wrap_handler(function, original_handler_for(function))
        try:
            yield self
        finally:
            local_stack.handler_for = original_handler_for
            self.uninstall()

    # -- boto3 -------------------------------------------------------------------------------------------------------
    def install(self) -> AwsMeter:
        """Hook boto3's default session; clients created from now on are metered (create this before them)."""
        import boto3

        self._session = boto3._get_default_session()  # noqa: SLF001 - no public accessor for the session clients use
        events = self._session.events
        events.register('provide-client-params', _keep_params, unique_id='om-meter-params')
        events.register('before-parameter-build.dynamodb', self._ask_for_capacity, unique_id='om-meter-capacity')
        events.register('after-call', self._after_call, unique_id='om-meter-after-call')
        return self

    def uninstall(self) -> None:
        """Remove the hooks (clients created meanwhile keep a copy of them)."""
        if self._session is not None:
            self._session.events.unregister('provide-client-params', unique_id='om-meter-params')
            self._session.events.unregister('before-parameter-build.dynamodb', unique_id='om-meter-capacity')
            self._session.events.unregister('after-call', unique_id='om-meter-after-call')
            self._session = None

    def _ask_for_capacity(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in _CAPACITY_OPERATIONS:
            params.setdefault('ReturnConsumedCapacity', 'INDEXES')

    def _after_call(self, http_response: Any, parsed: dict[str, Any], model: Any, context: Any, **_: Any) -> None:
        service = model.service_model.service_name
        operation = model.name
        params = context.get('om_meter_params') or {}
        status = int(getattr(http_response, 'status_code', 0) or 0)
        prefix = _PREFIXES.get(service, service)
        action = _ACTIONS.get((service, operation), f'{prefix}:{operation}')
        reads = writes = index_writes = 0.0
        if service == 'dynamodb':
            index_writes = _index_write_units(operation, params)
            units = _capacity(parsed.get('ConsumedCapacity'))
            if operation in _READS:
                reads = units
            else:
                writes = units
                if status >= 400 and not units and operation in _CAPACITY_OPERATIONS:
                    writes = 1.0  # a refused conditional write is billed; the error carries no ConsumedCapacity
        messages = 0
        if service == 'sqs' and operation in ('SendMessage', 'ReceiveMessage', 'DeleteMessage'):
            messages = len(parsed.get('Messages') or []) if operation == 'ReceiveMessage' else 1
        elif service == 'sqs' and operation in ('SendMessageBatch', 'DeleteMessageBatch'):
            messages = len(params.get('Entries') or [])
        call = AwsCall(
            function=self.current,
            service=service,
            operation=operation,
            action=action,
            resource=_resource(service, params),
            status=status,
            read_units=reads,
            write_units=writes,
            index_write_units=index_writes,
            messages=messages,
            bytes_sent=_body_bytes(params),
        )
        with self._lock:
            self.calls.append(call)

    # -- models ------------------------------------------------------------------------------------------------------
    def count_model_call(self, purpose: str, input_text: str, output_text: str) -> None:
        """One model call of `purpose` by the current function, with its input and output text."""
        from om_lib.adapters.tiktoken_counter import get_tokenizer

        tokenizer = get_tokenizer()
        use_in, use_out = tokenizer.count(input_text), tokenizer.count(output_text)
        with self._lock:
            use = self.models[(self.current, purpose)]
            use.calls += 1
            use.input_tokens += use_in
            use.output_tokens += use_out

    # -- reading -----------------------------------------------------------------------------------------------------
    def actions_by_function(self) -> dict[str, set[tuple[str, str]]]:
        """`{function: {(IAM action, resource)}}` of the calls that succeeded or were refused by a condition."""
        found: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for call in self.calls:
            found[call.function].add((call.action, call.resource))
        return dict(found)

    def reset(self) -> None:
        """Forget everything counted so far (the hooks stay installed)."""
        with self._lock:
            self.calls.clear()
            self.invocations.clear()
            self.billed_ms.clear()
            self.models.clear()


def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    # The parameters as the caller passed them (after-call sees only the parsed response).
    context['om_meter_params'] = dict(params)


def _index_keys() -> list[tuple[str, frozenset[str], bool]]:
    """`(index, key attributes, projects the whole item)` of the table's indexes."""
    from om_lib.adapters.aws.dynamodb import schema

    found = []
    for index in (*schema.LOCAL_SECONDARY_INDEXES, *schema.GLOBAL_SECONDARY_INDEXES):
        keys = frozenset(k['AttributeName'] for k in index['KeySchema']) - {schema.PK, schema.SK}
        found.append((index['IndexName'], keys, index['Projection']['ProjectionType'] == 'ALL'))
    return found


def _index_write_units(operation: str, params: dict[str, Any]) -> float:
    """An estimate of the index writes of one write, from the request (dynalite counts the table's only).

    A put writes every index whose keys the item has (the whole item's size for an ALL projection, 1 unit for the
    keys-only ones); an update that sets an index key moves the entry (2 units), one that removes it deletes it (1),
    and `k = if_not_exists(k, v)` counts as no change. An update of other attributes of an item in an ALL-projection
    index (LSI1) also rewrites its index copy; that is not visible in the request and not counted (an underestimate).
    """
    units = 0.0
    if operation == 'PutItem':
        item = params.get('Item') or {}
        size = _item_size(item)
        for _, keys, whole in _index_keys():
            if keys and keys <= set(item):
                units += math.ceil(size / 1024) if whole else 1
    elif operation == 'UpdateItem':
        expression = str(params.get('UpdateExpression') or '')
        names = params.get('ExpressionAttributeNames') or {}
        for alias, name in names.items():
            expression = expression.replace(alias, name)
        set_part, _, remove_part = expression.partition('REMOVE')
        # `k = if_not_exists(k, v)` writes an index key only the first time: after that the entry does not move.
        first_only = set(_FIRST_ONLY.findall(set_part))
        set_names = set(_NAME.findall(_FIRST_ONLY.sub('', set_part))) - first_only
        remove_names = set(_NAME.findall(remove_part))
        for _, keys, _whole in _index_keys():
            if keys & set_names:
                units += 2
            elif keys & remove_names:
                units += 1
    elif operation == 'BatchWriteItem':
        for requests in (params.get('RequestItems') or {}).values():
            for request in requests:
                if 'PutRequest' in request:
                    units += _index_write_units('PutItem', {'Item': request['PutRequest']['Item']})
    return units


def _item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _value_size(value: dict[str, Any]) -> int:
    kind, raw = next(iter(value.items()))
    if kind in ('S', 'N'):
        return len(str(raw).encode())
    if kind == 'B':
        return len(raw)
    if kind == 'L':
        return 3 + sum(1 + _value_size(v) for v in raw)
    if kind == 'M':
        return 3 + sum(1 + len(k.encode()) + _value_size(v) for k, v in raw.items())
    return 1


def _capacity(consumed: Any) -> float:
    if not consumed:
        return 0.0
    items = consumed if isinstance(consumed, list) else [consumed]
    return float(sum(float(item.get('CapacityUnits') or 0.0) for item in items))


def _resource(service: str, params: dict[str, Any]) -> str:
    """The resource a call names, in the form the tests compare with the template (`table/<name>[/index/<i>]`…)."""
    if service == 'dynamodb':
        if 'RequestItems' in params:
            return 'table/' + ','.join(sorted(params['RequestItems']))
        if 'TransactItems' in params:
            names = {next(iter(item.values())).get('TableName', '') for item in params['TransactItems']}
            return 'table/' + ','.join(sorted(names))
        table = f'table/{params.get("TableName", "")}'
        return f'{table}/index/{params["IndexName"]}' if params.get('IndexName') else table
    if service == 's3':
        bucket = params.get('Bucket', '')
        return f'bucket/{bucket}/object' if 'Key' in params or 'Delete' in params else f'bucket/{bucket}'
    if service == 'sqs':
        return 'queue/' + str(params.get('QueueUrl', '')).rsplit('/', 1)[-1]
    if service == 'stepfunctions':
        return 'state-machine/' + str(params.get('stateMachineArn', params.get('executionArn', ''))).split(':')[-1]
    if service == 'secretsmanager':
        return 'secret/' + str(params.get('SecretId', '')).split(':')[-1]
    if service == 'events' and params.get('Entries'):
        buses = {str(e.get('EventBusName') or 'default').rsplit('/', 1)[-1] for e in params['Entries']}
        return 'event-bus/' + ','.join(sorted(buses))
    return service


def _body_bytes(params: dict[str, Any]) -> int:
    body = params.get('Body') or params.get('MessageBody') or b''
    return len(body) if isinstance(body, bytes | str) else 0
