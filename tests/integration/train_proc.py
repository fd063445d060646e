"""Run the train step in its own process, as a component pod would (``python -m tests.integration.train_proc ARGS``).

ARGS is a JSON file: {"spec": spec JSON, "run_id", "capacity_json", "job_json", "out": path for the output}.
The process reaches the cluster through $KUBECONFIG, like the component does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kfp_gpu.spec import ProvisioningSpec
from kfp_gpu.steps.entry import cancellable
from kfp_gpu.steps.train import run


def main(path: str) -> None:
    args = json.loads(Path(path).read_text())
    with cancellable("train"):
        result = run(ProvisioningSpec.from_json(args["spec"]), args["run_id"], args["capacity_json"],
                     job_json=args["job_json"])
    Path(args["out"]).write_text(result.output_json)


if __name__ == "__main__":
    main(sys.argv[1])
