"""MemoryTable: the DynamoDB table, built from `om_lib.adapters.dynamodb_schema` so infra and the store never drift."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constants import TABLE_ACTIONS
from om_lib.adapters import dynamodb_schema as schema

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
    """On-demand table with PITR, KMS encryption (AWS-managed key), TTL on `expires_at`, LSI1 on seq and GSI1."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        partition_key, sort_key = _keys(schema.KEY_SCHEMA)
        self.table = dynamodb.TableV2(
            self,
            'Table',
            partition_key=partition_key,
            sort_key=sort_key,
            billing=dynamodb.Billing.on_demand(),
            encryption=dynamodb.TableEncryptionV2.aws_managed_key(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=schema.TTL_ATTRIBUTE,
            local_secondary_indexes=[self._build_lsi(index) for index in schema.LOCAL_SECONDARY_INDEXES],
            global_secondary_indexes=[self._build_gsi(index) for index in schema.GLOBAL_SECONDARY_INDEXES],
            # Users' memory: never deleted with the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )

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
        """LSI1 and GSI1 (from dynamodb_schema)."""
        return [i['IndexName'] for i in (*schema.LOCAL_SECONDARY_INDEXES, *schema.GLOBAL_SECONDARY_INDEXES)]

    def grant_data_access(self, grantee: iam.IGrantable) -> None:
        """The store's item and query actions on the table and its indexes (explicit actions, no wildcards)."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(TABLE_ACTIONS),
            # Each index by name (no `index/*`): the indexes are the ones dynamodb_schema declares.
            resource_arns=[
                self.table.table_arn,
                *(f'{self.table.table_arn}/index/{name}' for name in self.index_names),
            ],
        )
