"""The decorator's DAG: provisioning beside the user's data steps, train after scale-up and data."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kfp import dsl
from kfp.dsl import Dataset, Output

import kfp_gpu
from kfp_gpu.compile import compile_pipeline, dag_edges
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec import ProvisioningSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "pipelines" / "llm_finetune.py"
SPEC = ProvisioningSpec("a100-80gb", 2)

# The golden DAG of the example: task -> the tasks it waits for.
GOLDEN_EDGES = {
    "exit-handler-1": [],
    "teardown": ["exit-handler-1"],
    "quota-preflight": [],
    "reserve-warm-pool": ["quota-preflight"],
    "burst-scale-up": ["reserve-warm-pool"],
    "prepare-data": [],
    "train-pytorchjob": ["burst-scale-up", "prepare-data"],
    "evaluate": ["train-pytorchjob"],
}
PROVISIONING = {"quota-preflight", "reserve-warm-pool", "burst-scale-up"}


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_example_dag_is_golden(tmp_path, target):
    out = compile_pipeline(EXAMPLE, tmp_path / "p.yaml", target=target)
    assert dag_edges(out) == GOLDEN_EDGES


def _ancestors(edges, task):
    seen, todo = set(), list(edges[task])
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(edges.get(t, []))
    return seen


def test_data_step_independent_of_provisioning_and_train_after_scale_up(tmp_path):
    edges = dag_edges(compile_pipeline(EXAMPLE, tmp_path / "p.yaml"))
    assert _ancestors(edges, "prepare-data").isdisjoint(PROVISIONING)
    assert "burst-scale-up" in _ancestors(edges, "train-pytorchjob")
    assert "prepare-data" in _ancestors(edges, "train-pytorchjob")
    assert PROVISIONING <= _ancestors(edges, "evaluate")


def test_teardown_is_the_exit_handler_and_takes_no_task_inputs(tmp_path):
    doc = next(yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "p.yaml").read_text()))
    td = doc["root"]["dag"]["tasks"]["teardown"]
    assert td["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    for param in td["inputs"]["parameters"].values():
        assert "taskOutputParameter" not in param
    assert td["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_vertex_output_is_single_document_and_kfp_has_platform_config(tmp_path):
    v = list(yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "v.yaml", target="vertex").read_text()))
    k = list(yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "k.yaml", target="kfp").read_text()))
    assert len([d for d in v if d]) == 1
    assert len([d for d in k if d]) == 2 and "platforms" in k[1]


def test_vertex_pipeline_job_accepts_the_yaml_offline(tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    path = compile_pipeline(EXAMPLE, tmp_path / "v.yaml", target="vertex")
    aiplatform.init(project="p", location="us-central1", credentials=AnonymousCredentials())
    job = aiplatform.PipelineJob(display_name="t", template_path=str(path), pipeline_root="gs://b/root",
                                 enable_caching=False)
    body = job._gca_resource
    assert body.pipeline_spec["pipelineInfo"]["name"] == "llm-finetune"


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def _prep(out: Output[Dataset]) -> None:
    open(out.path, "w").write("x")


def test_plain_function_is_accepted():
    @kfp_gpu.provisioned(SPEC, name="plain")
    def plain(n: int = 1) -> None:
        d = _prep()
        kfp_gpu.train(dataset=d.outputs["out"])

    assert plain.name == "plain"
    assert "n" in plain.component_spec.inputs


def test_pipeline_with_outputs_is_refused_at_decoration():
    with pytest.raises(InvalidSpec, match="cannot return outputs"):
        @kfp_gpu.provisioned(SPEC)
        def returns() -> str:  # noqa: F811
            kfp_gpu.train()
            return "x"


def test_pipeline_with_own_exit_handler_is_refused_clearly():
    with pytest.raises(InvalidSpec, match="ExitHandler"):
        @kfp_gpu.provisioned(SPEC)
        def has_exit() -> None:
            with dsl.ExitHandler(_prep()):
                kfp_gpu.train()


def test_pipeline_without_train_is_refused():
    with pytest.raises(InvalidSpec, match="never calls kfp_gpu.train"):
        @kfp_gpu.provisioned(SPEC)
        def no_train() -> None:
            _prep()


def test_train_outside_pipeline_is_refused():
    with pytest.raises(InvalidSpec, match="inside a pipeline decorated"):
        kfp_gpu.train()


def test_bad_spec_fails_at_decoration_time():
    with pytest.raises(InvalidSpec, match="spec"):
        kfp_gpu.provisioned({"nodes": 4})  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="train.name"):
        @kfp_gpu.provisioned(SPEC)
        def bad_name() -> None:
            kfp_gpu.train(name="Bad Name")


@pytest.mark.parametrize("name", ["llm_finetune.yaml", "llm_finetune.vertex.yaml"])
def test_checked_in_yaml_is_fresh(tmp_path, name):
    target = "vertex" if "vertex" in name else "kfp"
    fresh = compile_pipeline(EXAMPLE, tmp_path / name, target=target).read_text()
    assert (ROOT / "pipelines" / name).read_text() == fresh, "stale: run `make components`"


def test_cli_compile_both_targets(tmp_path):
    for target in ("kfp", "vertex"):
        out = tmp_path / f"{target}.yaml"
        r = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", str(EXAMPLE), "-o", str(out),
                            "--target", target], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert "train-pytorchjob" in r.stdout and out.exists()


def test_cli_bad_input_is_one_line_not_traceback(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import kfp_gpu\nS = kfp_gpu.ProvisioningSpec('a100-80gb', 0)\n")
    r = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", str(bad), "-o", str(tmp_path / "o.yaml")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "nodes=0" in r.stderr and "fix:" in r.stderr


KFP_GPU_TASKS = ("quota-preflight", "reserve-warm-pool", "burst-scale-up", "train-pytorchjob", "teardown")


def _tasks(doc):
    tasks = dict(doc["root"]["dag"]["tasks"])
    for comp in doc["components"].values():  # the exit handler's body is a sub-DAG
        tasks.update((comp.get("dag") or {}).get("tasks") or {})
    return tasks


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_every_kfp_gpu_task_is_retried_with_backoff(tmp_path, target):
    doc = next(yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "p.yaml", target=target).read_text()))
    tasks = _tasks(doc)
    for name in KFP_GPU_TASKS:
        policy = tasks[name].get("retryPolicy")
        assert policy, f"{name} has no retry policy"
        assert policy["maxRetryCount"] >= 2
        assert policy["backoffDuration"] not in ("0s", None) and policy["backoffFactor"] >= 2
    # a multi-day run must stay retryable: Argo stops retrying once backoffMaxDuration has passed
    assert int(tasks["train-pytorchjob"]["retryPolicy"]["backoffMaxDuration"].rstrip("s")) >= 7 * 86400
    assert "retryPolicy" not in tasks["prepare-data"]  # the user's own steps are left as they are


def test_kfp_step_pods_are_not_evictable_by_the_cluster_autoscaler(tmp_path):
    docs = [d for d in yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "k.yaml").read_text()) if d]
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in KFP_GPU_TASKS:
        meta = executors[f"exec-{name}"]["podMetadata"]
        assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false", name
    v = compile_pipeline(EXAMPLE, tmp_path / "v.yaml", target="vertex").read_text()
    assert "safe-to-evict" not in v  # Vertex's single document cannot carry pod annotations
