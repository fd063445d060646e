"""The pod every gang node runs, whatever the job kind: one function so PyTorchJob and TrainJob place alike.

:func:`pod_template` renders the user's :class:`~kfp_gpu.job.JobTemplate` plus kfp-gpu's placement and
bookkeeping into a pod template (``{"metadata": ..., "spec": ...}``): the container (image, command, args with the
resume arguments, env with the resume variables, resources with the node's GPUs, volumes and ``/dev/shm``), the
run's tolerations (GPU taint, the run's claim taint, the target's), the node selector with the gang pin (the
run's claim label, :data:`~kfp_gpu.ownership.LABEL_RUN_ID`), the user's node affinity, labels (ownership + job)
and annotations (the
template's, the provisioner's ``pod_annotations``, and the local rehearsal's default duration). A job kind puts
it where its API wants it (PyTorchJob: every replica spec; TrainJob: the trainer fields plus a runtime patch).

The gang pin is one label, whatever the gang's size: a claim (:func:`kfp_gpu.cluster.nodes.claim`) labels each
gang node with the run id and taints it with the run's namespace, so the run's pods select exactly the nodes the
run holds (and a node the run released, or a VM recreated under a released node's name, is no longer among
them). A pin by Node name needs one ``matchFields`` term per node (a field requirement takes one value), so every
pod, and the job holding its template, grew with the gang: at 512 nodes each pod carried 512 terms, and the
apiserver, scheduler and Training Operator handled N pods of O(N) size.

kfp-gpu's parts win where they meet the user's: ownership labels, the node's GPUs, the gang pin, the run's
tolerations (the user's are added), the checkpoint/resume env and arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kfp_gpu.cluster.capacity import Capacity
from kfp_gpu.job import JobTemplate
from kfp_gpu.job_fields import GPU_RESOURCE, SHM_PATH, SHM_VOLUME
from kfp_gpu.ownership import LABEL_RUN_ID, label_safe

SIM_DURATION_ANNOTATION = "kfp-gpu.io/sim-duration"
# The local rehearsal's KWOK holds a marked pod Pending until the world serving its node says its image pull is done
# (kfp_gpu_rehearsal/devcluster/kwok/stages.yaml, docs/sim.md rule 2b), as a real kubelet pulls before it starts.
IMAGE_PULL_ANNOTATION = "kfp-gpu.io/image-pull"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ENV_CHECKPOINT_URI = "KFP_GPU_CHECKPOINT_URI"
ENV_RESUME_STEP = "KFP_GPU_RESUME_STEP"
ENV_RESUME_PATH = "KFP_GPU_RESUME_PATH"
ENV_RESUME_FORMAT = "KFP_GPU_RESUME_FORMAT"
ENV_RUN_ID = "KFP_GPU_RUN_ID"
ENV_DATASET_URI = "KFP_GPU_DATASET_URI"
OWN_ENV = (ENV_CHECKPOINT_URI, ENV_RESUME_STEP, ENV_RESUME_PATH, ENV_RESUME_FORMAT, ENV_RUN_ID, ENV_DATASET_URI)


def resume_step(resume: Any) -> int:
    """The step a job resumes at: ``resume.step`` (a checkpoint record) or 0 for a fresh start (None)."""
    return int(getattr(resume, "step", 0) or 0) if resume is not None else 0


def own_env(*, checkpoint_uri: str, resume: Any, run_id: str, dataset_uri: str) -> list[dict[str, str]]:
    """kfp-gpu's variables: the checkpoint root, the resume step (0 on a fresh start), the resume path and format
    (when the checkpoint record ``resume``, e.g. :class:`kfp_gpu.checkpoint.resume.Resume`, names them), the run id
    and the dataset URI. The same for every job kind."""
    path = str(getattr(resume, "path", "") or getattr(resume, "uri", "") or "") if resume is not None else ""
    fmt = str(getattr(resume, "format", "") or "") if resume is not None else ""
    out = [{"name": ENV_CHECKPOINT_URI, "value": checkpoint_uri},
           {"name": ENV_RESUME_STEP, "value": str(resume_step(resume))}]
    if path:  # a checkpoint record that names its path (kfp_gpu.checkpoint.resume.Resume)
        out += [{"name": ENV_RESUME_PATH, "value": path}, {"name": ENV_RESUME_FORMAT, "value": fmt}]
    return out + [{"name": ENV_RUN_ID, "value": run_id}, {"name": ENV_DATASET_URI, "value": dataset_uri}]


def container_env(template: JobTemplate, own: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The user's env (minus kfp-gpu's names) followed by kfp-gpu's ``own`` variables."""
    names = {e["name"] for e in own} | set(OWN_ENV)
    env = [{"name": k, **v} if isinstance(v, dict) else {"name": k, "value": v}
           for k, v in template.env if k not in names]
    return env + [dict(e) for e in own]


