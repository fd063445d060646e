"""Run-time values: pipeline parameters and task outputs in train(), spec fields as pipeline parameters.

Compile-side checks read the compiled YAML; run-side checks call kfp_gpu.runtime and the step entry the way
a component does (executor input on the command line).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kfp import dsl
from kfp.dsl import Dataset, Output

import kfp_gpu
from kfp_gpu import runtime
from kfp_gpu.compile import compile_pipeline
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec import ProvisioningSpec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "pipelines" / "llm_finetune.py"
SPEC = ProvisioningSpec("a100-80gb", 2, zones=("us-central1-a", "us-central1-b"), scale_up_deadline_s=300)
SIZES = ("nodes", "accelerator", "gpus_per_node", "capacity", "zones", "scale_up_deadline_s")
KFP_GPU_TASKS = ("quota-preflight", "reserve-warm-pool", "burst-scale-up", "train-pytorchjob", "teardown")

PIPELINE_SRC = '''
from kfp import dsl
import kfp_gpu
from kfp_gpu.spec import ProvisioningSpec

@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def pick_lr(scale: float) -> str:
    return str(0.001 * scale)

@kfp_gpu.provisioned(ProvisioningSpec("a100-80gb", 2, zones=("us-central1-a", "us-central1-b"),
                                      scale_up_deadline_s=300){runtime})
@dsl.pipeline(name="rt")
def rt(steps: int = 60, scale: float = 1.0, tag: str = "a") -> None:
    lr = pick_lr(scale=scale)
    kfp_gpu.train(name="ft", args=["--steps", steps, f"--lr={lr.output}"], env={"TAG": tag})
'''


SIZES_ARG = f", runtime={SIZES!r}"


def _doc(tmp_path, target="kfp"):
    path = tmp_path / "rt_pipeline.py"
    path.write_text(PIPELINE_SRC.replace("{runtime}", SIZES_ARG))
    return next(yaml.safe_load_all(compile_pipeline(path, tmp_path / f"{target}.yaml", target=target).read_text()))


def _tasks(doc):
    tasks = dict(doc["root"]["dag"]["tasks"])
    for comp in doc["components"].values():
        tasks.update((comp.get("dag") or {}).get("tasks") or {})
    return tasks


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_parameter_and_upstream_output_in_train_are_run_time_inputs(tmp_path, target):
    doc = _doc(tmp_path, target)
    train = _tasks(doc)["train-pytorchjob"]
    params = train["inputs"]["parameters"]
    job = json.loads(params["job_json"]["runtimeValue"]["constant"])
    # the job template holds placeholders where the values go, never a compile-time value or a KFP pattern
    assert job["args"] == ["--steps", {"__kfp_gpu_param__": "p0"},
                           {"__kfp_gpu_param__": ["--lr=", {"__kfp_gpu_param__": "p1"}]}]
    assert job["env"] == {"TAG": {"__kfp_gpu_param__": "p2"}}
    assert "{{channel:" not in params["job_json"]["runtimeValue"]["constant"]
    # ...and each value is an input of the task bound to the pipeline parameter / the upstream output
    assert params["p0"] == {"componentInputParameter": "pipelinechannel--steps"}
    assert params["p1"] == {"taskOutputParameter": {"producerTask": "pick-lr", "outputParameterKey": "Output"}}
    assert params["p2"] == {"componentInputParameter": "pipelinechannel--tag"}
    assert "pick-lr" in train["dependentTasks"]
    comp = doc["components"][train["componentRef"]["name"]]["inputDefinitions"]["parameters"]
    assert comp["p0"]["parameterType"] == "NUMBER_INTEGER" and comp["p1"]["parameterType"] == "STRING"


@pytest.mark.parametrize("target", ["kfp", "vertex"])
def test_runtime_spec_fields_are_root_parameters_with_the_spec_defaults(tmp_path, target):
    doc = _doc(tmp_path, target)
    root = doc["root"]["inputDefinitions"]["parameters"]
    want = {"nodes": (2, "NUMBER_INTEGER"), "accelerator": ("a100-80gb", "STRING"),
            "gpus_per_node": (8, "NUMBER_INTEGER"), "capacity": ("on-demand", "STRING"),
            "zones": (["us-central1-a", "us-central1-b"], "LIST"), "scale_up_deadline_s": (300.0, "NUMBER_DOUBLE")}
    for name, (default, kind) in want.items():
        assert root[name]["parameterType"] == kind, name
        assert root[name]["defaultValue"] == default, name
    assert root["steps"]["defaultValue"] == 60  # the pipeline's own parameters stay
    tasks = _tasks(doc)
    for task in KFP_GPU_TASKS:  # every kfp-gpu step, teardown included, gets the chosen values
        params = tasks[task]["inputs"]["parameters"]
        for name in want:
            bound = params[f"spec__{name}"]["componentInputParameter"]
            assert bound in (name, f"pipelinechannel--{name}"), (task, name, bound)


def test_vertex_pipeline_job_takes_runtime_fields_as_parameter_values(tmp_path):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform

    _doc(tmp_path, "vertex")
    aiplatform.init(project="p", location="us-central1", credentials=AnonymousCredentials())
    job = aiplatform.PipelineJob(display_name="t", template_path=str(tmp_path / "vertex.yaml"),
                                 pipeline_root="gs://b/root", parameter_values={"nodes": 4, "steps": 7,
                                                                                "capacity": "spot"})
    values = job._gca_resource.runtime_config.parameter_values
    assert values["nodes"] == 4 and values["steps"] == 7 and values["capacity"] == "spot"


def test_example_passes_train_steps_to_the_trainer_and_sizes_at_run_time(tmp_path):
    doc = next(yaml.safe_load_all(compile_pipeline(EXAMPLE, tmp_path / "p.yaml").read_text()))
    train = _tasks(doc)["train-pytorchjob"]["inputs"]["parameters"]
    job = json.loads(train["job_json"]["runtimeValue"]["constant"])
    i = job["args"].index("--steps")
    assert job["args"][i + 1] == {"__kfp_gpu_param__": "p0"}
    assert train["p0"] == {"componentInputParameter": "pipelinechannel--train_steps"}
    root = doc["root"]["inputDefinitions"]["parameters"]
    for name in SIZES:
        assert name in root, name
    assert root["nodes"]["defaultValue"] == 4 and root["capacity"]["defaultValue"] == "spot"


def test_train_with_a_pipeline_parameter_compiles_from_the_cli(tmp_path):
    """The issue's report: ``train(args=["--steps", steps])`` crashed ``kfp-gpu compile`` with a TypeError."""
    path = tmp_path / "p.py"
    path.write_text(PIPELINE_SRC.replace("{runtime}", ""))
    r = subprocess.run([sys.executable, "-m", "kfp_gpu.cli", "compile", str(path), "-o", str(tmp_path / "o.yaml")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "not JSON serializable" not in r.stderr


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def _data(out: Output[Dataset]) -> None:
    open(out.path, "w").write("x")


def test_unknown_runtime_field_is_refused_at_decoration():
    with pytest.raises(InvalidSpec, match="invalid runtime='node'.*allowed: nodes"):
        kfp_gpu.provisioned(SPEC, runtime=("node",))
    with pytest.raises(InvalidSpec, match="runtime"):
        kfp_gpu.provisioned(SPEC, runtime=("nodes", "nodes"))


def test_runtime_field_clashing_with_a_pipeline_parameter_is_refused():
    with pytest.raises(InvalidSpec, match="already has a parameter"):
        @kfp_gpu.provisioned(SPEC, runtime=("nodes",))
        def clash(nodes: int = 1) -> None:
            kfp_gpu.train()


class _Opaque:
    pass


def test_non_json_job_values_and_artifacts_are_refused_naming_the_field():
    with pytest.raises(InvalidSpec, match=r"train\.env\.X.*not JSON-serialisable"):
        @kfp_gpu.provisioned(SPEC)
        def opaque() -> None:
            kfp_gpu.train(env={"X": _Opaque()})
    with pytest.raises(InvalidSpec, match=r"train\.args.*is an artifact"):
        @kfp_gpu.provisioned(SPEC)
        def artifact() -> None:
            kfp_gpu.train(args=[_data().outputs["out"]])
    with pytest.raises(InvalidSpec, match=r"train\.name.*fixed at compile time"):
        @kfp_gpu.provisioned(SPEC)
        def named(n: str = "x") -> None:
            kfp_gpu.train(name=n)


def test_resolve_spec_applies_overrides_with_the_same_messages():
    base = SPEC.to_json()
    s = runtime.resolve_spec(base, {"nodes": 4.0, "zones": "us-central1-b", "capacity": "spot",
                                    "scale_up_deadline_s": 60})
    assert (s.nodes, s.zones, s.capacity.value, s.scale_up_deadline_s) == (4, ("us-central1-b",), "spot", 60)
    assert runtime.resolve_spec(base, {}) == SPEC
    with pytest.raises(InvalidSpec, match="invalid nodes=0") as e:
        runtime.resolve_spec(base, {"nodes": 0})
    assert e.value.to_dict()["fields"]["field"] == "nodes"
    with pytest.raises(InvalidSpec, match="capacity"):
        runtime.resolve_spec(base, {"capacity": "cheap"})
    with pytest.raises(InvalidSpec, match="zones"):
        runtime.resolve_spec(base, {"zones": ["europe-west4-a"]})
    with pytest.raises(InvalidSpec, match="accelerator"):
        runtime.resolve_spec(base, {"accelerator": "tpu-v9"})


def test_resolve_job_substitutes_and_validates_at_run_time():
    job = {"name": "ft", "image": "img", "command": ["python"], "checkpoint_every": 10,
           "args": ["--steps", {"__kfp_gpu_param__": "p0"}, {"__kfp_gpu_param__": ["--lr=", {"__kfp_gpu_param__": "p1"}]}],
           "env": {"TAG": {"__kfp_gpu_param__": "p2"}}}
    out = json.loads(runtime.resolve_job(json.dumps(job), "", {"p0": 7, "p1": "0.1", "p2": "blue"}))
    assert out["args"] == ["--steps", "7", "--lr=0.1"] and out["env"] == {"TAG": "blue"}
    whole = json.dumps({"args": {"__kfp_gpu_param__": "p0"}})  # a list parameter standing for all args
    out = json.loads(runtime.resolve_job(json.dumps({**job, "args": []}), whole, {"p0": ["-a", 1], "p2": "x"}))
    assert out["args"] == ["-a", "1"]
    bad = {**job, "service_account": {"__kfp_gpu_param__": "p3"}}
    with pytest.raises(InvalidSpec, match="train.service_account"):
        runtime.resolve_job(json.dumps(bad), "", {"p0": 1, "p1": "x", "p2": "y", "p3": "Not A Name"})
    with pytest.raises(InvalidSpec, match="p9"):
        runtime.resolve_job(json.dumps({**job, "image": {"__kfp_gpu_param__": "p9"}}), "", {})


def _component(step: str, params: dict) -> subprocess.CompletedProcess[str]:
    code = ("import sys\nfrom kfp_gpu.steps.entry import run_component\n"
            f"run_component({step!r}, sys.argv[-1], 'run-1', '')\n")
    executor_input = json.dumps({"inputs": {"parameterValues": params}})
    return subprocess.run([sys.executable, "-c", code, "--executor_input", executor_input, SPEC.to_json()],
                          capture_output=True, text=True, cwd=ROOT)


def test_preflight_with_a_bad_runtime_value_fails_in_one_line_naming_the_field():
    r = _component("preflight", {"spec__nodes": 0, "spec__capacity": "on-demand"})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "kfp-gpu preflight failed: invalid nodes=0" in r.stderr
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["type"] == "InvalidSpec" and err["fields"]["field"] == "nodes"


def test_executor_parameters_reads_the_command_line():
    argv = ["x", "--executor_input", json.dumps({"inputs": {"parameterValues": {"p0": 3, "spec__nodes": 2}}})]
    assert runtime.split(runtime.executor_parameters(argv)) == ({"nodes": 2}, {"p0": 3})
    assert runtime.executor_parameters(["x"]) == {}
    with pytest.raises(InvalidSpec, match="--executor_input"):
        runtime.executor_parameters(["--executor_input", "{nope"])


def test_resolved_spec_of_a_pipeline_applies_only_its_runtime_fields():
    from kfp_gpu.dsl import resolved_spec

    @kfp_gpu.provisioned(SPEC, runtime=("nodes",))
    def p(steps: int = 1) -> None:
        kfp_gpu.train(args=["--steps", steps])

    assert resolved_spec(p, {"nodes": 5, "steps": 3, "capacity": "spot"}).nodes == 5
    assert resolved_spec(p, {"capacity": "spot"}) == SPEC  # capacity is not a run-time field of p
    with pytest.raises(InvalidSpec, match="nodes=0"):
        resolved_spec(p, {"nodes": 0})
