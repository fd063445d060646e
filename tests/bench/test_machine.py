"""bench/machine.py: the job launch's CPU and API-server profile (real /proc of this machine; no cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench import machine, report_control_plane

METRICS = """# HELP apiserver_request_duration_seconds x
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.005"} 3
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 1.5
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 9
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="DELETE",version="v1"} 7
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 0.25
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="",verb="POST",version="v1"} 4
"""


def test_the_api_servers_create_time_counts_only_creates_of_the_resource_itself() -> None:
    got = machine.api_seconds(METRICS)
    assert got == {"api_post_pods_s": 1.5, "api_post_pods_n": 10.0, "api_post_services_s": 0.25,
                   "api_post_services_n": 4.0}  # the binding subresource and the DELETEs are not creates
    later = machine.api_seconds(METRICS.replace("} 1.5", "} 2.0").replace("} 10\n", "} 12\n"))
    assert machine.api_diff(got, later) == {"api_post_pods_s": 0.5, "api_post_pods_n": 2.0,
                                            "api_post_services_s": 0.0, "api_post_services_n": 0.0}


def test_a_process_is_grouped_by_its_binary_or_its_command_line() -> None:
    bin_ = "/root/.cache/kfp-gpu/bin"
    assert machine.group_of(f"{bin_}/kube-apiserver-v1.34.4 --etcd-servers=x") == "kube-apiserver"
    assert machine.group_of(f"{bin_}/training-operator-v1.9.3 --kubeconfig=x") == "training-operator"
    assert machine.group_of(f"{bin_}/cluster-autoscaler-v0.0.0-20250613073258-1959f5f61f6c --x") == \
        "cluster-autoscaler"
    assert machine.group_of("/x/.venv/bin/python -m kfp_gpu.cli controller --standalone") == "kfp-gpu-controller"
    assert machine.group_of("/x/.venv/bin/python -m kfp_gpu_rehearsal.sim --port 8787") == "stand-in"
    assert machine.group_of("bash -c kube-apiserver") == ""


def test_cpu_burnt_by_a_child_of_the_bench_is_the_bench_s_and_the_machine_s() -> None:
    before = machine.snapshot()
    child = subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\n"
                            "while time.process_time() - t < 0.6: pass"], check=True)
    assert child.returncode == 0
    t = time.process_time()
    while time.process_time() - t < 0.3:  # and this process itself
        pass
    used = machine.cpu_used(before, machine.snapshot())
    assert used["cpu_bench"] >= 0.8, used  # the reaped child's 0.6 s (cutime) and our 0.3 s
    assert used["cpu_busy"] >= used["cpu_bench"] - 0.05, used
    assert used["cpu_capacity"] >= used["cpu_busy"], used
    assert used["cpu_capacity"] <= 30 * (os.cpu_count() or 1), used


def test_the_report_says_where_the_launch_went() -> None:
    ps = {"launch_cpu_capacity": {"median": 10.0}, "launch_cpu_busy": {"median": 9.5},
          "launch_cpu_kube-apiserver": {"median": 4.0}, "launch_cpu_etcd": {"median": 1.0},
          "launch_cpu_other": {"median": 0.01}, "launch_api_post_pods_s": {"median": 2.5},
          "launch_api_post_pods_n": {"median": 64.0}, "launch_api_post_services_s": {"median": 1.0},
          "launch_api_post_services_n": {"median": 64.0}}
    cp = {"512": {"stats": {"job_launch": {"median": 5.0}}, "profile_stats": ps, "job_kind": "trainjob"}}
    lines = report_control_plane.launch_profile(cp)
    line = next(x for x in lines if x.startswith("* 512 GPUs (TrainJob)"))
    assert "busy 9.5 of 10.0 CPU-seconds (95%)" in line
    assert "kube-apiserver 4.0, etcd 1.0." in line  # the busiest first; under 0.05 s left out
    assert "pods: 2.50 s over 64 creates" in line
    assert report_control_plane.launch_profile({"512": {"stats": {}, "profile_stats": {}}}) == []
