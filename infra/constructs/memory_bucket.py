"""MemoryBucket: offloaded values and attachments. Private, encrypted, TLS only, with lifecycle rules."""

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
    BUCKET_OBJECT_ACTIONS,
)
from infra.constructs.nag import acknowledge, logical_id


class MemoryBucket(Construct):
    """Unversioned on purpose: erasing a resource (`DELETE /resources/{id}`) must leave no old versions behind."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket(
            self,
            'Bucket',
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=False,
            lifecycle_rules=self._build_lifecycle_rules(),
            # Users' memory: never deleted with the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            self.bucket,
            'S1',
            'Only the service roles touch this bucket (no public or cross-account access); an access-log bucket would '
            "duplicate users' data paths. Turn on CloudTrail S3 data events for an audit trail.",
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
            # Only relevant if someone turns versioning on: erased data must not linger as old versions.
            s3.LifecycleRule(
                id='expire-noncurrent-versions',
                noncurrent_version_expiration=Duration.days(BUCKET_NONCURRENT_EXPIRY_DAYS),
                expired_object_delete_marker=True,
            ),
        ]

    def grant_data_access(self, role: iam.IRole) -> None:
        """Read, write, delete and list the service's objects (explicit actions, no wildcards)."""
        iam.Grant.add_to_principal(
            grantee=role, actions=list(BUCKET_OBJECT_ACTIONS), resource_arns=[self.bucket.arn_for_objects('*')]
        )
        iam.Grant.add_to_principal(grantee=role, actions=list(BUCKET_ACTIONS), resource_arns=[self.bucket.bucket_arn])
        acknowledge(
            role,
            'IAM5',
            'Object actions on this one bucket; object keys are per user and thread, unknown at deploy time.',
            finding=f'Resource::<{logical_id(self.bucket)}.Arn>/*',
        )
