"""Adapters on AWS services.

- `dynamodb/`: `DynamoMemoryStore` (the production `MemoryStore`) and `DynamoVectorIndex`, on one table.
- `s3`: offloaded values and attachments, and the `BlobReader` that reads them back.
- `work`: `AwsBackgroundWork`: observation jobs onto SQS, reflection jobs as Step Functions executions.
- `eventbridge`: `EventBridgePublisher`: lifecycle events onto a bus.
- `errors`: AWS SDK errors translated into `om_lib.errors`, in one table.

May import: the shared modules of `om_lib`, and each other (`dynamodb/` uses `errors` and `s3`).
"""
