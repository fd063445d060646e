"""The dev cluster's Go builds (kfp_gpu_rehearsal/devcluster/build.py, buildtimes.py): the core targets build one Go module per
worker, two modules at once, the targets of one module in turn; each cold build records its duration, and the next
build line shows it as the estimate. No Go toolchain runs here (build_target is replaced)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kfp_gpu_rehearsal.devcluster import build, buildtimes


def test_two_modules_build_at_once_and_one_module_s_targets_in_turn(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    ts = [build.Target("kube-apiserver", "k8s.io/kubernetes", "v1", "./cmd/a"),
          build.Target("kube-scheduler", "k8s.io/kubernetes", "v1", "./cmd/s"),
          build.Target("etcd", "go.etcd.io/etcd", "v3", "./etcd"),
          build.Target("kwok", "sigs.k8s.io/kwok", "v0", "./kwok")]
    both_started = threading.Barrier(2, timeout=10)  # passes only when two modules build at the same time
    lock = threading.Lock()
    active: dict[str, int] = {}
    worst: dict[str, int] = {}
    order: list[str] = []

    def fake(t: build.Target, log: Path) -> Path:
        with lock:
            active[t.module] = active.get(t.module, 0) + 1
            worst[t.module] = max(worst.get(t.module, 0), active[t.module])
            order.append(t.name)
        if t.name in ("kube-apiserver", "etcd"):
            both_started.wait()
        with lock:
            active[t.module] -= 1
        return tmp_path / t.name

    monkeypatch.setattr(build, "build_target", fake)
    got = build._build_modules(ts, tmp_path)
    assert list(got) == [t.name for t in ts] and got["etcd"] == tmp_path / "etcd"
    assert worst == {"k8s.io/kubernetes": 1, "go.etcd.io/etcd": 1, "sigs.k8s.io/kwok": 1}
    assert order.index("kube-apiserver") < order.index("kube-scheduler")


def test_a_failed_module_fails_the_build_after_the_others(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ts = [build.Target("etcd", "go.etcd.io/etcd", "v3", "./etcd"), build.Target("kwok", "sigs.k8s.io/kwok", "v0", ".")]
    done: list[str] = []

    def fake(t: build.Target, log: Path) -> Path:
        if t.name == "etcd":
            raise build.BuildError("etcd: command failed")
        done.append(t.name)
        return tmp_path / t.name

    monkeypatch.setattr(build, "build_target", fake)
    with pytest.raises(build.BuildError, match="etcd: command failed"):
        build._build_modules(ts, tmp_path)
    assert done == ["kwok"]


def test_each_cold_build_line_shows_the_last_cold_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFP_GPU_CACHE", str(tmp_path))
    assert buildtimes.note("kube-apiserver-v1.36.0") == " (no cold build recorded yet)"
    buildtimes.record("kube-apiserver-v1.36.0", 344.2)
    buildtimes.record("etcd-v3.6.0", 82.0)
    assert buildtimes.note("kube-apiserver-v1.36.0") == " (last cold build 344s)"
    assert buildtimes.last("etcd-v3.6.0") == 82.0 and buildtimes.last("kwok") is None
    buildtimes.path().write_text("not json")  # a damaged record is no estimate, never a failed build
    assert buildtimes.last("etcd-v3.6.0") is None
