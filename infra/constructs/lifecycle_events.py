"""LifecycleEvents: the memory's outcomes as EventBridge events, so a team reacts without polling.

Every observation, reflection, buffering, activation and failure (each `data-om-*` part the memory makes, with the
model usage behind it) is published by the function that made it onto this bus (`om_lib/events.py`): detail type =
the part's type, source `observational-memory`. Only the functions that publish may `events:PutEvents`, on this bus
only. The bus is encrypted with the stack's key (EventBridge may use it for this bus only); events it cannot encrypt or
decrypt go to a dead-letter queue (alarmed).

Optionally (`-c lifecycleEventsQueue=true`) a rule with the events' pattern puts them on an encrypted queue (with its
own dead-letter queue) for a consumer of the team's; any other target is a rule of the team's own on the bus (its
name and ARN are outputs).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.constants import (
    DLQ_RETENTION_DAYS,
    EVENT_PUBLISH_ACTIONS,
    LIFECYCLE_QUEUE_MAX_RECEIVES,
    QUEUE_RETENTION_DAYS,
)
from infra.constructs.memory_key import MemoryKey
from infra.constructs.nag import acknowledge
from om_lib.events import EVENT_SOURCE, lifecycle_event_pattern


class LifecycleEvents(Construct):
    """The bus (encrypted, with a dead-letter queue), its publishers' grants, and the optional queue behind a rule."""

    def __init__(self, scope: Construct, construct_id: str, *, key: MemoryKey, queue: bool = False) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = key
        # Named, so the key policy and the queues' policies name its ARN as a plain string (no reference cycle).
        self.bus_name = f'{stack.stack_name}-lifecycle'
        self.bus_arn = stack.format_arn(service='events', resource='event-bus', resource_name=self.bus_name)
        self.bus_dead_letter_queue = key.new_queue(
            self,
            'BusDeadLetterQueue',
            retention_days=DLQ_RETENTION_DAYS,
        )
        acknowledge(
            self.bus_dead_letter_queue,
            'SQS3',
            "it is a dead-letter queue itself: the lifecycle event bus's, for events EventBridge could not encrypt or "
            'decrypt (cdk-nag knows only queues named in a redrive policy as dead-letter queues)',
        )
        self.bus = events.EventBus(
            self,
            'Bus',
            event_bus_name=self.bus_name,
            description=f'Lifecycle events of {stack.stack_name}: observations, reflections, buffering, activations, '
            'failures',
            kms_key=key.key,
            dead_letter_queue=self.bus_dead_letter_queue,
        )
        key.allow_event_bus('EventBridgeEncryptsLifecycleEvents', self.bus_arn)
        self._let_eventbridge_send(self.bus_dead_letter_queue, 'TheLifecycleBusSendsUndeliverableEvents', self.bus_arn)

        self.queue: sqs.Queue | None = None
        self.queue_dead_letter_queue: sqs.Queue | None = None
        if queue:
            self._queue_behind_a_rule(stack)

    def _queue_behind_a_rule(self, stack: Stack) -> None:
        key = self.key
        self.queue_dead_letter_queue = key.new_queue(
            self,
            'QueueDeadLetterQueue',
            retention_days=DLQ_RETENTION_DAYS,
        )
        self.queue = key.new_queue(
            self,
            'Queue',
            retention_days=QUEUE_RETENTION_DAYS,
            dead_letter_queue=sqs.DeadLetterQueue(
                max_receive_count=LIFECYCLE_QUEUE_MAX_RECEIVES, queue=self.queue_dead_letter_queue
            ),
        )
        rule_name = f'{stack.stack_name}-lifecycle-events'
        rule_arn = stack.format_arn(service='events', resource='rule', resource_name=f'{self.bus_name}/{rule_name}')
        pattern = lifecycle_event_pattern()
        self.rule = events.Rule(
            self,
            'ToQueue',
            rule_name=rule_name,
            event_bus=self.bus,
            description='Every lifecycle event, onto the lifecycle events queue',
            event_pattern=events.EventPattern(source=pattern['source']),
        )
        # The target by hand: CDK's SqsQueue target would let every rule of the account send to the queue.
        cfn_rule = self.rule.node.default_child
        assert isinstance(cfn_rule, events.CfnRule)
        cfn_rule.targets = [events.CfnRule.TargetProperty(id='LifecycleEventsQueue', arn=self.queue.queue_arn)]
        self._let_eventbridge_send(self.queue, 'TheLifecycleRuleSendsEvents', rule_arn)
        key.allow_eventbridge_rule('EventBridgeQueuesLifecycleEvents', rule_arn)

    def _let_eventbridge_send(self, queue: sqs.Queue, sid: str, source_arn: str) -> None:
        queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid=sid,
                principals=[iam.ServicePrincipal('events.amazonaws.com')],
                actions=['sqs:SendMessage'],
                resources=[queue.queue_arn],
                conditions={'ArnEquals': {'aws:SourceArn': source_arn}},
            )
        )

    def grant_publish(self, grantee: iam.IRole) -> None:
        """`events:PutEvents` on this bus only (publishers need no key: EventBridge encrypts with its own grant)."""
        iam.Grant.add_to_principal(grantee=grantee, actions=list(EVENT_PUBLISH_ACTIONS), resource_arns=[self.bus_arn])

    @property
    def dead_letter_queues(self) -> list[sqs.IQueue]:
        """Its dead-letter queues (alarmed with the others)."""
        queues: list[sqs.IQueue] = [self.bus_dead_letter_queue]
        if self.queue_dead_letter_queue is not None:
            queues.append(self.queue_dead_letter_queue)
        return queues


__all__ = ['EVENT_SOURCE', 'LifecycleEvents']
