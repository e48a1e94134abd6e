"""The stack's building blocks, one construct per file (STYLE §12); `OmStack` only composes them."""

from infra.constructs.api_firewall import ApiFirewall
from infra.constructs.lifecycle_events import LifecycleEvents
from infra.constructs.memory_api import ApiAuth, MemoryApi
from infra.constructs.memory_bucket import MemoryBucket
from infra.constructs.memory_key import MemoryKey
from infra.constructs.memory_table import MemoryTable
from infra.constructs.model_access import ModelAccess
from infra.constructs.model_key_secret import ModelKeySecret
from infra.constructs.operational_alarms import OperationalAlarms, WatchedFunction
from infra.constructs.operations_dashboard import OperationsDashboard
from infra.constructs.orphan_upload_cleanup import OrphanUploadCleanup
from infra.constructs.reflection_workflow import ReflectionWorkflow
from infra.constructs.service_function import ServiceFunction
from infra.constructs.sweeper_schedule import SweeperSchedule
from infra.constructs.work_queue import WorkQueue

__all__ = [
    'ApiAuth',
    'ApiFirewall',
    'LifecycleEvents',
    'MemoryApi',
    'MemoryBucket',
    'MemoryKey',
    'MemoryTable',
    'ModelAccess',
    'ModelKeySecret',
    'OperationalAlarms',
    'OperationsDashboard',
    'OrphanUploadCleanup',
    'ReflectionWorkflow',
    'ServiceFunction',
    'SweeperSchedule',
    'WatchedFunction',
    'WorkQueue',
]
