"""The memory table on DynamoDB (docs/storage.md has the design and the reasons).

- `schema`: the table's keys and indexes; the store, the local stack and the CDK app read them from here.
- `batch`: `BatchWriteItem` and `BatchGetItem` until every request is processed, backing off between rounds.
- `store`: `DynamoMemoryStore`, the production `MemoryStore`.
- `vectors`: `DynamoVectorIndex`, message vectors in the same table.

May import: `om_lib.adapters.aws` (its error table and S3) and the shared modules of `om_lib`.
"""
