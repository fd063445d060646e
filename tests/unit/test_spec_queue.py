"""Target.queue: the Kueue LocalQueue a job is submitted to ("" = auto-detect)."""

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec import ProvisioningSpec, Target


def test_queue_defaults_to_auto_detect_and_round_trips():
    assert Target().queue == ""
    spec = ProvisioningSpec("a100-80gb", 2, target=Target(queue="team-a.gpu"))
    assert ProvisioningSpec.from_json(spec.to_json()).target.queue == "team-a.gpu"


@pytest.mark.parametrize("bad", ["Team-A", "team_a", "-a", "a-", "a" * 64, "a b"])
def test_queue_must_be_a_local_queue_name(bad):
    with pytest.raises(InvalidSpec) as e:
        Target(queue=bad)
    assert e.value.field == "target.queue" and e.value.value == bad and "\n" not in str(e.value)
