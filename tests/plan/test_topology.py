"""Topology decisions (kfp_gpu.plan.topology) and the spec's topology fields: pure, no cluster."""

from __future__ import annotations

import pytest

from kfp_gpu.cluster import node_labels
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.plan import topology
from kfp_gpu.plan.preflight import ClusterCheck
from kfp_gpu.plan.quota import Verdict
from kfp_gpu.spec import ProvisioningSpec

BLOCK = "cloud.google.com/gce-topology-block"


def _nodes(layout: dict[str, int]) -> dict[str, dict[str, str]]:
    return {f"{b}-n{i}": {BLOCK: b} for b, n in layout.items() for i in range(n)}


def test_spec_topology_defaults_to_none_and_round_trips() -> None:
    s = ProvisioningSpec(accelerator="h100-80gb", nodes=4)
    assert (s.topology, s.topology_level) == ("none", "block")
    t = s.replace(topology="required", topology_level="subblock")
    assert ProvisioningSpec.from_json(t.to_json()) == t


@pytest.mark.parametrize(("field", "value"), [("topology", "strict"), ("topology_level", "rack"),
                                              ("topology", "")])
def test_spec_refuses_a_bad_topology_value_in_one_line(field: str, value: str) -> None:
    with pytest.raises(InvalidSpec) as ei:
        ProvisioningSpec(accelerator="h100-80gb", nodes=4, **{field: value})
    msg = str(ei.value)
    assert f"{field}={value!r}" in msg and ("'required'" in msg or "'block'" in msg)
    assert ei.value.field == field and "\n" not in ei.value.message


def test_each_scheme_names_its_level_labels() -> None:
    assert node_labels.GKE.topology_label("subblock") == "cloud.google.com/gce-topology-subblock"
    assert node_labels.EKS.topology_label("block") == "topology.k8s.aws/network-node-layer-2"
    assert node_labels.KARPENTER.topology_label("host") == "kubernetes.io/hostname"


def test_kueue_annotations_follow_the_rule() -> None:
    assert topology.kueue_annotations("required", BLOCK) == {"kueue.x-k8s.io/podset-required-topology": BLOCK}
    assert topology.kueue_annotations("preferred", BLOCK) == {"kueue.x-k8s.io/podset-preferred-topology": BLOCK}
    assert topology.kueue_annotations("none", BLOCK) == {}


def test_choose_takes_the_tightest_domain_that_holds_the_gang() -> None:
    nodes = _nodes({"b-big": 8, "b-small": 3, "b-tiny": 1})
    assert topology.choose(nodes, 3, BLOCK) == ["b-small-n0", "b-small-n1", "b-small-n2"]
    assert set(topology.choose(nodes, 5, BLOCK) or []) <= {n for n in nodes if n.startswith("b-big")}
    assert topology.choose(nodes, 9, BLOCK) is None  # 12 nodes in all, no block of 9


def test_choose_keeps_a_replacement_in_the_survivors_domain() -> None:
    nodes = _nodes({"b-1": 2, "b-2": 6})
    assert topology.choose(nodes, 2, BLOCK, within="b-2") == ["b-2-n0", "b-2-n1"]  # b-1 fits tighter; b-2 wins
    assert topology.choose(_nodes({"b-1": 2, "b-2": 1}), 2, BLOCK, within="b-2") == ["b-1-n0", "b-1-n1"]


def test_choose_preferred_spreads_only_when_no_domain_holds_the_gang() -> None:
    nodes = {**_nodes({"b-1": 2, "b-2": 3}), "unlabelled": {}}
    assert topology.choose(nodes, 3, BLOCK, topology="preferred") == ["b-2-n0", "b-2-n1", "b-2-n2"]
    spread = topology.choose(nodes, 6, BLOCK, topology="preferred")
    assert spread is not None and spread[:3] == ["b-2-n0", "b-2-n1", "b-2-n2"] and spread[-1] == "unlabelled"
    assert topology.choose(nodes, 6, BLOCK, topology="required") is None
    assert topology.choose(nodes, 7, BLOCK, topology="preferred") is None


