"""MemoryKey: the customer-managed KMS key for everything the stack stores, with rotation and a closed key policy.

The key policy is the whole story of who may use the key (the account's IAM policies cannot add users):

- the account administers it (explicit management actions, none that encrypts or decrypts);
- each function role uses it only through the services it calls (`kms:ViaService`), with only the actions it needs
  (a reader of the bucket may decrypt, not encrypt);
- CloudWatch Logs uses it for this account's log groups, CloudWatch alarms for the encrypted alarm topic;
- the deployment role creates the table and the secret with it (through DynamoDB and Secrets Manager only);
- operators named with `-c operatorRoleArns=...` may put the model API keys and inspect or redrive the dead-letter queue
  (through Secrets Manager and SQS only).

The policy is built by this construct alone: the key handed to other constructs is a reference (`key`), so their
grants cannot widen it behind our back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.constants import (
    KMS_ADMIN_ACTIONS,
    KMS_ALARM_PUBLISHER_ACTIONS,
    KMS_ENCRYPT_DECRYPT_ACTIONS,
    KMS_LOGS_ACTIONS,
    KMS_PENDING_WINDOW_DAYS,
    KMS_TABLE_CREATOR_ACTIONS,
)

# Services a principal may use the key through (the `kms:ViaService` values).
KmsService = str
DYNAMODB, S3, SQS, SECRETS_MANAGER = 'dynamodb', 's3', 'sqs', 'secretsmanager'


class MemoryKey(Construct):
    """A symmetric key with yearly rotation; `allow` adds a principal's use of it through named services."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        removal_policy: RemovalPolicy,
        deploy_role_arn: str,
        operator_role_arns: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.document = iam.PolicyDocument()
        self.cfn = kms.CfnKey(
            self,
            'Key',
            description=f'{stack.stack_name}: table, bucket, queues, logs, alarm topic and secrets of the service',
            enable_key_rotation=True,
            pending_window_in_days=KMS_PENDING_WINDOW_DAYS,
            # Resolved at synth, so statements added by `allow` after this point are in it.
            key_policy=self.document,
        )
        # The key outlives a retained table and bucket: without it their data could never be read again.
        self.cfn.apply_removal_policy(removal_policy)
        self.key: kms.IKey = kms.Key.from_key_arn(self, 'Ref', self.cfn.attr_arn)
        self.alias = kms.CfnAlias(self, 'Alias', alias_name=f'alias/{stack.stack_name}', target_key_id=self.cfn.ref)
        self.alias.apply_removal_policy(removal_policy)

        self._statement(
            'Administration',
            principals=[iam.AccountRootPrincipal()],
            actions=KMS_ADMIN_ACTIONS,
        )
        region, account, partition = stack.region, stack.account, stack.partition
        self._statement(
            'CloudWatchLogsOfThisAccount',
            principals=[iam.ServicePrincipal(f'logs.{region}.amazonaws.com')],
            actions=KMS_LOGS_ACTIONS,
            conditions={
                'ArnLike': {
                    'kms:EncryptionContext:aws:logs:arn': f'arn:{partition}:logs:{region}:{account}:log-group:*'
                }
            },
        )
        self._statement(
            'CloudWatchAlarmsPublishToTheAlarmTopic',
            principals=[iam.ServicePrincipal('cloudwatch.amazonaws.com')],
            # As AWS documents it for alarm actions on an encrypted topic (publishing still needs the topic's policy).
            actions=KMS_ALARM_PUBLISHER_ACTIONS,
        )
        self._statement(
            'DeploymentCreatesTheTableAndSecret',
            principals=[iam.ArnPrincipal(deploy_role_arn)],
            actions=KMS_TABLE_CREATOR_ACTIONS,
            conditions=self._via([DYNAMODB, SECRETS_MANAGER]),
        )
        if operator_role_arns:
            self._statement(
                'OperatorsPutTheModelKeyAndRedriveJobs',
                principals=[iam.ArnPrincipal(arn) for arn in operator_role_arns],
                actions=KMS_ENCRYPT_DECRYPT_ACTIONS,
                conditions=self._via([SECRETS_MANAGER, SQS]),
            )

    @property
    def key_arn(self) -> str:
        """The key's ARN."""
        return self.cfn.attr_arn

    def new_queue(self, scope: Construct, construct_id: str, *, retention_days: int, **props: Any) -> sqs.Queue:
        """An SQS queue encrypted with this key and reachable over TLS only, keeping messages `retention_days`;
        `props` adds the queue's own settings (FIFO, visibility timeout, dead-letter queue ...)."""
        return sqs.Queue(
            scope,
            construct_id,
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=self.key,
            enforce_ssl=True,
            retention_period=Duration.days(retention_days),
            **props,
        )

    def allow(
        self, sid: str, principal: iam.IPrincipal, actions: Iterable[str], services: Iterable[KmsService]
    ) -> None:
        """Let `principal` use the key with `actions`, through `services` only."""
        self._statement(
            sid, principals=[principal], actions=tuple(sorted(set(actions))), conditions=self._via(services)
        )

    def allow_eventbridge_rule(self, sid: str, rule_arn: str) -> None:
        """Let EventBridge deliver one rule's (or one bus's dead-letter) events to a queue encrypted with the key (as
        AWS documents for encrypted SQS targets: GenerateDataKey and Decrypt), for that source only."""
        self._statement(
            sid,
            principals=[iam.ServicePrincipal('events.amazonaws.com')],
            actions=('kms:Decrypt', 'kms:GenerateDataKey'),
            conditions={'ArnEquals': {'aws:SourceArn': rule_arn}},
        )

    def allow_event_bus(self, sid: str, bus_arn: str) -> None:
        """Let EventBridge encrypt and decrypt one bus's events with the key (as AWS documents for a bus with a
        customer managed key): DescribeKey to check the key, GenerateDataKey and Decrypt for that bus only."""
        self._statement(
            f'{sid}DescribesTheKey',
            principals=[iam.ServicePrincipal('events.amazonaws.com')],
            actions=('kms:DescribeKey',),
            conditions={'StringEquals': {'aws:SourceAccount': Stack.of(self).account}},
        )
        self._statement(
            sid,
            principals=[iam.ServicePrincipal('events.amazonaws.com')],
            actions=('kms:Decrypt', 'kms:GenerateDataKey'),
            conditions={
                'StringEquals': {'kms:EncryptionContext:aws:events:event-bus:arn': bus_arn},
                'ArnEquals': {'aws:SourceArn': bus_arn},
            },
        )
        # Events it cannot deliver go to the bus's dead-letter queue, encrypted with the key through SQS.
        self.allow_eventbridge_rule(f'{sid}DeadLetters', bus_arn)

    def _via(self, services: Iterable[KmsService]) -> dict[str, dict[str, list[str]]]:
        region = Stack.of(self).region
        return {'StringEquals': {'kms:ViaService': [f'{s}.{region}.amazonaws.com' for s in sorted(set(services))]}}

    def _statement(
        self,
        sid: str,
        *,
        principals: list[iam.IPrincipal],
        actions: Sequence[str],
        conditions: Mapping[str, object] | None = None,
    ) -> None:
        self.document.add_statements(
            iam.PolicyStatement(
                sid=sid,
                principals=principals,
                actions=list(actions),
                # In a key policy `*` means this key.
                resources=['*'],
                conditions=conditions,
            )
        )
