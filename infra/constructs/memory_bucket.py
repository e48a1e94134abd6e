"""MemoryBucket: offloaded values and attachments. Private, encrypted with the stack's key, TLS only, versioned."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.constants import (
    BUCKET_ABORT_UPLOADS_DAYS,
    BUCKET_ACTIONS,
    BUCKET_INFREQUENT_ACCESS_DAYS,
    BUCKET_NONCURRENT_EXPIRY_DAYS,
    KMS_DECRYPT_ACTIONS,
    KMS_ENCRYPT_DECRYPT_ACTIONS,
    OBJECT_WRITE_ACTIONS,
    FunctionAccess,
)
from infra.constructs.memory_key import S3, MemoryKey
from infra.constructs.nag import acknowledge, logical_id


class MemoryBucket(Construct):
    """Versioned, so an overwrite or a delete (by a bug or a stolen credential) can be undone for a week.

    Noncurrent versions expire after `BUCKET_NONCURRENT_EXPIRY_DAYS`: erasing a resource (`DELETE /resources/{id}`)
    removes its objects at once and leaves only those recovery copies, which are gone a week later. Objects are
    encrypted with the stack's key by default (with an S3 Bucket Key, so KMS is called per bucket key, not per object),
    and the bucket refuses uploads that ask for another encryption.
    """

    def __init__(self, scope: Construct, construct_id: str, *, key: MemoryKey, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, construct_id)
        self.memory_key = key
        destroy = removal_policy == RemovalPolicy.DESTROY
        self.bucket = s3.Bucket(
            self,
            'Bucket',
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=key.key,
            bucket_key_enabled=True,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            lifecycle_rules=self._build_lifecycle_rules(),
            # Users' memory: by default never deleted with the stack. A throwaway stack empties it on delete.
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )
        self._refuse_other_encryption()
        acknowledge(
            self.bucket,
            'S1',
            'Only the service roles touch this bucket (no public or cross-account access); an access-log bucket would '
            "duplicate users' data paths. Turn on CloudTrail S3 data events for an audit trail.",
        )

    def report_new_objects_to_eventbridge(self) -> None:
        """S3 sends an event to EventBridge for every new object (the rules decide who hears of which). Set on the
        bucket itself (CloudFormation's `EventBridgeConfiguration`), not through CDK's notification custom resource."""
        cfn = self.bucket.node.default_child
        assert isinstance(cfn, s3.CfnBucket)
        cfn.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            event_bridge_configuration=s3.CfnBucket.EventBridgeConfigurationProperty(event_bridge_enabled=True)
        )

    def _refuse_other_encryption(self) -> None:
        # Objects without an encryption header get the bucket's default (this key); one asking for SSE-S3 or another
        # key is refused. (The Null condition makes the header's absence not match.)
        for header, expected in (
            ('s3:x-amz-server-side-encryption', 'aws:kms'),
            ('s3:x-amz-server-side-encryption-aws-kms-key-id', self.memory_key.key_arn),
        ):
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=['s3:PutObject'],
                    resources=[self.bucket.arn_for_objects('*')],
                    conditions={'StringNotEquals': {header: expected}, 'Null': {header: 'false'}},
                )
            )

    @staticmethod
    def _build_lifecycle_rules() -> list[s3.LifecycleRule]:
        return [
            # Presigned uploads that never completed cost storage and are invisible to the service.
            s3.LifecycleRule(
                id='abort-incomplete-uploads',
                abort_incomplete_multipart_upload_after=Duration.days(BUCKET_ABORT_UPLOADS_DAYS),
            ),
            # Old attachments are rarely read again; Intelligent-Tiering moves them down and back up by itself.
            s3.LifecycleRule(
                id='intelligent-tiering',
                transitions=[
                    s3.Transition(
                        storage_class=s3.StorageClass.INTELLIGENT_TIERING,
                        transition_after=Duration.days(BUCKET_INFREQUENT_ACCESS_DAYS),
                    )
                ],
            ),
            # Replaced and deleted objects are kept for recovery this long, then gone (erasure included).
            s3.LifecycleRule(
                id='expire-noncurrent-versions',
                noncurrent_version_expiration=Duration.days(BUCKET_NONCURRENT_EXPIRY_DAYS),
                expired_object_delete_marker=True,
            ),
        ]

    def grant(self, role: iam.IRole, access: FunctionAccess, *, sid: str) -> None:
        """`access.object_actions` on the objects (and ListBucket if asked), and the key's use through S3."""
        if not access.object_actions and not access.lists_bucket:
            return
        if access.object_actions:
            iam.Grant.add_to_principal(
                grantee=role,
                actions=list(access.object_actions),
                resource_arns=[self.bucket.arn_for_objects(access.object_keys)],
            )
            acknowledge(
                role,
                'IAM5',
                'Object actions on this one bucket; object keys are per user and thread, unknown at deploy time.',
                finding=f'Resource::<{logical_id(self.bucket)}.Arn>/{access.object_keys}',
            )
            writes = bool(set(access.object_actions) & set(OBJECT_WRITE_ACTIONS))
            actions = KMS_ENCRYPT_DECRYPT_ACTIONS if writes else KMS_DECRYPT_ACTIONS
            self.memory_key.allow(f'{sid}UsesTheBucket', role, actions, [S3])
        if access.lists_bucket:
            iam.Grant.add_to_principal(
                grantee=role, actions=list(BUCKET_ACTIONS), resource_arns=[self.bucket.bucket_arn]
            )