def resume_args(template: JobTemplate, resume: Any) -> list[Any]:
    """The template's args, plus its ``resume_args`` filled in from the checkpoint record when resuming.

    Raises: InvalidSpec (a ``resume_args`` entry names an unknown field; checked at decoration time too).
    """
    extra: list[Any] = []
    tpl = tuple(getattr(template, "resume_args", ()) or ())
    if resume is not None and tpl and hasattr(resume, "args"):
        extra = list(resume.args(tpl))
    return [*template.args, *extra]


def pod_template(
    template: JobTemplate, capacity: Capacity, *, container: str, labels: Mapping[str, str],
    env: Sequence[Mapping[str, Any]], args: Sequence[Any], pin: bool = False,
    pod_annotations: Mapping[str, str] | None = None, local: bool = False,
) -> dict[str, Any]:
    """The pod template every gang node runs (see the module docstring). ``container`` names the one container
    (the job kind's required name); ``labels`` go on the pod (ownership and the job label); ``env`` and ``args``
    come from :func:`container_env` and :func:`resume_args`; ``pin`` selects the nodes the run claimed (False when
the gang forms at admission: Kueue); ``local`` (the local rehearsal) adds the default
    ``kfp-gpu.io/sim-duration`` and the image-pull marker under the template's and the provisioner's annotations."""
    resources: dict[str, Any] = {k: dict(v) for k, v in template.resources.items()}
    resources.setdefault("limits", {})[GPU_RESOURCE] = str(capacity.gpus_per_node)
    mounts = [dict(m) for m in template.volume_mounts]
    volumes = [dict(v) for v in template.volumes]
    if template.shm_size:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": template.shm_size}})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    c: dict[str, Any] = {
        **template.container_extra, "name": container, "image": template.image,
        "command": list(template.command), "args": list(args), "env": [dict(e) for e in env], "resources": resources,
    }
    if mounts:
        c["volumeMounts"] = mounts
    tolerations = list(capacity.tolerations())
    tolerations += [t for t in template.tolerations if t not in tolerations]
    selector = capacity.node_selector()
    if pin and capacity.nodes:  # a capacity with no nodes (the gang forms at admission) claimed none
        selector[LABEL_RUN_ID] = label_safe(capacity.run_id)
    spec: dict[str, Any] = {
        **template.pod_extra, "restartPolicy": "Never", "nodeSelector": selector,
        "tolerations": tolerations, "containers": [c],
    }
    if volumes:
        spec["volumes"] = volumes
    if template.service_account:
        spec["serviceAccountName"] = template.service_account
    if template.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in template.image_pull_secrets]
    affinity = node_affinity(template.node_affinity, (), capacity.node_requirements())
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    sim = {SIM_DURATION_ANNOTATION: "2s", IMAGE_PULL_ANNOTATION: "world"} if local else {}
    annotations = {**sim, **dict(template.annotations),
                   **(pod_annotations or {})}
    return {"metadata": {"labels": dict(labels), "annotations": annotations}, "spec": spec}


def node_affinity(user: Mapping[str, Any], gang_nodes: Sequence[str],
                  requirements: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The user's node affinity ANDed with a pin to ``gang_nodes`` by name: the Node's ``metadata.name`` is one of
    them (a field match, since the ``kubernetes.io/hostname`` label need not equal the Node name and
    autoscaler-made nodes may lack it). A field match takes one value, so the pin is one term per node: use it for
    one node (a probe pod); a gang is pinned by its claim label (:func:`pod_template`).

    Node selector terms are ORed, so every user term is repeated with each node's field match; preferred terms
    are kept. ``requirements`` (the capacity's :meth:`~kfp_gpu.cluster.capacity.Capacity.node_requirements`,
    e.g. the accelerator's instance types on EKS) are ANDed into every term.
    """
    out = {k: v for k, v in user.items() if k != REQUIRED}
    terms = [dict(t) for t in (user.get(REQUIRED) or {}).get("nodeSelectorTerms") or [{}]]
    if requirements:
        terms = [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), *map(dict, requirements)]}
                 for t in terms]
    if gang_nodes:
        terms = [{**t, "matchFields": [*(t.get("matchFields") or []),
                                       {"key": "metadata.name", "operator": "In", "values": [n]}]}
                 for t in terms for n in sorted(gang_nodes)]
    if any(terms):
        out[REQUIRED] = {"nodeSelectorTerms": terms}
    return out
