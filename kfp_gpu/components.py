"""The five kfp-gpu KFP components.

Each is a thin lightweight Python component: it imports kfp_gpu inside the function body (so it runs
under kfp.local's SubprocessRunner and in the component image), parses its inputs, and hands over to
:func:`kfp_gpu.steps.entry.run_component`, which writes the step's intent into the run's GpuGang (namespaced
rights only: :mod:`kfp_gpu.gang.client`), waits for the kfp-gpu controller's answer, writes the report and the
metrics, and maps errors to exit codes. The privileged work (the step functions of ``kfp_gpu.steps``) runs in
the controller.

Data flow: every step returns a small JSON reference to the run's GpuGang (the train step: the job's scalar
results); what a stage produced stays in the gang's status for the controller. The teardown exit task takes only
constants, pipeline parameters and the run id, and finds the gang by the run id.

Run-time inputs: a pipeline built with ``@kfp_gpu.provisioned(spec, runtime=(...))`` gives every task extra
inputs ``spec__<field>``, and a ``train()`` with pipeline parameters or task outputs in its job fields gives
the train task inputs ``p0..pN`` (:mod:`kfp_gpu.channels`). They are not in these signatures: the step entry
reads them from the executor input (:mod:`kfp_gpu.runtime`).
"""


from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Output

from kfp_gpu.image import image_for_version

IMAGE = image_for_version()


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def quota_preflight(
    spec_json: str,
    run_id: str,
    report: Output[HTML],
    metrics: Output[Metrics],
) -> str:
    """Check cloud quota amounts and cluster headroom for the whole gang, in parallel.

    Fails in seconds with the remediation and quota-request lead time when the run cannot fit (or when the
    namespace's GpuPolicy refuses it). Creates the run's GpuGang; returns a reference to it and the backend chosen.
    """
    from kfp_gpu.steps.entry import run_component

    return run_component("preflight", spec_json, run_id, "", report=report, metrics=metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def reserve_warm_pool(
    spec_json: str,
    run_id: str,
    preflight_json: str,
    report: Output[HTML],
    metrics: Output[Metrics],
) -> str:
    """Hold capacity just in time: negative-priority balloon pods and optionally a cloud reservation."""
    from kfp_gpu.steps.entry import run_component

    return run_component("warm_pool", spec_json, run_id, preflight_json, report=report, metrics=metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def burst_scale_up(
    spec_json: str,
    run_id: str,
    warm_pool_json: str,
    report: Output[HTML],
    metrics: Output[Metrics],
) -> str:
    """Resize every needed pool/zone concurrently and watch Nodes until the gang is Ready (all or nothing)."""
    from kfp_gpu.steps.entry import run_component

    return run_component("scale_up", spec_json, run_id, warm_pool_json, report=report, metrics=metrics)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train_pytorchjob(
    spec_json: str,
    run_id: str,
    capacity_json: str,
    job_json: str,
    report: Output[HTML],
    metrics: Output[Metrics],
    dataset: Input[Dataset] = None,
    job_runtime_json: str = "",
    queue_timeout_s: float = 3600.0,
) -> str:
    """Launch a gang-safe training job (a Training Operator PyTorchJob, or a Kubeflow Trainer v2 TrainJob when the
    job template's kind is trainjob) on the provisioned capacity and see it through.

    Recovers from spot preemption from the newest complete checkpoint within the spec's restart budget.
    Job fields holding pipeline parameters or task outputs are filled in from this task's run-time inputs.
    On a Kueue-gated namespace the job may wait ``queue_timeout_s`` for admission through its LocalQueue.
    """
    from kfp_gpu.steps.entry import run_component

    return run_component(
        "train", spec_json, run_id, capacity_json, report=report, metrics=metrics,
        job_json=job_json, job_runtime_json=job_runtime_json,
        dataset_uri=dataset.uri if dataset is not None else "", queue_timeout_s=queue_timeout_s,
    )


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def teardown(
    spec_json: str,
    run_id: str,
    report: Output[HTML],
    metrics: Output[Metrics],
) -> str:
    """Exit handler: release the run's GpuGang (everything the run holds, pool sizes restored), write the cost
    report, delete the gang."""
    from kfp_gpu.steps.entry import run_component

    return run_component("teardown", spec_json, run_id, "", report=report, metrics=metrics)


ALL = {
    "quota_preflight": quota_preflight,
    "reserve_warm_pool": reserve_warm_pool,
    "burst_scale_up": burst_scale_up,
    "train_pytorchjob": train_pytorchjob,
    "teardown": teardown,
}
