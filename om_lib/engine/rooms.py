"""What the step runner (`om_lib.engine.step.Steps`) and the job runner (`om_lib.engine.jobs.Jobs`) both work over."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from om_lib.reflection.archive import Archive

if TYPE_CHECKING:
    from om_lib.observation.buffered import ObservationBuffering
    from om_lib.observation.observation import ObservationPipeline
    from om_lib.observation.resource_view import ResourceView
    from om_lib.reflection.reflection import Reflection
    from om_lib.runtime.runtime import Runtime


@dataclass(eq=False)
class MemoryRooms:
    """The runtime, the observation pipeline, reflection, buffering, (resource scope) the resource view, and the
    archive that keeps the log within its bound."""

    rt: Runtime
    pipeline: ObservationPipeline
    reflection: Reflection
    _: KW_ONLY
    buffering: ObservationBuffering | None
    resource: ResourceView | None
    archive: Archive = field(init=False)

    def __post_init__(self) -> None:
        reflection = self.reflection
        self.archive = Archive(self.rt, lambda record: reflection.due(record) or bool(record.buffered_reflection))
