#!/bin/bash
# A cold `make demo` as on a fresh machine: fresh clone, empty kfp-gpu cache, empty Go module/build caches, no pip cache.
set -e
rm -rf /tmp/cold && mkdir -p /tmp/cold
git clone -q /work/main /tmp/cold/kfp-gpu
cd /tmp/cold/kfp-gpu
export KFP_GPU_CACHE=/tmp/cold/cache GOMODCACHE=/tmp/cold/gomod GOCACHE=/tmp/cold/gocache PIP_NO_CACHE_DIR=1
date -u +%FT%TZ > /tmp/cold/start
/usr/bin/time -v make demo > /tmp/cold/demo.log 2>&1
echo "rc=$?" >> /tmp/cold/demo.log
date -u +%FT%TZ > /tmp/cold/end
