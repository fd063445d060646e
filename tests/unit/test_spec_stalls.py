"""The stall and straggler knobs of the spec: defaults, JSON round trip, one-line errors naming field and value."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec import ProvisioningSpec


def _spec(**kw: object) -> ProvisioningSpec:
    return ProvisioningSpec(accelerator="nvidia-h100-80gb", nodes=2, **kw)  # type: ignore[arg-type]


def test_defaults_and_round_trip() -> None:
    s = _spec()
    assert (s.stall_timeout, s.stall_timeout_s, s.stragglers, s.straggler_margin, s.straggler_window_s) == (
        "auto", None, "report", 0.2, 300.0)
    t = _spec(stall_timeout=90, stragglers="replace", straggler_margin=0.5, straggler_window_s=60)
    assert ProvisioningSpec.from_json(t.to_json()) == t and t.stall_timeout_s == 90.0


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"stall_timeout": "soon"}, "stall_timeout", "'auto' or a number of seconds"),
    ({"stall_timeout": 0}, "stall_timeout", "must be in [1"),
    ({"stall_timeout": True}, "stall_timeout", "must be a number"),
    ({"stragglers": "kill"}, "stragglers", "allowed: 'report', 'replace'"),
    ({"straggler_margin": 0}, "straggler_margin", "must be in [0.01"),
    ({"straggler_window_s": 0.5}, "straggler_window_s", "must be in [1"),
])
def test_bad_values_name_the_field_and_value(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        _spec(**changes)
    line = str(err.value)
    assert err.value.field == field
    assert words in line and str(next(iter(changes.values()))) in line
    assert "\n" not in line
