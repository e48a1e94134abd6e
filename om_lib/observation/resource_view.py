"""Resource scope, the read side: what a step of one thread sees of the resource's shared memory (spec §17, seed
004, docs/resource_scope.md).

What a step reads is bounded by the resource's *pending* threads (those with messages the record has not observed,
listed by the store's pending index), never by how many threads the resource has. Other threads' unobserved messages
reach the Actor as `<other-conversation>` blocks until they are observed, and count toward the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from om_lib.observation import resource_scope as rs
from om_lib.observation.observation import Backlog, ResourceStrategy, backlog_of
from om_lib.prompts import observer as obs
from om_lib.records import OMRecord
from om_lib.runtime.runtime import Runtime

# How many pending threads a step looks at, and how many of each other thread's newest unobserved messages the
# Actor sees (the rest stay pending and are counted; they reach the Actor once observed).
MAX_PENDING_THREADS = 50
OTHER_THREAD_MESSAGES = 20
OTHER_THREAD_PART_CHARS = 500


@dataclass
class ResourceSnapshot:
    """The resource's unobserved messages as one thread's step sees them."""

    thread_id: str
    backlogs: dict[str, Backlog]
    blocks: str = ''
    block_tokens: int = 0
    others: list[Backlog] = field(default_factory=list)

    @property
    def current(self) -> Backlog:
        """This thread's own backlog (empty when it has none)."""
        return self.backlogs.get(self.thread_id) or Backlog(self.thread_id, (), 0)

    @property
    def pending(self) -> int:
        """Tokens counting toward the threshold: this thread's backlog plus the other conversations' blocks."""
        return self.current.tokens + self.block_tokens


class ResourceView:
    """Reads of the resource's pending threads for a step, the turn and the worker."""

    def __init__(self, rt: Runtime, strategy: ResourceStrategy) -> None:
        self.rt = rt
        self.strategy = strategy

    def snapshot(self, record: OMRecord, thread_id: str) -> ResourceSnapshot:
        """Every pending thread's backlog and this thread's view of the others."""
        backlogs = self.backlogs(record, record.resource_id, current=thread_id)
        others = [b for t, b in backlogs.items() if t != thread_id]
        blocks = self.other_conversation_blocks(record, others)
        tokens = self.rt.counter.count_string(blocks) if blocks else 0
        return ResourceSnapshot(thread_id, backlogs, blocks, tokens, others)

    def backlogs(self, record: OMRecord, resource_id: str, *, current: str | None) -> dict[str, Backlog]:
        """Unobserved messages of the current thread and of every pending thread (stale marks are cleared)."""
        rt = self.rt
        thread_ids = [p.thread_id for p in rt.store.list_pending_threads(resource_id, limit=MAX_PENDING_THREADS)]
        if current is not None and current not in thread_ids:
            thread_ids.insert(0, current)
        out: dict[str, Backlog] = {}
        for tid in thread_ids:
            cursor = record.cursor(tid)
            backlog = backlog_of(tid, rt.load_after(resource_id, tid, cursor), rt)
            if not backlog.messages:
                if tid != current:
                    rt.store.clear_pending(resource_id, tid, observed_through=cursor)
                continue
            out[tid] = backlog
        return out

    def other_conversation_blocks(self, record: OMRecord, others: Sequence[Backlog]) -> str:
        """The `<other-conversation>` blocks for the Actor: each other thread's newest unobserved messages."""
        codec = self.strategy.codec(record.resource_id)
        blocks = []
        for backlog in sorted(others, key=lambda b: b.first_seq):
            shown = list(backlog.messages[-OTHER_THREAD_MESSAGES:])
            transcript = obs.format_messages_for_observer(
                shown,
                timezone=record.observed_timezone,
                max_part_length=OTHER_THREAD_PART_CHARS,
                count=self.rt.counter.count_string,
            ).text
            left_out = len(backlog.messages) - len(shown)
            if left_out:
                transcript = f'({left_out} earlier messages of this conversation are not shown)\n{transcript}'
            blocks.append(rs.other_conversation_block(codec.shown(backlog.thread_id), transcript))
        return rs.join_other_conversations(blocks) or ''

    def reflection_may_start(self, resource_id: str, cycle_start: datetime) -> bool:
        """Reflection waits until every message older than this cycle's start is observed (newer ones do not block)."""
        pending = self.rt.store.list_pending_threads(resource_id, limit=1)
        return not pending or pending[0].pending_since >= cycle_start
