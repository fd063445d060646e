import json
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_gpu import components
from kfp_gpu.component_docs import render
from kfp_gpu.image import image_for_version

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(components.ALL))
def test_component_yaml_and_readme_are_fresh(name):
    yaml_text, readme = render(name)
    assert (ROOT / "components" / name / "component.yaml").read_text() == yaml_text, "stale: make components"
    assert (ROOT / "components" / name / "README.md").read_text() == readme, "stale: make components"
    assert f"image: {image_for_version()}" in yaml_text
    assert "pip install" not in yaml_text  # install_kfp_package=False: the image carries kfp + kfp_gpu


def test_components_are_thin():
    for comp in components.ALL.values():
        body = comp.python_func.__code__
        assert len(body.co_consts) < 12, f"{comp.name} should only parse inputs and call kfp_gpu.steps"


def test_malformed_spec_json_fails_the_step_cleanly(tmp_path):
    code = (
        "from kfp_gpu.steps.entry import run_component\n"
        "run_component('preflight', '{\"nodes\": 0, \"accelerator\": \"a100-80gb\"}', 'run-1', '')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "invalid nodes=0" in r.stderr
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["type"] == "InvalidSpec" and err["fields"]["field"] == "nodes"
