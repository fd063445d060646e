#!/bin/sh
# kfp-gpu GPU health probe. Exit codes (kfp_gpu/plan/health.py): 0 healthy, 2 nvidia-smi lists fewer GPUs than the
# node's allocatable nvidia.com/gpu, 3 dcgmi diag failed, 4 the NCCL all-reduce failed. Env (set by
# kfp_gpu/cluster/probe.py): KFP_GPU_EXPECTED_GPUS, KFP_GPU_DCGM_LEVEL (1-4), KFP_GPU_NCCL (0/1).
set -u
want="${KFP_GPU_EXPECTED_GPUS:?KFP_GPU_EXPECTED_GPUS is not set}"
level="${KFP_GPU_DCGM_LEVEL:-1}"

have="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)"
if [ "$have" -lt "$want" ]; then
  echo "gpu-probe: nvidia-smi lists $have GPU(s), the node's allocatable nvidia.com/gpu is $want" >&2
  nvidia-smi -L >&2 || true
  exit 2
fi
echo "gpu-probe: nvidia-smi lists $have GPU(s)"

# dcgmi talks to a host engine: start an embedded one unless the node already runs DCGM (GPU operator)
if ! dcgmi discovery -l >/dev/null 2>&1; then
  nv-hostengine -n --service-account nvidia-dcgm >/dev/null 2>&1 &
  sleep 2
fi
if ! dcgmi diag -r "$level"; then
  echo "gpu-probe: dcgmi diag -r $level failed" >&2
  exit 3
fi

if [ "${KFP_GPU_NCCL:-0}" = "1" ]; then
  if ! all_reduce_perf -b 8M -e 128M -f 2 -g "$want" -c 1 -n 5; then
    echo "gpu-probe: NCCL all-reduce over $want GPU(s) failed" >&2
    exit 4
  fi
fi
echo "gpu-probe: healthy"
exit 0
