"""Image pull on a fresh node (docs/sim.md rule 2b), on virtual time: the model decides when a pod bound to a node at
``now`` can start; nothing sleeps."""

from __future__ import annotations

import pytest

from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal.devcluster.worldtime import TIME_SCALE
from kfp_gpu_rehearsal.sim import from_dict
from kfp_gpu_rehearsal.sim.aws.scenario import from_dict as aws_from_dict
from kfp_gpu_rehearsal.sim.clock import compress
from kfp_gpu_rehearsal.sim.imagepull import NodeImages, pod_images
from kfp_gpu_rehearsal.sim.worldspec import PullSpec, parse_pull
from tests.sim._helpers import scenario

IMG = "us-docker.pkg.dev/p/r/train:1"


def test_first_pod_pays_size_over_rate_and_a_second_pod_on_that_node_pays_nothing() -> None:
    spec = PullSpec(image_gb=10.0, pull_mib_s=125.0)
    world = NodeImages(spec)
    full = compress(10 * 1024 / 125)  # 81.92 real-world seconds
    assert world.ready_at("n0", [IMG], now=5.0) == pytest.approx(5.0 + full)
    # a restarted rank on the surviving node, after the pull: at once (IfNotPresent)
    assert world.ready_at("n0", [IMG], now=20.0) == 20.0
    # a second pod bound while the first pull runs waits for that pull, not for a second one
    late = NodeImages(spec)
    first = late.ready_at("n0", [IMG], now=0.0)
    assert late.ready_at("n0", [IMG], now=first / 2) == pytest.approx(first)
    # another node pays its own pull, in parallel (nodes pull in isolation)
    assert world.ready_at("n1", [IMG], now=5.0) == pytest.approx(5.0 + full)


def test_the_kubelet_pulls_one_image_at_a_time() -> None:
    world = NodeImages(PullSpec(image_gb=5.0, pull_mib_s=100.0))
    one = compress(5 * 1024 / 100)
    assert world.ready_at("n0", ["a:1", "b:1"], now=0.0) == pytest.approx(2 * one)  # one pod, two images: serial
    assert world.ready_at("n0", ["c:1"], now=0.0) == pytest.approx(3 * one)  # another pod queues behind them
    assert world.ready_at("n0", ["a:1"], now=0.0) == pytest.approx(one)  # cached since its pull ended


def test_image_streaming_starts_the_container_before_the_image_is_down() -> None:
    full = NodeImages(PullSpec(image_gb=10.0, pull_mib_s=125.0)).ready_at("n", [IMG], 0.0)
    world = NodeImages(PullSpec(image_gb=10.0, pull_mib_s=125.0, streaming=True))
    # the first pull of an image in the world is a full one: the streaming backend has not cached it yet
    assert world.ready_at("n0", [IMG], 0.0) == pytest.approx(full)
    assert world.ready_at("n1", [IMG], full / 2) == pytest.approx(full / 2 + full)  # still not cached then
    # once it is, a fresh node starts the container after the part it reads
    assert world.ready_at("n2", [IMG], 2 * full) == pytest.approx(2 * full + full * 0.064)


def test_a_deleted_node_takes_its_cache_with_it() -> None:
    world = NodeImages(PullSpec(image_gb=1.0, pull_mib_s=1.0))
    done = world.ready_at("n0", [IMG], 0.0)
    world.forget("n0")  # the MIG recreates the VM under the same name: a fresh disk
    assert world.ready_at("n0", [IMG], done + 1) == pytest.approx(done + 1 + compress(1024.0))


def test_the_default_worlds_charge_the_documented_pull() -> None:
    gke = from_dict(scenario()).world.image_pull
    aws = aws_from_dict({}).image_pull
    for spec in (gke, aws):
        assert (spec.image_gb, spec.pull_mib_s, spec.streaming) == (10.0, 125.0, False)
        assert spec.pull_s() / TIME_SCALE == pytest.approx(10 * 1024 / 125 / 120)
    assert from_dict(scenario(image_pull={"streaming": True})).world.image_pull.streaming


@pytest.mark.parametrize("block, field", [
    ({"image_gb": -1}, "image_pull.image_gb"),
    ({"pull_mib_s": 0}, "image_pull.pull_mib_s"),
    ({"streaming": "yes"}, "image_pull.streaming"),
    ({"streaming_fraction": 2}, "image_pull.streaming_fraction"),
    ({"size": 3}, "image_pull.size"),
])
def test_a_bad_image_pull_block_names_the_field(block: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as exc:
        parse_pull(block)
    assert field in str(exc.value)


def test_eks_has_no_image_streaming_option() -> None:
    with pytest.raises(InvalidSpec) as exc:
        aws_from_dict({"image_pull": {"streaming": True}})
    assert "image_pull.streaming" in str(exc.value)


def test_pod_images_are_pulled_init_containers_first() -> None:
    pod = {"spec": {"initContainers": [{"image": "i:1"}], "containers": [{"image": "a:1"}, {"image": "b:1"}]}}
    assert pod_images(pod) == ["i:1", "a:1", "b:1"]
