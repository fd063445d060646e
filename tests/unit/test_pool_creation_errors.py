"""Scale-up's watch of the candidate pools' instance groups: which creation error blocks what (no cluster)."""

from __future__ import annotations

from kfp_gpu.errors import CapacityUnavailable, QuotaExceeded, Scope
from kfp_gpu.providers.base import PoolActivity, PoolError, PoolRef
from kfp_gpu.provisioners.gang_wait import stockout

A = PoolRef("l4-a", "us-central1-a", "us-central1")
B = PoolRef("l4-b", "us-central1-b", "us-central1")


class Groups:
    """A provider that answers pool_activity from a table (the only call stockout makes)."""

    def __init__(self, table: dict[PoolRef, PoolActivity]) -> None:
        self.table = table

    def pool_activity(self, ref: PoolRef, since: float = 0.0) -> PoolActivity:
        return self.table[ref]


QUOTA = PoolError("QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 3.0 in region us-central1.", "vm-2")
STOCK = PoolError("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources", "vm-1")


def test_quota_error_of_a_group_short_of_its_target_blocks_the_region() -> None:
    zone, err = stockout(Groups({A: PoolActivity(A, 3, 1, 2, (STOCK, QUOTA))}), [A], 0.0)  # type: ignore[arg-type]
    assert zone == "us-central1-a" and isinstance(err, QuotaExceeded) and err.scope is Scope.REGION
    assert "QUOTA_EXCEEDED" in err.message and err.fields["running"] == 1 and err.fields["target"] == 3


def test_stockout_blocks_the_zone_and_a_group_at_its_target_is_fine() -> None:
    groups = Groups({A: PoolActivity(A, 2, 2, 0, (STOCK, QUOTA)),  # errors, but every VM runs now
                     B: PoolActivity(B, 2, 0, 2, (STOCK,))})
    zone, err = stockout(groups, [A, B], 0.0)  # type: ignore[arg-type]
    assert zone == "us-central1-b" and isinstance(err, CapacityUnavailable) and err.scope is Scope.ZONE
    assert stockout(Groups({A: PoolActivity(A, 2, 1, 1, ())}), [A], 0.0) is None  # type: ignore[arg-type]
