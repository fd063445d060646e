# kfp-gpu. Two commands on a fresh machine: `make demo` and `make test`. Everything else is set up by them.
# `make test-unit` is the unit tier alone: no cluster, no emulator (tests that need one carry the integration mark).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_STAMP := $(VENV)/.installed-torch
export KFP_GPU_CACHE ?= $(HOME)/.cache/kfp-gpu
export KUBECONFIG := $(KFP_GPU_CACHE)/cluster/kubeconfig
PYTEST_ARGS ?=
# Autoscaler profile of the local cluster: none (default) | cluster-autoscaler (the real cluster-autoscaler, kwok
# provider, GPU node groups, ProvisioningRequests) | karpenter (Karpenter's kwok provider) | both, comma-separated
# (docs/local-cluster.md). `make test`, `make bench` and `make bench-quick` use cluster-autoscaler,karpenter.
AUTOSCALER ?= none
# Kueue profile: KUEUE=1 builds and runs the real Kueue controller (CRDs, webhooks; docs/local-cluster.md).
# `make test` uses KUEUE=1.
KUEUE ?=
# Optional components (kfp_gpu_rehearsal/devcluster/extras.py): TRAINER=1 runs JobSet + Kubeflow Trainer v2, GCS=1 the
# fake-gcs-server emulator. `make test` uses both.
TRAINER ?=
GCS ?=
comma := ,
EXTRA_FLAGS = $(if $(KUEUE),--with kueue) $(if $(TRAINER),--with trainer) $(if $(GCS),--with gcs)
BUILD_FLAGS = $(if $(filter cluster-autoscaler,$(subst $(comma), ,$(AUTOSCALER))),--with-autoscaler) \
  $(if $(filter karpenter,$(subst $(comma), ,$(AUTOSCALER))),--with karpenter) $(EXTRA_FLAGS)
# torch for the example trainer, CPU use only. PyPI's wheel links the CUDA runtime libraries directly, so
# they must be present even on CPU; triton, cusolver, cccl, nvtx and cuda-bindings are not needed
# (measured: ~2.35 GB download, ~100 s on a fresh machine). The CPU-only index is not reachable here.
TORCH_CPU := torch==2.15.0 nvidia-cudnn-cu13==9.26.0.51 nvidia-cusparselt-cu13==0.8.1 \
  nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.7.2 nvidia-cublas==13.4.1.3 nvidia-cusparse==12.7.10.12 \
  nvidia-cufft==12.2.0.57 nvidia-cuda-runtime==13.2.86 nvidia-cuda-cupti==13.2.86 \
  nvidia-cuda-nvrtc==13.2.86 nvidia-nvjitlink==13.5.37 nvidia-cufile==1.17.1.22
# checkpoint-format tests: the libraries that require torch (pyproject's frameworks extra), --no-deps so they keep
# TORCH_CPU; their other requirements are in the line after (psutil) or in dev (transformers' hub stack)
FRAMEWORKS := accelerate==1.15.0 pytorch-lightning==2.6.6 torchmetrics==1.9.0 lightning-utilities==0.15.3

.PHONY: sysdeps imagedeps images venv venv-torch lint cluster-build cluster-build-ca cluster-up cluster-down cluster-status test test-unit demo components bench bench-quick faults clean

