"""The controller's Prometheus text (kfp_gpu.controller.metrics): what a scrape shows after gangs move."""

from __future__ import annotations

import urllib.request

from kfp_gpu.controller import metrics


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in\n{text}")


def test_phases_gpus_latency_preemptions_and_idle_minutes() -> None:
    obj = {"spec": {"gpusPerNode": 8}}
    metrics.observe_gang("ns-a", "g1", {"phase": "Ready", "gangNodes": ["n1", "n2"]}, obj)
    metrics.observe_gang("ns-a", "g2", {"phase": "Training", "gangNodes": ["n3"]}, obj)
    metrics.observe_gang("ns-b", "g3", {"phase": "Released", "gangNodes": ["n4"]}, obj)
    before = metrics.render()
    metrics.observe_ready_latency(3.0)
    metrics.count_preemptions({"preemptions": 2.0})
    metrics.add_idle_minutes({"idle_gpu_minutes": 1.5})
    text = metrics.render()
    assert _value(text, 'kfp_gpu_gangs{phase="Ready"}') >= 1
    assert _value(text, 'kfp_gpu_gangs{phase="Training"}') >= 1
    assert _value(text, "kfp_gpu_gpus_held") >= 24  # released gangs hold nothing
    assert _value(text, 'kfp_gpu_request_to_ready_seconds_bucket{le="5.0"}') == \
        _value(before, 'kfp_gpu_request_to_ready_seconds_bucket{le="5.0"}') + 1
    assert _value(text, 'kfp_gpu_request_to_ready_seconds_bucket{le="2.5"}') == \
        _value(before, 'kfp_gpu_request_to_ready_seconds_bucket{le="2.5"}')
    assert _value(text, "kfp_gpu_preemptions_total") == _value(before, "kfp_gpu_preemptions_total") + 2
    assert _value(text, "kfp_gpu_idle_gpu_minutes_total") == _value(before, "kfp_gpu_idle_gpu_minutes_total") + 1.5
    metrics.forget("ns-a", "g1")
    metrics.forget("ns-a", "g2")
    metrics.forget("ns-b", "g3")
    assert _value(metrics.render(), "kfp_gpu_gpus_held") == _value(text, "kfp_gpu_gpus_held") - 24


def test_metrics_endpoint_serves_the_text() -> None:
    srv = metrics.serve(0, host="127.0.0.1")
    try:
        port = srv.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert r.status == 200 and "kfp_gpu_gangs" in body and "kfp_gpu_gpus_held" in body
    finally:
        srv.shutdown()
