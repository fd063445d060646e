"""save_torch / load_torch round trip: weights, optimizer state, RNG and extra restored exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kfp_gpu.checkpoint import CheckpointCorrupt, CheckpointStore, load_torch, save_torch  # noqa: E402


def _model_and_opt(seed: int) -> tuple[object, object]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return model, opt


def test_roundtrip_restores_everything(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert load_torch(store, torch.nn.Linear(4, 3)) is None
    model, opt = _model_and_opt(0)
    torch.manual_seed(123)
    random.seed(456)
    save_torch(store, 5, model, opt, extra={"losses": [1.5, 0.25], "note": "x"}, meta={"run": "t"})
    expected = (torch.rand(3), random.random())

    model2, opt2 = _model_and_opt(1)
    resumed = load_torch(store, model2, opt2)
    assert resumed is not None and resumed.step == 5 and resumed.extra == {"losses": [1.5, 0.25], "note": "x"}
    assert set(resumed.restored) == {"model.pt", "optimizer.pt", "rng.pt"}
    assert resumed.checkpoint.meta["run"] == "t"
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):  # type: ignore[attr-defined]
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]  # type: ignore[attr-defined]
    assert all(torch.equal(s1[k]["exp_avg_sq"], s2[k]["exp_avg_sq"]) for k in s1)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_missing_optimizer_file_is_corrupt(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    model, opt = _model_and_opt(0)
    save_torch(store, 1, model, include_rng=False)
    with pytest.raises(CheckpointCorrupt, match="optimizer.pt"):
        load_torch(store, model, opt)
    assert load_torch(store, model) is not None
