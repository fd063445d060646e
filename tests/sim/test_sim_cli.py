"""``python -m kfp_gpu_rehearsal.sim`` serves until SIGTERM and reports bad scenarios clearly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kfp_gpu import iam


def test_cli_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    proc = subprocess.Popen([sys.executable, "-m", "kfp_gpu_rehearsal.sim", "--scenario", "six-regions", "--port", "0",
                             "--url-file", str(url_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not url_file.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        url = url_file.read_text().strip()
        req = urllib.request.Request(f"{url}/compute/v1/projects/local-project/regions/europe-west4",
                                     headers={"Authorization": f"Bearer {iam.SIM_GCP_TOKEN}"})
        with urllib.request.urlopen(req) as r:
            body = json.loads(r.read())
        assert body["name"] == "europe-west4" and body["kind"] == "compute#region"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_cli_rejects_an_invalid_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("api_latency_ms: -1\n")
    out = subprocess.run([sys.executable, "-m", "kfp_gpu_rehearsal.sim", "--scenario", str(bad), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "api_latency_ms" in out.stderr


def test_both_stand_in_commands_name_a_missing_file_in_one_line(tmp_path: Path) -> None:
    for module in ("kfp_gpu_rehearsal.sim", "kfp_gpu_rehearsal.sim.aws"):
        for flag in ("--scenario", "--kubeconfig"):
            missing = str(tmp_path / f"missing-{flag[2:]}.yaml")
            r = subprocess.run([sys.executable, "-m", module, flag, missing, "--port", "0"], capture_output=True,
                               text=True, timeout=60)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, (module, flag, r.stderr)
            assert flag.lstrip("-") in lines[0] and missing in lines[0] and "Traceback" not in r.stderr