def test_unlabelled_nodes_are_in_no_domain() -> None:
    assert topology.choose({"a": {}, "b": {}}, 2, BLOCK) is None
    assert topology.choose({"a": {}, "b": {}}, 2, BLOCK, topology="none") == ["a", "b"]


def test_survivors_domain() -> None:
    assert topology.survivors_domain([{BLOCK: "b-1"}, {BLOCK: "b-1"}], BLOCK) == "b-1"
    assert topology.survivors_domain([{BLOCK: "b-1"}, {BLOCK: "b-2"}], BLOCK) == ""
    assert topology.survivors_domain([{BLOCK: "b-1"}, {}], BLOCK) == ""
    assert topology.survivors_domain([], BLOCK) == ""


def test_fit_refuses_a_required_gang_no_block_holds_naming_the_sizes() -> None:
    f = topology.fit(5, {"b-1": 4, "b-2": 2}, topology="required", level="block", label=BLOCK)
    assert f.verdict is Verdict.SHORT
    assert "fits no single block" in f.reason and "b-1=4, b-2=2" in f.reason and "largest holds 4" in f.reason
    assert topology.fit(4, {"b-1": 4, "b-2": 2}, topology="required", level="block", label=BLOCK).verdict \
        is Verdict.FITS
    assert topology.fit(5, {"b-1": 4}, topology="preferred", level="block", label=BLOCK).verdict is Verdict.FITS


def test_fit_is_unknown_without_labelled_nodes_never_ok() -> None:
    assert topology.fit(2, {}, topology="required", level="block", label=BLOCK).verdict is Verdict.UNKNOWN
    assert topology.fit(2, None, topology="required", level="block", label=BLOCK).verdict is Verdict.UNKNOWN
    assert topology.fit(2, None, topology="none", level="block", label=BLOCK).verdict is Verdict.FITS
    preferred = topology.fit(2, {}, topology="preferred", level="block", label=BLOCK)
    assert preferred.verdict is Verdict.FITS and "cannot be told" in preferred.reason  # it runs either way


def test_sizes_text_caps_the_list() -> None:
    text = topology.sizes_text({f"b-{i:02d}": i for i in range(10)})
    assert text.startswith("b-09=9, b-08=8") and text.endswith("(+2 more)")


def test_preflight_refuses_only_when_no_pool_can_add_a_node() -> None:
    sizes = {"b-1": 2, "b-2": 3}
    short = topology.preflight_check(4, sizes, topology="required", level="block", label=BLOCK, headroom=0)
    assert short.verdict is Verdict.SHORT and short.name == "topology"
    assert "b-2=3, b-1=2" in short.detail and "fits no single block" in short.detail and short.remediation
    grow = topology.preflight_check(4, sizes, topology="required", level="block", label=BLOCK, headroom=2)
    assert grow.verdict is Verdict.UNKNOWN and "up to 2 more" in grow.detail
    unknown = topology.preflight_check(4, sizes, topology="required", level="block", label=BLOCK, headroom=None)
    assert unknown.verdict is Verdict.UNKNOWN
    fits = topology.preflight_check(3, sizes, topology="required", level="block", label=BLOCK, headroom=0)
    assert fits.verdict is Verdict.FITS and fits.free == 3 and not fits.remediation


def test_a_two_pod_set_gang_is_grouped_into_one_domain_under_a_required_topology() -> None:
    req = topology.kueue_annotations("required", BLOCK)
    assert topology.group_annotations(req, "job", 2) == {"kueue.x-k8s.io/podset-group-name": "job"}
    assert topology.group_annotations(req, "job", 1) == {}  # Kueue takes groups of exactly two pod sets
    assert topology.group_annotations(topology.kueue_annotations("preferred", BLOCK), "job", 2) == {}


