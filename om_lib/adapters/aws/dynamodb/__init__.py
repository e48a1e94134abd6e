"""The memory table on DynamoDB (docs/storage.md has the design and the reasons).

- `schema`: the table's keys and indexes; the store, the local stack and the CDK app read them from here.
- `items`: the item layout, pure: keys, attribute values, items to records and threads and back.
- `batch`: `BatchWriteItem` and `BatchGetItem` until every request is processed, backing off between rounds.
- `table`: the client, the bucket and the low-level item access the store's parts share.
- `threads`, `records`, `messages`: the store's methods, by what they touch (threads with their index marks and
  erase; OM heads and generations; messages, sequence numbers and placeholders).
- `store`: `DynamoMemoryStore`, the production `MemoryStore`: all of the above, plus kept failures, working memory
  and turn claims.
- `vectors`: `DynamoVectorIndex`, message vectors in the same table.

May import: `om_lib.adapters.aws` (its error table and S3) and the shared modules of `om_lib`.
"""
