"""MemoryTable: the DynamoDB table, built from `om_lib.adapters.aws.dynamodb.schema` so infra and the store never
drift."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constants import KMS_TABLE_USER_ACTIONS, FunctionAccess
from infra.constructs.memory_key import DYNAMODB, MemoryKey
from om_lib.adapters.aws.dynamodb import schema

_TYPES = {'S': dynamodb.AttributeType.STRING, 'N': dynamodb.AttributeType.NUMBER, 'B': dynamodb.AttributeType.BINARY}
_PROJECTIONS = {
    'ALL': dynamodb.ProjectionType.ALL,
    'KEYS_ONLY': dynamodb.ProjectionType.KEYS_ONLY,
    'INCLUDE': dynamodb.ProjectionType.INCLUDE,
}


def _attribute(name: str) -> dynamodb.Attribute:
    types = {d['AttributeName']: d['AttributeType'] for d in schema.ATTRIBUTE_DEFINITIONS}
    return dynamodb.Attribute(name=name, type=_TYPES[types[name]])


def _keys(key_schema: list[dict[str, str]]) -> tuple[dynamodb.Attribute, dynamodb.Attribute | None]:
    by_type = {k['KeyType']: k['AttributeName'] for k in key_schema}
    sort = by_type.get('RANGE')
    return _attribute(by_type['HASH']), (_attribute(sort) if sort else None)


def _projection(index: dict[str, Any]) -> dict[str, Any]:
    projection = index['Projection']
    extra = {'non_key_attributes': projection['NonKeyAttributes']} if 'NonKeyAttributes' in projection else {}
    return {'projection_type': _PROJECTIONS[projection['ProjectionType']], **extra}


class MemoryTable(Construct):
    """On-demand table encrypted with the stack's key, with PITR, deletion protection, TTL and the schema's indexes.

    `removal_policy` RETAIN (the default stack) also turns deletion protection on; DESTROY (a throwaway stack) turns it
    off, so `cdk destroy` can delete the table.
    """

    def __init__(self, scope: Construct, construct_id: str, *, key: MemoryKey, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, construct_id)
        self.memory_key = key
        partition_key, sort_key = _keys(schema.KEY_SCHEMA)
        self.table = dynamodb.TableV2(
            self,
            'Table',
            partition_key=partition_key,
            sort_key=sort_key,
            billing=dynamodb.Billing.on_demand(),
            # KMS; the key is set on the replica below (TableV2's customer_managed_key needs a region-bound stack).
            encryption=dynamodb.TableEncryptionV2.aws_managed_key(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=schema.TTL_ATTRIBUTE,
            local_secondary_indexes=[self._build_lsi(index) for index in schema.LOCAL_SECONDARY_INDEXES],
            global_secondary_indexes=[self._build_gsi(index) for index in schema.GLOBAL_SECONDARY_INDEXES],
            # Users' memory: by default never deleted with the stack, nor by a stray DeleteTable.
            removal_policy=removal_policy,
            deletion_protection=removal_policy != RemovalPolicy.DESTROY,
        )
        cfn = self.table.node.default_child
        assert isinstance(cfn, dynamodb.CfnGlobalTable)
        cfn.add_property_override('Replicas.0.SSESpecification.KMSMasterKeyId', key.key_arn)

    @staticmethod
    def _build_lsi(index: dict[str, Any]) -> dynamodb.LocalSecondaryIndexProps:
        _, sort_key = _keys(index['KeySchema'])
        assert sort_key is not None, f'{index["IndexName"]}: a local index needs a sort key'
        return dynamodb.LocalSecondaryIndexProps(index_name=index['IndexName'], sort_key=sort_key, **_projection(index))

    @staticmethod
    def _build_gsi(index: dict[str, Any]) -> dynamodb.GlobalSecondaryIndexPropsV2:
        partition_key, sort_key = _keys(index['KeySchema'])
        return dynamodb.GlobalSecondaryIndexPropsV2(
            index_name=index['IndexName'], partition_key=partition_key, sort_key=sort_key, **_projection(index)
        )

    @property
    def index_names(self) -> list[str]:
        """The indexes the table's schema declares (`om_lib.adapters.aws.dynamodb.schema`)."""
        return [i['IndexName'] for i in (*schema.LOCAL_SECONDARY_INDEXES, *schema.GLOBAL_SECONDARY_INDEXES)]

    def grant(self, role: iam.IRole, access: FunctionAccess, *, sid: str) -> None:
        """`access.table_actions` on the table and `access.indexes`, and use of the key through DynamoDB."""
        unknown = set(access.indexes) - set(self.index_names)
        if unknown:
            raise ValueError(f'{sid}: no index {sorted(unknown)} in the table schema (indexes: {self.index_names})')
        iam.Grant.add_to_principal(
            grantee=role,
            actions=list(access.table_actions),
            # Each index by name (no `index/*`).
            resource_arns=[
                self.table.table_arn,
                *(f'{self.table.table_arn}/index/{name}' for name in access.indexes),
            ],
        )
        self.memory_key.allow(f'{sid}UsesTheTable', role, KMS_TABLE_USER_ACTIONS, [DYNAMODB])