def test_pytorchjob_master_and_workers_carry_the_tas_annotations_and_one_group() -> None:
    from kfp_gpu.cluster import pytorchjob
    from kfp_gpu.cluster.capacity import Capacity, Placement
    from kfp_gpu.job import JobTemplate

    cap = Capacity("r", (Placement("p", "us-central1-a", ("n0", "n1", "n2")),), 8, "nvidia-h100-80gb", False)
    body = pytorchjob.manifest("job-a", capacity=cap, template=JobTemplate(name="t", image="i"), labels={},
                               nodes=3, checkpoint_uri="", run_id="r",
                               pod_annotations=topology.kueue_annotations("required", BLOCK), queue="q")
    notes = [s["template"]["metadata"]["annotations"] for s in body["spec"]["pytorchReplicaSpecs"].values()]
    assert len(notes) == 2 and all(n[topology.REQUIRED_ANNOTATION] == BLOCK for n in notes)
    assert {n[topology.GROUP_ANNOTATION] for n in notes} == {"job-a"}


def test_kueue_topology_levels_end_with_the_hostname() -> None:
    obj = topology.kueue_topology("gke", node_labels.GKE.topology)
    levels = [lv["nodeLabel"] for lv in obj["spec"]["levels"]]  # type: ignore[index]
    assert levels == [*node_labels.GKE.topology, "kubernetes.io/hostname"]
    aws = topology.kueue_topology("eks", node_labels.EKS.topology)["spec"]["levels"]  # type: ignore[index]
    assert [lv["nodeLabel"] for lv in aws][-1] == "kubernetes.io/hostname" and len(aws) == 3


