"""The seam the product owns towards the local rehearsal (kfp_gpu/rehearsal_seam.py): paths, environment names, the
local target's node-label scheme, and the one-line install hint when `kfp-gpu run` finds no rehearsal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_gpu import rehearsal_seam as seam
from kfp_gpu.errors import InvalidSpec
from kfp_gpu.spec import Target, TargetKind

ROOT = Path(__file__).resolve().parents[2]


def test_only_a_local_target_selects_its_nodes_by_the_standin_s_cluster_label() -> None:
    assert seam.node_selector(Target(kind=TargetKind.LOCAL, cluster="c1")) == {"kfp-gpu.io/sim-cluster": "c1"}
    assert seam.node_selector(Target(kind=TargetKind.GKE, project="p", cluster="c1")) == {}


def test_paths_follow_the_cache_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(seam.CACHE_ENV, str(tmp_path))
    assert seam.local_kubeconfig() == tmp_path / "cluster" / "kubeconfig"
    assert seam.sim_url_file() == tmp_path / "cluster" / "sim.url"
    assert seam.running_sim_url() == ""  # no file: no stand-in
    (tmp_path / "cluster").mkdir()
    seam.sim_url_file().write_text("http://127.0.0.1:9\n")  # nothing answers there
    assert seam.running_sim_url() == ""


def test_a_local_target_finds_its_world_s_standin_before_the_daemon_s(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import http.server
    import threading

    from kfp_gpu.providers import local_endpoint

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == seam.SIM_PROBE else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    servers = [http.server.HTTPServer(("127.0.0.1", 0), Answer) for _ in range(2)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    daemon_url, world_url = (f"http://127.0.0.1:{srv.server_address[1]}" for srv in servers)
    monkeypatch.setenv(seam.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(seam.SIM_ENDPOINT_ENV, raising=False)
    try:
        assert local_endpoint("w1") == ""  # nothing recorded: no stand-in (for_target then names the fix)
        (tmp_path / "cluster").mkdir()
        seam.sim_url_file().write_text(daemon_url + "\n")
        assert local_endpoint("w1") == daemon_url
        assert seam.sim_url_file("w1") == tmp_path / "cluster" / "worlds" / "w1.url"
        assert seam.sim_url_file("aws") != tmp_path / "cluster" / "sim-aws.url"  # the AWS stand-in daemon's record
        seam.sim_url_file("w1").parent.mkdir()
        dead = subprocess.Popen([sys.executable, "-c", ""])  # noqa: S603
        dead.wait()
        seam.sim_url_file("w1").write_text(f"{world_url} {dead.pid}\n")
        assert local_endpoint("w1") == daemon_url  # its run is gone: the port may serve another world by now
        seam.sim_url_file("w1").write_text(f"{world_url} {os.getpid()}\n")
        assert local_endpoint("w1") == world_url
        assert local_endpoint("w2") == daemon_url  # another world's stand-in is not this one's
        monkeypatch.setenv(seam.SIM_ENDPOINT_ENV, "http://127.0.0.1:9")
        assert local_endpoint("w1") == "http://127.0.0.1:9"  # the process's own stand-in first (the test tier's)
        monkeypatch.delenv(seam.SIM_ENDPOINT_ENV)
        servers[1].shutdown()  # a live run's stand-in that does not answer (busy): still its world's, not the daemon's
        assert local_endpoint("w1") == world_url
        servers[0].shutdown()
        assert local_endpoint("w2") == ""  # the daemon's record (no pid) counts only while it answers
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def test_the_world_time_scale_is_one_on_a_real_cluster_and_named_when_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(seam.TIME_SCALE_ENV, raising=False)
    assert seam.world_time_scale() == 1.0
    monkeypatch.setenv(seam.TIME_SCALE_ENV, "120")
    assert seam.world_time_scale() == 120.0
    monkeypatch.setenv(seam.TIME_SCALE_ENV, "fast")
    with pytest.raises(InvalidSpec, match="KFP_GPU_WORLD_TIME_SCALE='fast'"):
        seam.world_time_scale()


def test_the_rehearsal_s_modules_load_by_name() -> None:
    assert seam.load("devcluster.worldtime").TIME_SCALE > 1


def test_kfp_gpu_run_without_the_rehearsal_prints_the_one_line_install_hint() -> None:
    code = ("import sys, kfp_gpu.rehearsal_seam as s\n"
            "s.PACKAGE = 'kfp_gpu_rehearsal_not_installed'\n"
            "from kfp_gpu.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    for argv in (["run", "pipelines/llm_finetune.py"], ["demo"], ["dev-cluster", "status"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 2 and r.stdout == "", (argv, r.stdout, r.stderr)
        assert r.stderr.splitlines() == [
            f"kfp-gpu: the local rehearsal is not installed (kfp_gpu_rehearsal_not_installed.{'devcluster.cli' if argv[0] == 'dev-cluster' else 'demo'}"
            " is missing) (fix: pip install 'kfp-gpu[rehearsal]')"], argv
