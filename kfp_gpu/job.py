"""JobTemplate: what the training job runs (a PyTorchJob or a TrainJob: ``kind``). Travels from the DSL to the
train step as JSON.

Everything a user sets on the training pods lives here: image, command, args, env, per-replica resources,
``/dev/shm`` size, volumes and mounts, service account, extra tolerations and node affinity, labels and
annotations, ``nprocPerNode`` and image pull secrets. kfp-gpu adds placement (gang nodes, the run's
toleration, the node's GPUs), gang size, ownership labels and the resume env when it renders the job
(:func:`kfp_gpu.cluster.podtemplate.pod_template`, shared by the job kinds of :mod:`kfp_gpu.jobkinds`); it never
replaces what the user set. ``kind="trainjob"`` (with ``runtime``/``runtime_kind``) is checked here, at
decoration time, against what a TrainJob can carry (:func:`kfp_gpu.job_fields.job_kind`).

Kept free of kfp imports: the train step (and the KFP executor that runs it) must not import kfp.dsl
through this module.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from kfp_gpu import job_fields as f
from kfp_gpu.checkpoint.resume import check_args as check_resume_args
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.job_fields import PLACEHOLDER_KEY, is_placeholder

DEFAULT_TRAINER_IMAGE = "ghcr.io/kfp-gpu/trainer:0.1.0"
__all__ = ["DEFAULT_TRAINER_IMAGE", "JobTemplate", "PLACEHOLDER_KEY", "is_placeholder"]


@dataclass(frozen=True)
class JobTemplate:
    """What every pod of the PyTorchJob runs (Master and Workers share it). Travels to the train step as JSON.

    Fields take Kubernetes shapes: ``resources={"requests": {"cpu": "8", "memory": "64Gi"}, "limits":
    {"memory": "64Gi", "vpc.amazonaws.com/efa": "4"}}``, ``volumes=[{"name": "data", "persistentVolumeClaim":
    {"claimName": "datasets"}}]``, ``volume_mounts=[{"name": "data", "mountPath": "/data"}]``, tolerations
    and ``node_affinity`` as in a pod spec. Mappings (env, labels, annotations) may be dicts; they are kept as
    sorted pairs. String values may be run-time placeholders (``{"__kfp_gpu_param__": ...}``).
    """

    name: str = "train"
    image: Any = DEFAULT_TRAINER_IMAGE
    command: tuple[Any, ...] = ("python", "-m", "pipelines.trainer.train_lm")
    args: tuple[Any, ...] = ()
    env: tuple[tuple[str, Any], ...] = ()
    checkpoint_every: Any = 10
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    shm_size: Any = ""  # e.g. "16Gi": an emptyDir (medium Memory) at /dev/shm with this sizeLimit
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    service_account: Any = ""  # serviceAccountName (Workload Identity / IRSA); "" = the namespace default
    tolerations: tuple[dict[str, Any], ...] = ()  # added to the run's own toleration
    node_affinity: dict[str, Any] = field(default_factory=dict)  # ANDed with the gang placement
    labels: tuple[tuple[str, Any], ...] = ()  # on the job and every pod
    annotations: tuple[tuple[str, Any], ...] = ()  # on the job and every pod
    nproc_per_node: Any = ""  # spec.nprocPerNode: "", "auto", "cpu", "gpu" or an integer
    image_pull_secrets: tuple[Any, ...] = ()
    container_extra: dict[str, Any] = field(default_factory=dict)  # workingDir, imagePullPolicy, securityContext...
    pod_extra: dict[str, Any] = field(default_factory=dict)  # priorityClassName, securityContext...
    # appended to args only when the job resumes: e.g. ("--resume_from_checkpoint", "{path}"); {path}, {step},
    # {format}, {name} are the chosen checkpoint's (kfp_gpu.checkpoint.resume.Resume.args)
    resume_args: tuple[str, ...] = ()
    # the job kind (kfp_gpu.jobkinds): "pytorchjob" (Training Operator v1) or "trainjob" (Trainer v2, with the
    # runtime it references: a ClusterTrainingRuntime by default, or a TrainingRuntime of the namespace)
    kind: str = "pytorchjob"
    runtime: str = ""
    runtime_kind: str = ""

    def __post_init__(self) -> None:
        s = object.__setattr__
        if not isinstance(self.name, str) or not self.name or not self.name.replace("-", "").isalnum() \
                or self.name != self.name.lower():
            raise InvalidSpec("train.name", self.name, "must be a lowercase DNS label like 'finetune'")
        s(self, "image", f.text("train.image", self.image, allow_empty=False))
        s(self, "command", tuple(f.text(f"train.command[{i}]", c) for i, c in enumerate(f.seq("train.command",
                                                                                              self.command))))
        if not self.command:
            raise InvalidSpec("train.command", self.command, "must not be empty")
        s(self, "args", tuple(f.text(f"train.args[{i}]", a) for i, a in enumerate(f.seq("train.args", self.args))))
        s(self, "env", f.env("train.env", self.env))
        if not is_placeholder(self.checkpoint_every):
            if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                    or self.checkpoint_every < 1:
                raise InvalidSpec("train.checkpoint_every", self.checkpoint_every, "must be an integer >= 1 step")
        s(self, "resources", f.resources("train.resources", self.resources))
        s(self, "shm_size", f.quantity("train.shm_size", self.shm_size) if self.shm_size else "")
        s(self, "volumes", f.volumes("train.volumes", self.volumes))
        s(self, "volume_mounts", f.mounts("train.volume_mounts", self.volume_mounts,
                                          {v["name"] for v in self.volumes}))
        s(self, "service_account", f.name("train.service_account", self.service_account)
          if self.service_account else "")
        s(self, "tolerations", f.tolerations("train.tolerations", self.tolerations))
        s(self, "node_affinity", f.node_affinity("train.node_affinity", self.node_affinity))
        s(self, "labels", f.label_map("train.labels", self.labels))
        s(self, "annotations", f.annotation_map("train.annotations", self.annotations))
        s(self, "nproc_per_node", f.nproc("train.nproc_per_node", self.nproc_per_node))
        s(self, "image_pull_secrets", tuple(
            f.name(f"train.image_pull_secrets[{i}]", p.get("name") if isinstance(p, dict) and not is_placeholder(p)
                   else p) for i, p in enumerate(f.seq("train.image_pull_secrets", f.plain(self.image_pull_secrets)))))
        s(self, "container_extra", f.extra("train.container_extra", self.container_extra, f.CONTAINER_EXTRA_KEYS))
        s(self, "pod_extra", f.extra("train.pod_extra", self.pod_extra, f.POD_EXTRA_KEYS))
        s(self, "resume_args", tuple(f.seq("train.resume_args", self.resume_args)))
        check_resume_args("train.resume_args", ["" if is_placeholder(a) else a for a in self.resume_args])
        kind, runtime, runtime_kind = f.job_kind(self)
        s(self, "kind", kind)
        s(self, "runtime", runtime)
        s(self, "runtime_kind", runtime_kind)

    @classmethod
    def build(cls, job: Any = None, **fields: Any) -> JobTemplate:
        """The one constructor ``kfp_gpu.train()`` calls.

        ``build(**fields)`` is ``JobTemplate(**fields)``. ``build(job=model, **overrides)`` takes the pod
        template of a kubeflow-training ``KubeflowOrgV1PyTorchJob`` / ``KubeflowOrgV1PyTorchJobSpec``, or the
        trainer of a ``kubeflow`` SDK ``TrainerV1alpha1TrainJob`` / ``TrainerV1alpha1TrainJobSpec`` (``kind`` becomes
        ``"trainjob"``), or the same as a plain dict, and applies ``overrides`` on top.

        Raises:
            InvalidSpec: a bad field (named), an unknown field, or a part of ``job`` kfp-gpu cannot keep.
        """
        known = {x.name for x in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InvalidSpec(f"train.{unknown[0]}", fields[unknown[0]], f"unknown job field; known: "
                              f"{', '.join(sorted(known))}")
        if job is not None:
            from kfp_gpu.training_models import template_fields
            from kfp_gpu.trainjob_models import is_trainjob, trainjob_fields

            fields = {**(trainjob_fields(job) if is_trainjob(job) else template_fields(job)), **fields}
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        d = {x.name: getattr(self, x.name) for x in dataclasses.fields(self)}
        for key in ("env", "labels", "annotations"):
            d[key] = dict(d[key])
        for key in ("command", "args", "volumes", "volume_mounts", "tolerations", "image_pull_secrets",
                    "resume_args"):
            d[key] = list(d[key])
        for key, default in f.KIND_DEFAULTS.items():  # compiled PyTorchJob pipelines stay as they were
            if d[key] == default:
                del d[key]
        if not d["resume_args"]:  # only when set: compiled pipelines without it stay as they were
            del d["resume_args"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobTemplate:
        """Raises: InvalidSpec when ``text`` is not a job template (or a field is invalid, named)."""
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise TypeError("not a JSON object")
            for key in ("name", "image", "command", "checkpoint_every"):
                d[key]  # noqa: B018 - required keys
            d.pop("sim_duration_s", None)  # written by kfp-gpu <= 0.1 (now set by the local target)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidSpec("job_json", (text or "")[:80], f"is not a kfp-gpu job template ({exc})") from None
        return cls.build(**d)