# System packages from Debian: chromium renders the HTML reports in a test (screenshot + DOM check).
sysdeps:
	@command -v chromium >/dev/null || { (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@command -v chromium >/dev/null || { echo "chromium missing and could not be installed" >&2; exit 1; }

# Container tools from Debian (docs/images.md): podman + runc (crun refuses this kernel's hybrid cgroup v1 layout),
# buildah, and mmdebstrap for the local base image (no registry image can be pulled here).
imagedeps:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || \
	  { (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc buildah mmdebstrap >/dev/null; }
	@command -v podman >/dev/null && command -v mmdebstrap >/dev/null || { echo "podman/mmdebstrap missing and could not be installed" >&2; exit 1; }

# localhost/kfp-gpu:<version> (components, CLI, controller) and localhost/kfp-gpu-trainer:<version> on a local
# Debian 12 base; built once per content hash (Dockerfile, constraints, the sources that go in): a warm run takes
# seconds. `kfp-gpu run --containers PIPELINE.py` runs the kfp-gpu steps in the first.
images: imagedeps venv
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster.images

# Two venv targets: `venv` is what `make demo` (and the cluster targets) need: the SDK, the clouds' clients, the
# controller and the dev tools, no torch (tests/unit/test_no_torch_on_run.py: `kfp-gpu run` imports none).
# `venv-torch` adds the CPU torch and the frameworks for the trainer and the test paths (test, test-unit, lint,
# faults): ~2.35 GB that a first demo never downloads.
venv: $(STAMP)
$(STAMP): pyproject.toml kfp_gpu_rehearsal/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[gke,eks,vertex,storage,dev,controller]'
	$(BIN)/pip install -q --no-deps -e ./kfp_gpu_rehearsal  # the rehearsal world (kfp-gpu[rehearsal]), from this tree
	touch $(STAMP)

venv-torch: $(TORCH_STAMP)
$(TORCH_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps $(TORCH_CPU) $(FRAMEWORKS)
	$(BIN)/pip install -q filelock 'sympy>=1.13.3' networkx jinja2 'typing-extensions>=4.13' numpy 'setuptools>=77.0.3' psutil
	$(BIN)/python -c "import torch; torch.ones(1)"  # fail fast: a broken torch install must stop here
	touch $(TORCH_STAMP)

lint: venv-torch
	$(BIN)/ruff check kfp_gpu kfp_gpu_rehearsal tests pipelines bench
	$(BIN)/mypy

# Builds what is missing from ~/.cache/kfp-gpu/bin (Go builds, in parallel): the control plane, KWOK and the
# Training Operator always; cluster-autoscaler and/or Karpenter as AUTOSCALER names them, Kueue with KUEUE=1,
# JobSet + Trainer with TRAINER=1, fake-gcs-server with GCS=1.
cluster-build: venv
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster build $(BUILD_FLAGS)

# Builds what is missing (cluster-build), boots the local cluster (or re-uses a running one) with the profiles and
# components named by AUTOSCALER, KUEUE, TRAINER and GCS, then starts the GKE and AWS stand-in daemons
# (kfp_gpu_rehearsal.sim.daemon).
cluster-up: cluster-build
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster up --autoscaler $(AUTOSCALER) $(EXTRA_FLAGS)
	$(BIN)/python -m kfp_gpu_rehearsal.sim.daemon start

cluster-down: venv
	$(BIN)/python -m kfp_gpu_rehearsal.sim.daemon stop
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster down

cluster-status: venv
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster status

# The whole suite, integration tier included: it boots (or reuses) the local control plane first, with every
# optional component: cluster-autoscaler and Karpenter (kwok providers), Kueue, JobSet + Trainer v2 and
# fake-gcs-server (the ProvisioningRequest, Karpenter, Kueue, TrainJob and gs:// tests run against the real ones).
test: AUTOSCALER = cluster-autoscaler,karpenter
test: KUEUE = 1
test: GCS = 1
test: TRAINER = 1
# The images (make images) build in the background while cluster-up builds and boots the cluster: on a cold machine
# both take minutes and neither needs the other; the image tests then find them in the cache.
test: sysdeps imagedeps venv-torch lint
	@mkdir -p $(KFP_GPU_CACHE); $(BIN)/python -m kfp_gpu_rehearsal.devcluster.images > $(KFP_GPU_CACHE)/images-build.log 2>&1 & img=$$!; \
	  $(MAKE) --no-print-directory cluster-up AUTOSCALER=$(AUTOSCALER) KUEUE=$(KUEUE) GCS=$(GCS) TRAINER=$(TRAINER) \
	    || { kill $$img 2>/dev/null; exit 1; }; \
	  wait $$img || { tail -20 $(KFP_GPU_CACHE)/images-build.log; echo "make images failed (log above)" >&2; exit 1; }; \
	  tail -3 $(KFP_GPU_CACHE)/images-build.log
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The unit tier: needs no cluster and boots none (it never depends on cluster-up; tests/conftest.py stops the
# collection when a test that uses the cluster or an emulator lacks the integration mark).
test-unit: venv-torch
	$(BIN)/python -m pytest -q -m "not integration" $(PYTEST_ARGS)

demo: venv cluster-up
	$(BIN)/kfp-gpu run pipelines/llm_finetune.py

components: venv
	$(BIN)/kfp-gpu components
	$(BIN)/kfp-gpu compile pipelines/llm_finetune.py -o pipelines/llm_finetune.yaml --target kfp
	$(BIN)/kfp-gpu compile pipelines/llm_finetune.py -o pipelines/llm_finetune.vertex.yaml --target vertex

# The cluster-autoscaler peer (-tags kwok) is built from its Go module on first use, cached like the rest.
cluster-build-ca: venv
	$(BIN)/python -m kfp_gpu_rehearsal.devcluster build --with-autoscaler

# Benchmarks (docs/benchmarks.md): every side runs on one world, so the cluster comes up with the cluster-autoscaler
# (ProvisioningRequest sides; the bench starts its own CA for the reactive side from the same binary) and Karpenter
# (kwok provider) profiles. bench-quick: every side at N=4, < 2 min once the cluster is up; it writes
# bench/results/quick.json (and the doc only while no full run exists). bench: the full set, latest.json + the doc.
bench bench-quick: AUTOSCALER = cluster-autoscaler,karpenter
bench: cluster-up
	$(BIN)/python -m bench.run --full

bench-quick: cluster-up
	$(BIN)/python -m bench.run --quick

# The fault-detection table (docs/faults.md): the fault integration tests record their measured rows into
# bench/results/faults (tests/integration/fault_rows.py), then bench.report_faults renders the doc from them.
faults: AUTOSCALER = cluster-autoscaler,karpenter
faults: KUEUE = 1
faults: GCS = 1
faults: TRAINER = 1
faults: venv-torch cluster-up
	KFP_GPU_FAULT_ROWS=$(CURDIR)/bench/results/faults $(BIN)/python -m pytest -q -m integration tests/integration \
	  -k 'stall or hang or straggler or health or notice'
	$(BIN)/python -m bench.report_faults

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