def test_the_topology_example_compiles_with_the_topology_in_its_spec(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from kfp_gpu.compile import compile_pipeline, dag_edges

    root = Path(__file__).resolve().parents[2]
    out = compile_pipeline(root / "pipelines" / "llm_finetune_topology.py", tmp_path / "p.yaml")
    assert {"quota-preflight", "burst-scale-up", "train-pytorchjob", "teardown"} <= set(dag_edges(out))
    text = out.read_text()
    assert 'topology":"required' in text and 'topology_level":"block' in text


def test_a_required_gang_grows_only_the_compact_pools_at_the_block_level() -> None:
    placements = {"pg-a": "compact", "loose-a": "spread", "gke-plain": ""}
    assert topology.placement_pools(placements, "required", "block") == (["pg-a"], "")
    # compact means one block, nothing finer: a subblock gang may use every pool (no pool spreads them all)
    assert topology.placement_pools(placements, "required", "subblock") == (["pg-a", "loose-a", "gke-plain"], "")
    assert topology.placement_pools(placements, "preferred", "block")[0] == ["pg-a", "gke-plain", "loose-a"]
    assert topology.placement_pools({"loose-a": "spread"}, "none", "block") == (["loose-a"], "")


def test_a_required_gang_whose_every_pool_spreads_is_refused_naming_the_pools() -> None:
    use, why = topology.placement_pools({"gpu-a": "spread", "gpu-b": "spread"}, "required", "block")
    assert use == [] and why == ("no matching pool keeps its new nodes in one block: gpu-a, gpu-b launch them "
                                 "without a cluster placement group, and the cloud spreads them")
    # one pool whose placement is unknown (GKE without COMPACT) is not refused: its nodes may still share a block
    assert topology.placement_pools({"gpu-a": "spread", "np": ""}, "required", "block") == (["gpu-a", "np"], "")
    assert topology.placement_pools({"gpu-a": "spread"}, "preferred", "block") == (["gpu-a"], "")


def _row(need: int, sizes: dict[str, int] | None, pools: list[topology.PoolReach], level: str = "block",
         kind: str = "required") -> ClusterCheck:
    return topology.preflight_check(need, sizes, topology=kind, level=level, label=BLOCK,
                                    headroom=sum(p.headroom for p in pools), pools=pools)


def test_preflight_counts_a_compact_pools_new_nodes_into_its_block_and_names_the_assumption() -> None:
    # no node yet: a compact pool that may add 4 starts one block of 4
    row = _row(4, {}, [topology.PoolReach("np-compact", "compact", 4, group="COMPACT")])
    assert row.verdict is Verdict.FITS and row.free == 4.0
    assert "pool np-compact can add 4 node(s) into one new block: 4 >= 4" in row.detail
    assert "Assumed: a compact pool (COMPACT) puts all its nodes in one block" in row.detail
    # its block holds 1 Ready node (b-1), another block 2: 1 + 2 more = 3 < 4, and no other pool: refused
    short = _row(4, {"b-1": 1, "b-2": 2}, [topology.PoolReach("np-compact", "compact", 2, domain="b-1")])
    assert short.verdict is Verdict.SHORT and "the compact pools reach at most 3" in short.detail
    assert "raise the compact pools' max size" in short.remediation
    # 2 more into b-1 (2 Ready) holds 4
    ok = _row(4, {"b-1": 2, "b-2": 3}, [topology.PoolReach("np-compact", "compact", 2, domain="b-1")])
    assert ok.verdict is Verdict.FITS and "into its block b-1 (now 2 Ready): 4 >= 4" in ok.detail


def test_preflight_refuses_a_required_gang_whose_pools_all_spread_and_is_unknown_for_unplaced_pools() -> None:
    spread = _row(3, {"b-1": 1}, [topology.PoolReach("gpu-a", "spread", 8)])
    assert spread.verdict is Verdict.SHORT and "pools gpu-a would add come without a cluster placement group" in \
        spread.detail
    assert "strategy 'cluster'" in spread.remediation and "topology='preferred'" in spread.remediation
    unplaced = _row(3, {"b-1": 1}, [topology.PoolReach("np", "", 8), topology.PoolReach("gpu-a", "spread", 2)])
    assert unplaced.verdict is Verdict.UNKNOWN and "pools gpu-a, np may add 10 node(s) with no placement " \
        "guarantee at the block level" in unplaced.detail
    # a compact pool at the subblock level guarantees nothing: unknown, never ok
    sub = _row(3, {}, [topology.PoolReach("np-compact", "compact", 8)], level="subblock")
    assert sub.verdict is Verdict.UNKNOWN
    # existing nodes that hold the gang decide alone; preferred is never refused
    assert _row(2, {"b-1": 2}, [topology.PoolReach("gpu-a", "spread", 8)]).verdict is Verdict.FITS
    assert _row(3, {"b-1": 1}, [topology.PoolReach("gpu-a", "spread", 8)], kind="preferred").verdict is Verdict.FITS
    # no pool can add a node: the existing-nodes rule (SHORT naming the sizes)
    none = _row(3, {"b-1": 1}, [topology.PoolReach("gpu-a", "spread", 0)])
    assert none.verdict is Verdict.SHORT and "the largest holds 1" in none.detail


def test_a_best_effort_compact_pool_is_preferred_for_a_required_gang_but_never_a_guarantee() -> None:
    # GKE COMPACT without a max distance: its nodes share a block while the block has room, and spill after
    assert topology.placement_pools({"np-compact": "best-effort", "np": ""}, "required", "block") == (["np-compact"], "")
    assert topology.placement_pools({"np-compact": "best-effort", "pg-a": "compact"}, "required", "block") == (
        ["pg-a"], "")  # a pool that holds its nodes in a block comes first
    row = _row(4, {}, [topology.PoolReach("np-compact", "best-effort", 4, group="COMPACT")])
    assert row.verdict is Verdict.UNKNOWN, row  # never "fits": the cloud may put some of them in another block
    assert "the compact placement of np-compact is best effort (no max distance: once a pool's block is full, the " \
        "cloud puts its new nodes in another)" in row.detail


def test_a_preferred_gang_takes_the_pools_that_keep_nodes_together_first_and_may_spill_to_every_other() -> None:
    placements = {"a-spread": "spread", "b-plain": "", "c-best": "best-effort", "d-pg": "compact"}
    assert topology.placement_pools(placements, "preferred", "block") == (["d-pg", "c-best", "b-plain", "a-spread"], "")
    # none keeps the order given (target.pools is a priority list), as does preferred among pools of one kind
    assert topology.placement_pools({"d-pg": "compact", "a-spread": "spread"}, "none", "block") == (
        ["d-pg", "a-spread"], "")
    # two compact pools, z named first
    assert topology.placement_pools({"z-pg": "compact", "a-plain": "", "b-pg": "compact"}, "preferred", "block") == (
        ["z-pg", "b-pg", "a-plain"], "")
