"""The observation path: messages in, observations out.

- `observation`: `ObservationPipeline`, the one pipeline that observes messages (thread and resource scope as
  strategies), and commits through the record writer.
- `buffering`: async buffering's pure arithmetic (slices, chunk activation, what a background reflection covers).
- `buffered`: `ObservationBuffering`, the room that queues buffering slices and activates chunks.
- `resource_scope`: resource scope's pure parts (thread sections, selection, batching, shown ids).
- `resource_view`: what a step of one thread reads of its resource's pending threads.
- `background`: the outcomes of background work that the next step reports, exactly once.

May import: `om_lib.runtime`, `om_lib.prompts`, `om_lib.config`, `om_lib.context`, `om_lib.models` and the shared
modules.
"""
