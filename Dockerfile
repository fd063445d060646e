# kfp-gpu component image. Every component.yaml points at ghcr.io/kfp-gpu/kfp-gpu:<package version>
# (kfp_gpu.image.image_for_version()), so the tag below MUST equal [project].version in pyproject.toml;
# tests/test_image_version.py checks it.
#
# Build and push (from the repository root; Docker/BuildKit or podman; `make images` builds it locally on a Debian
# base with podman, docs/images.md):
#   VERSION=$(python -c "import kfp_gpu.image as i; print(i.VERSION)")
#   docker build --build-arg KFP_GPU_VERSION=$VERSION -t ghcr.io/kfp-gpu/kfp-gpu:$VERSION .
#   docker push ghcr.io/kfp-gpu/kfp-gpu:$VERSION
# Multi-arch:
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg KFP_GPU_VERSION=$VERSION \
#     -t ghcr.io/kfp-gpu/kfp-gpu:$VERSION --push .
# Smoke test:
#   docker run --rm ghcr.io/kfp-gpu/kfp-gpu:$VERSION python -c "import kfp_gpu, kfp, kfp.kubernetes"

# The base: the public python:3.11-slim by default. `make images` builds on a local Debian 12 base instead
# (--build-arg BASE=localhost/kfp-gpu-base:bookworm-py311, made by mmdebstrap: no registry image is pulled there).
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG KFP_GPU_VERSION=0.1.0
LABEL org.opencontainers.image.title="kfp-gpu" \
      org.opencontainers.image.version="${KFP_GPU_VERSION}" \
      org.opencontainers.image.source="https://github.com/kfp-gpu/kfp-gpu" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.kfp-gpu.version="${KFP_GPU_VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kfp-gpu
# The dependencies first (their own layer: a code change rebuilds only the layers below), read from pyproject.toml:
# kfp and kfp-kubernetes pinned to the SDK the components were compiled with (install_kfp_package=False), the
# gke/eks/controller extras, everything within the versions checked to co-install (constraints.txt).
COPY pyproject.toml README.md constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + [d for x in ('gke', 'eks', 'controller') for d in p['optional-dependencies'][x]]))" \
      > /tmp/requirements.txt \
 && pip install -c constraints.txt "kfp==2.17.3" "kfp-kubernetes==2.17.3" -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY kfp_gpu ./kfp_gpu
RUN pip install --no-deps . \
 && pip check \
 && python -c "import kfp_gpu.image as i, sys; sys.exit(i.VERSION != '${KFP_GPU_VERSION}')" \
 && useradd --uid 10001 --create-home kfpgpu

# No credentials are baked in: use Workload Identity (GKE) or IRSA (EKS). See docs/rbac-iam.md.
USER 10001
WORKDIR /home/kfpgpu
