"""kfp-gpu command line: compile | components | preflight | run | demo | gc | submit | quota | dev-cluster |
install | tenant."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kfp_gpu.controller import flags as controller_flags
from kfp_gpu.errors import InvalidSpec, KfpGpuError

if TYPE_CHECKING:
    from kfp_gpu.providers.base import CapacityProvider


def _params(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise InvalidSpec("--param", p, "must be key=value")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def cmd_compile(a: argparse.Namespace) -> int:
    import os

    from kfp_gpu import image

    if a.image:  # before kfp_gpu.components is imported: its components are defined with this image
        os.environ[image.ENV_VAR] = image.validate_image(a.image, "--image")
    chosen = image.image_for_version() if os.environ.get(image.ENV_VAR, "").strip() else ""
    from kfp_gpu.compile import compile_pipeline, dag_edges

    out = compile_pipeline(a.pipeline_file, a.output, target=a.target, name=a.pipeline)
    if chosen:  # components defined earlier in this process still carry the default: rewrite the IR
        image.retag_compiled(out, chosen)
    print(f"compiled {a.pipeline_file} for {a.target} -> {out}" + (f" (component image {chosen})" if chosen else ""))
    for task, deps in sorted(dag_edges(out).items()):
        print(f"  {task:<22} after {', '.join(deps) or '(start)'}")
    return 0


def cmd_components(a: argparse.Namespace) -> int:
    from kfp_gpu.component_docs import write_all

    for p in write_all(Path(a.root)):
        print(f"wrote {p}")
    return 0


def cmd_preflight(a: argparse.Namespace) -> int:
    from kfp_gpu.compile import load_pipeline
    from kfp_gpu.dsl import spec_of
    from kfp_gpu.providers import for_target
    from kfp_gpu.steps.preflight import check, run_preflight, store_probe

    spec = spec_of(load_pipeline(a.pipeline_file, a.pipeline))
    assert spec is not None
    from kfp_gpu.cluster.kube import api_client
    from kfp_gpu.errors import NoKubeCredentials

    api = None
    try:  # a broken kubeconfig, a dead API server or the wrong cluster fail here, in one line
        api = api_client(spec.target)
    except NoKubeCredentials as exc:  # no cluster at all: the cloud checks still run
        print(f"kfp-gpu: cluster checks skipped: {exc.message}", file=sys.stderr)
    if api is not None:
        from kfp_gpu.cluster import pytorchjob

        if not pytorchjob.served(api):
            raise pytorchjob.crd_missing()
    result = run_preflight(spec, for_target(spec.target), api, regions=a.regions or None,
                           checkpoint_probe=store_probe(""))
    print(result.to_markdown())
    check(result, strict=a.strict)
    return 0


def cmd_gc(a: argparse.Namespace) -> int:
    from kfp_gpu.job_fields import namespace
    from kfp_gpu.steps.janitor import collect

    if not a.all_namespaces:
        namespace("--namespace", a.namespace)
    if a.lock_namespace:
        namespace("--lock-namespace", a.lock_namespace)
    report = collect(namespace=a.namespace, dry_run=a.dry_run, endpoint=a.endpoint,
                     all_namespaces=a.all_namespaces, lock_namespace=a.lock_namespace, runs=a.run)
    print(report)
    return 1 if report.errors or "error" in report.runs.values() else 0


def cmd_run(a: argparse.Namespace) -> int:
    from kfp_gpu.rehearsal_seam import load

    return int(load("demo").run(a.pipeline_file, a.arg, pipeline=a.pipeline, scenario=a.scenario or None,
                                keep=a.keep, containers=a.containers))


def cmd_demo(a: argparse.Namespace) -> int:
    from kfp_gpu.rehearsal_seam import load

    return int(load("demo").main(keep=a.keep))


def _check_submit_flags(a: argparse.Namespace) -> None:
    """The flags each submit target needs, checked before the file is loaded or compiled. Raises: InvalidSpec."""
    if a.vertex:
        if not a.project:
            raise InvalidSpec("--project", a.project, "Vertex needs the GCP project id",
                              remediation="pass --project PROJECT_ID")
        if not a.pipeline_root.startswith("gs://"):
            raise InvalidSpec("--pipeline-root", a.pipeline_root, "Vertex needs a gs:// pipeline root",
                              remediation="pass --pipeline-root gs://BUCKET/pipeline-root (a bucket the run can write)")
    elif not a.kfp_host.startswith(("http://", "https://")):
        raise InvalidSpec("--kfp-host", a.kfp_host, "required unless --vertex, an http:// or https:// URL",
                          remediation="pass --kfp-host http://ml-pipeline-ui.kubeflow:80 (or a port-forward: "
                          "--kfp-host http://localhost:8080)")


def cmd_submit(a: argparse.Namespace) -> int:
    import tempfile

    from kfp_gpu.compile import compile_pipeline, load_pipeline

    _check_submit_flags(a)
    name = load_pipeline(a.pipeline_file, a.pipeline).name
    with tempfile.TemporaryDirectory() as tmp:
        pkg = compile_pipeline(a.pipeline_file, Path(tmp) / "pipeline.yaml",
                               target="vertex" if a.vertex else "kfp", name=a.pipeline)
        if a.vertex:
            from kfp_gpu.submit.vertex import submit_vertex

            res = submit_vertex(str(pkg), project=a.project, region=a.region, pipeline_root=a.pipeline_root,
                                params=_params(a.param))
        else:
            from kfp_gpu.submit.kfp_backend import submit_kfp

            res = submit_kfp(str(pkg), a.kfp_host, pipeline_name=name, experiment=a.experiment,
                             params=_params(a.param))
    print(f"submitted: {res}")
    return 0


def cmd_quota(a: argparse.Namespace) -> int:
    from kfp_gpu.compile import load_pipeline
    from kfp_gpu.dsl import spec_of
    from kfp_gpu.providers import for_target

    if a.quota_cmd == "plan":
        from kfp_gpu.quota_plan import load_schedule, plan_quota

        spec = spec_of(load_pipeline(a.pipeline_file, None))
        assert spec is not None
        plan = plan_quota(load_schedule(a.schedule), _quota_provider(for_target(spec.target), a), file_requests=a.file,
                          justification="kfp-gpu quota plan: scheduled training runs")
        print(plan.to_markdown())
        return 0 if plan.ok else 4
    from kfp_gpu.steps.preflight import request_increase

    spec = spec_of(load_pipeline(a.pipeline_file, None))
    assert spec is not None
    rid = request_increase(spec, _quota_provider(for_target(spec.target), a), a.metric, a.region, a.value,
                           a.justification)
    print(f"quota request filed: {rid}")
    return 0


def _quota_provider(provider: CapacityProvider, a: argparse.Namespace) -> CapacityProvider:
    """The provider with ``--contact-email`` (Cloud Quotas requires one on an increase; GKE only), checked
    before any call when requests will be filed. Raises: InvalidSpec (no or bad contact email)."""
    if hasattr(provider, "contact_email"):
        if a.contact_email:
            provider.contact_email = a.contact_email.strip()
        if a.quota_cmd == "request" or a.file:
            from kfp_gpu.providers.gke.preferences import check_contact_email

            check_contact_email(provider.contact_email)
    return provider


def cmd_dev_cluster(a: argparse.Namespace) -> int:
    from kfp_gpu.rehearsal_seam import load

    dc_main = load("devcluster.cli").main
    withs = [w for name in a.extras for w in ("--with", name)]
    more = ["--autoscaler", a.autoscaler, *(["--kueue"] if a.kueue else []), *withs] if a.action == "up" else []
    if a.action == "build":
        ca = "cluster-autoscaler" in a.autoscaler.split(",")
        karpenter = [w for w in ("--with", "karpenter") if "karpenter" in a.autoscaler.split(",")]
        more = [*(["--with-autoscaler"] if ca else []), *(["--with-kueue"] if a.kueue else []), *withs, *karpenter]
    return int(dc_main([a.action, *more]) or 0)


def cmd_install(a: argparse.Namespace) -> int:
    from kfp_gpu import install

    if a.dry_run:  # no cluster needed: print what would be applied
        extra = install.optional("autoscaler-status") if a.autoscaler_status else []
        extra += install.kueue_topology(a.kueue_topology) if a.kueue_topology else []
        print(install.to_yaml(install.manifests(controller=a.controller, image=a.image) + extra), end="")
        return 0
    from kfp_gpu.cluster.kube import api_client

    install.apply(api_client(), controller=a.controller, image=a.image, autoscaler_status=a.autoscaler_status,
                  log=print, topology=a.kueue_topology)
    return 0


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def cmd_tenant(a: argparse.Namespace) -> int:
    from kfp_gpu import install

    install.check_namespace(a.namespace)  # before any credentials are read
    if a.tenant_cmd == "add":
        limits = install.limits_from(vars(a))
        if a.dry_run:
            print(install.to_yaml(install.tenant_objects(a.namespace, **limits)), end="")
            return 0
        from kfp_gpu.cluster.kube import api_client

        install.tenant_add(api_client(), a.namespace, log=print, **limits)
        return 0
    from kfp_gpu.cluster.kube import api_client

    install.tenant_remove(api_client(), a.namespace, force=a.force, log=print)
    return 0


def parser() -> argparse.ArgumentParser:
    from kfp_gpu.image import VERSION

    p = argparse.ArgumentParser(prog="kfp-gpu", description=__doc__)
    p.add_argument("--version", action="version", version=f"kfp-gpu {VERSION}")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a provisioned pipeline to YAML")
    c.add_argument("pipeline_file")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--target", choices=["kfp", "vertex"], default="kfp")
    c.add_argument("--pipeline", default=None, help="pipeline name when the file defines several")
    c.add_argument("--image", default="", metavar="REPO:TAG",
                   help="component image for every kfp-gpu step (default: $KFP_GPU_IMAGE, else "
                   "ghcr.io/kfp-gpu/kfp-gpu:<version>); see docs/images.md")
    c.set_defaults(fn=cmd_compile)
    c = sub.add_parser("components", help="regenerate components/*/component.yaml, READMEs and docs")
    c.add_argument("--root", default=".")
    c.set_defaults(fn=cmd_components)
    c = sub.add_parser("preflight", help="quota + cluster preflight for a pipeline's spec")
    c.add_argument("pipeline_file")
    c.add_argument("--pipeline", default=None)
    c.add_argument("--regions", nargs="*", default=[], help="more candidate regions after target.region")
    c.add_argument("--strict", action="store_true", help="fail when a check is unknown, not only when short")
    c.set_defaults(fn=cmd_preflight)
    c = sub.add_parser("gc", help="janitor: release runs whose leases expired and whose owner is gone")
    c.add_argument("--namespace", default="default", help="the namespace to sweep (without --all-namespaces)")
    c.add_argument("--all-namespaces", "-A", action="store_true", help="sweep every namespace")
    c.add_argument("--lock-namespace", default="",
                   help="where the kfp-gpu-janitor Lease lock lives (default: this pod's namespace, else --namespace)")
    c.add_argument("--run", action="append", default=[], help="only this run id (repeatable)")
    c.add_argument("--dry-run", action="store_true", help="report what would be released; take no lock, change nothing")
    c.add_argument("--endpoint", default="", help="cloud stand-in endpoint for the local target")
    c.set_defaults(fn=cmd_gc)
    c = sub.add_parser("run", help="rehearse a provisioned pipeline end to end on the local GKE (kfp.local)")
    c.add_argument("pipeline_file")
    c.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                   help="a pipeline argument, typed by the pipeline's signature (repeatable)")
    c.add_argument("--pipeline", default=None, help="pipeline name when the file defines several")
    c.add_argument("--scenario", default="", help="stand-in scenario YAML (default: the bundled one)")
    c.add_argument("--down", dest="keep", action="store_false", help="stop the local cluster afterwards")
    c.add_argument("--containers", action="store_true",
                   help="run every kfp-gpu step in the component image localhost/kfp-gpu:VERSION (podman, runc; "
                        "build it with `make images`), with the compiled YAML's command and arguments")
    c.set_defaults(fn=cmd_run)
    c = sub.add_parser("demo", help="kfp-gpu run on the example pipeline (pipelines/llm_finetune.py)")
    c.add_argument("--down", dest="keep", action="store_false", help="stop the local cluster afterwards")
    c.set_defaults(fn=cmd_demo)
    c = sub.add_parser("submit", help="submit to Kubeflow Pipelines or Vertex AI Pipelines")
    c.add_argument("pipeline_file", help="a Python file with one @kfp_gpu.provisioned pipeline")
    c.add_argument("--pipeline", default=None, help="the pipeline's name when the file defines several")
    c.add_argument("--kfp-host", default="", help="Kubeflow Pipelines API URL, e.g. http://ml-pipeline-ui.kubeflow:80")
    c.add_argument("--experiment", default=None, help="KFP experiment name")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter (repeat)")
    c.add_argument("--vertex", action="store_true", help="submit to Vertex AI Pipelines instead of KFP")
    c.add_argument("--project", default="", help="Vertex: the GCP project id")
    c.add_argument("--region", default="us-central1", help="Vertex: the region (default us-central1)")
    c.add_argument("--pipeline-root", default="", help="Vertex: gs://BUCKET/PATH the run writes its artifacts to")
    c.set_defaults(fn=cmd_submit)
    c = sub.add_parser("quota", help="quota increase requests and planning")
    qs = c.add_subparsers(dest="quota_cmd", required=True)
    r = qs.add_parser("request", help="file one quota increase request")
    r.add_argument("pipeline_file")
    r.add_argument("--metric", required=True)
    r.add_argument("--region", required=True)
    r.add_argument("--value", type=float, required=True)
    r.add_argument("--justification", required=True)
    r.add_argument("--contact-email", default="", help="GKE: the contact Cloud Quotas requires on an increase "
                   "(default: $KFP_GPU_QUOTA_CONTACT_EMAIL)")
    r = qs.add_parser("plan", help="which quotas to raise by when, for a schedule of runs")
    r.add_argument("pipeline_file")
    r.add_argument("--schedule", required=True)
    r.add_argument("--file", action="store_true", help="file the requests through the provider")
    r.add_argument("--contact-email", default="", help="GKE: the contact Cloud Quotas requires on an increase "
                   "(default: $KFP_GPU_QUOTA_CONTACT_EMAIL)")
    c.set_defaults(fn=cmd_quota)
    c = sub.add_parser("controller", help="run the kfp-gpu controller (acts on GpuGangs; docs/operator-guide.md)")
    controller_flags.add_arguments(c)
    c = sub.add_parser("dev-cluster", help="the local control plane with KWOK GPU nodes")
    c.add_argument("action", choices=["up", "down", "status", "build"])
    c.add_argument("--autoscaler", default="none",
                   help="up: also run the real cluster-autoscaler (kwok provider, ProvisioningRequests, GPU node groups)"
                   " and/or Karpenter's kwok provider: none | cluster-autoscaler | karpenter | a comma list")
    c.add_argument("--kueue", action="store_true",
                   help="up: also run the real Kueue controller (CRDs, webhooks; build: also build it)")
    c.add_argument("--with", dest="extras", action="append", default=[], metavar="NAME",
                   help="up/build: also run/build an optional component (trainer, gcs...; repeatable)")
    c.set_defaults(fn=cmd_dev_cluster)
    c = sub.add_parser("install", help="install the kfp-gpu control plane: CRDs, controller, RBAC, admission policy "
                       "(docs/operator-guide.md)")
    c.add_argument("--dry-run", action="store_true", help="print the objects as YAML; change nothing")
    c.add_argument("--image", default="", metavar="REPO:TAG",
                   help="the controller's image (default: the manifests' localhost/kfp-gpu:<version>)")
    c.add_argument("--no-controller", dest="controller", action="store_false",
                   help="leave out the controller Deployment and Service (run `kfp-gpu controller` yourself)")
    c.add_argument("--autoscaler-status", action="store_true",
                   help="also let the controller read a self-managed cluster-autoscaler's status ConfigMap "
                   "(provisioner detection; not needed on GKE)")
    c.add_argument("--kueue-topology", default="", metavar="gke|eks",
                   help="also create the Kueue Topology kfp-gpu-<cloud> over that cloud's node topology labels, for "
                   "Topology Aware Scheduling (name it in the GPU ResourceFlavor's spec.topologyName)")
    c.set_defaults(fn=cmd_install)
    c = sub.add_parser("tenant", help="let a namespace's pipelines ask for GPUs (or stop them)")
    ts = c.add_subparsers(dest="tenant_cmd", required=True)
    t = ts.add_parser("add", help="label the namespace, give its steps the kfp-gpu ServiceAccount and Role, bind the "
                      "controller there, write its GpuPolicy (idempotent)")
    t.add_argument("namespace")
    t.add_argument("--max-gpus-per-gang", type=int, default=None, metavar="N", help="GpuPolicy maxGpusPerGang "
                   "(default 64)")
    t.add_argument("--max-gpus", "--max-gpus-per-namespace", dest="max_gpus_per_namespace", type=int, default=None,
                   metavar="N", help="GpuPolicy maxGpusPerNamespace: GPUs the namespace may hold at once (default 128)")
    t.add_argument("--accelerators", type=_csv, default=None, metavar="A,B", help="allowed accelerators (default any)")
    t.add_argument("--capacity-types", type=_csv, default=None, metavar="T,U",
                   help="allowed capacity types: on-demand, spot, reservation, flex-start (default any)")
    t.add_argument("--pools", type=_csv, default=None, metavar="P,Q", help="allowed node pools (default any)")
    t.add_argument("--backends", type=_csv, default=None, metavar="B,C", help="allowed provisioners (default any)")
    t.add_argument("--max-run-seconds", type=float, default=None, metavar="S",
                   help="longest run (default 604800, a week)")
    t.add_argument("--allow-quota-requests", action="store_true", default=None,
                   help="let the controller file cloud quota increase requests for this namespace's gangs")
    t.add_argument("--dry-run", action="store_true", help="print the objects as YAML; change nothing")
    t = ts.add_parser("remove", help="undo `tenant add` (the namespace itself stays)")
    t.add_argument("namespace")
    t.add_argument("--force", action="store_true", help="even while the namespace still has GpuGangs")
    c.set_defaults(fn=cmd_tenant)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except KfpGpuError as err:
        print(one_line(err), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a Kubernetes API refusal is an environment problem, not a bug
        if type(exc).__name__ != "ApiException":
            raise
        from kfp_gpu.cluster.apierrors import api_refusal

        refusal = api_refusal(exc)
        if refusal is not None:
            print(one_line(refusal), file=sys.stderr)
            return refusal.exit_code
        print(f"kfp-gpu: the Kubernetes API answered {getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}"
              " (fix: check that the credentials' user or service account has its RBAC (docs/rbac-iam.md) "
              "and that the namespace exists)", file=sys.stderr)
        return 1


def one_line(err: KfpGpuError) -> str:
    """``kfp-gpu: <what went wrong> (fix: <remediation>)`` for the terminal."""
    return f"kfp-gpu: {err}"


if __name__ == "__main__":
    raise SystemExit(main())
