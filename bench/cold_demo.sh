#!/bin/bash
# A cold `make demo` as on a fresh machine (README, "Two commands"): a fresh clone of this repository (or $1), empty
# kfp-gpu, Go module, Go build and pip caches under $COLD (default /tmp/cold). Stop the usual dev cluster first
# (`make cluster-down`): the cold cluster takes the same ports. Results: $COLD/demo.log (GNU time -v at the end).
set -e
REPO=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
COLD=${COLD:-/tmp/cold}
rm -rf "$COLD" && mkdir -p "$COLD"
git clone -q "$REPO" "$COLD/kfp-gpu"
cd "$COLD/kfp-gpu"
export KFP_GPU_CACHE=$COLD/cache GOMODCACHE=$COLD/gomod GOCACHE=$COLD/gocache PIP_NO_CACHE_DIR=1
date -u +%FT%TZ > "$COLD/start"
rc=0
/usr/bin/time -v make demo > "$COLD/demo.log" 2>&1 || rc=$?
echo "rc=$rc" >> "$COLD/demo.log"
date -u +%FT%TZ > "$COLD/end"
echo "cold make demo: rc=$rc, $(grep 'Elapsed (wall' "$COLD/demo.log" | sed 's/.*: //') wall; log $COLD/demo.log"
echo "stop its cluster: (cd $COLD/kfp-gpu && KFP_GPU_CACHE=$COLD/cache make cluster-down)"
