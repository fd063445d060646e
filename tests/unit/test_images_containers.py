"""`make images` (kfp_gpu_rehearsal.devcluster.images) and `kfp-gpu run --containers` (kfp_gpu_rehearsal.devcluster.containers) without
podman: the content hash, the podman command lines, the step's environment, the import closure the image test
uses, and a kfp.local run whose kfp-gpu task goes to a recording stand-in for ``podman`` with the compiled argv."""


import json
import os
import sys
from pathlib import Path

import pytest
from kfp import compiler, dsl, local

from kfp_gpu_rehearsal.devcluster import containers, images
from tests.import_closure import closure, imports_of


def _repo(tmp_path: Path) -> Path:
    for rel, text in {"Dockerfile": "FROM x\n", ".dockerignore": "", "pyproject.toml": "", "README.md": "", "constraints.txt": "a==1\n",
                      "kfp_gpu/__init__.py": "", "kfp_gpu/a.py": "x = 1\n",
                      "kfp_gpu/__pycache__/a.cpython-311.pyc": "junk"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_component_inputs_are_the_copied_files_without_caches(tmp_path: Path) -> None:
    inputs = images.component_inputs(_repo(tmp_path))
    assert inputs == ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "constraints.txt", "kfp_gpu/__init__.py",
                      "kfp_gpu/a.py")


def test_content_hash_changes_with_the_dockerfile_the_lock_the_sources_and_the_base(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    img = images.Image(images.COMPONENT, "Dockerfile", images.component_inputs(repo))
    first = images.content_hash(img, "base1", repo)
    assert images.content_hash(img, "base1", repo) == first
    assert images.content_hash(img, "base2", repo) != first
    seen = {first}
    for rel in ("Dockerfile", ".dockerignore", "constraints.txt", "kfp_gpu/a.py"):
        (repo / rel).write_text((repo / rel).read_text() + "#\n")
        h = images.content_hash(img, "base1", repo)
        assert h not in seen, rel
        seen.add(h)
    (repo / "kfp_gpu/__pycache__/a.cpython-311.pyc").write_text("other")  # not an input
    assert images.content_hash(img, "base1", repo) in seen


def test_the_repository_trainer_inputs_exist() -> None:
    for image in images.images():
        images.content_hash(image, "b")  # raises for a missing input


def test_build_argv_uses_the_local_base_the_host_network_and_mounts_host_trust_read_only() -> None:
    img = images.Image(images.TRAINER, "pipelines/trainer/Dockerfile", ())
    argv = images.build_argv(img, ["/etc/pip.conf"])
    assert argv[:2] == ["podman", "build"] and argv[-1] == "."
    assert argv[argv.index("-f") + 1] == "pipelines/trainer/Dockerfile" and argv[argv.index("-t") + 1] == images.TRAINER
    assert f"BASE={images.BASE}" in argv and "--label" not in argv  # a label would defeat podman's layer cache
    assert argv[argv.index("--volume") + 1] == "/etc/pip.conf:/etc/pip.conf:ro"
    assert "--network" in argv and argv[argv.index("--network") + 1] == "host"


def test_base_script_debootstraps_and_imports_the_base(tmp_path: Path) -> None:
    script = images.base_script(tmp_path / "b.tar")
    assert script.startswith("mmdebstrap --variant=minbase --include=python3,python3-venv,")
    assert "podman import --change 'ENV PATH=/opt/python/bin:" in script and script.count(images.BASE) == 1


def test_a_recorded_hash_counts_only_while_the_image_is_the_one_built() -> None:
    record = {images.COMPONENT: {"hash": "h1", "id": "sha256:a"}}
    assert images.built_hash(record, images.COMPONENT, "sha256:a") == "h1"
    assert images.built_hash(record, images.COMPONENT, "sha256:b") == ""  # retagged or rebuilt by hand
    assert images.built_hash(record, images.COMPONENT, "") == ""  # removed
    assert images.built_hash(record, images.TRAINER, "sha256:a") == ""


def test_podman_env_writes_runc_cgroupfs_and_the_ulimits(tmp_path: Path) -> None:
    env = images.podman_env(tmp_path)
    text = Path(env["CONTAINERS_CONF"]).read_text()
    assert 'runtime = "runc"' in text and 'cgroup_manager = "cgroupfs"' in text and "nofile=20000:20000" in text


def test_run_argv_puts_the_command_after_the_image_untouched() -> None:
    command = ["sh", "-ec", 'program_path=$(mktemp -d)\n"$@"', "def f(): pass", "--executor_input", '{"a": 1}']
    argv = containers.run_argv("localhost/kfp-gpu:1", command, {"KUBECONFIG": "/k"}, ["/k", "/k"], ["/root"], "n")
    assert argv[argv.index("localhost/kfp-gpu:1") + 1:] == command
    assert argv.count("/k:/k:ro") == 1 and "/root:/root:rw" in argv and "KUBECONFIG=/k" in argv
    assert argv[argv.index("--network") + 1] == "host" and argv[argv.index("--user") + 1] == "0:0"


def test_step_env_keeps_the_rehearsal_variables_only() -> None:
    env = containers.step_env({"KUBECONFIG": "/k", "KFP_GPU_SIM_ENDPOINT": "http://x", "HOME": "/root",
                               "PATH": "/usr/bin", "AWS_ENDPOINT_URL_EKS": "http://y"}, {"KFP_GPU_SIM_ENDPOINT": "z"})
    assert env == {"KUBECONFIG": "/k", "KFP_GPU_SIM_ENDPOINT": "z", "AWS_ENDPOINT_URL_EKS": "http://y"}


def test_kubeconfig_files_names_the_ca(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("clusters: [{name: a, cluster: {server: 'https://x', certificate-authority: /ca.crt}}]\n"
                  "users: [{name: u, user: {token: t}}]\n")
    assert containers.kubeconfig_files(kc) == ["/ca.crt"]


def test_imports_of_counts_lazy_imports_but_not_type_checking_or_optional_ones() -> None:
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hidden\n"
           "try:\n    import optional\nexcept ImportError:\n    optional = None\n"
           "def f():\n    import lazy.mod\n    from . import sibling\n    from .pkg import thing\n")
    found = imports_of(src, "kfp_gpu.steps.x")
    assert {"lazy.mod", "kfp_gpu.steps.sibling", "kfp_gpu.steps.pkg", "kfp_gpu.steps.pkg.thing"} <= found
    assert not {"hidden", "optional"} & found


def test_closure_reaches_a_lazy_import_of_a_module_two_hops_away(tmp_path: Path) -> None:
    for rel, text in {"kfp_gpu/__init__.py": "", "kfp_gpu/steps/__init__.py": "",
                      "kfp_gpu/steps/s.py": "from kfp_gpu.util import helper\n",
                      "kfp_gpu/util.py": "def helper():\n    import not_in_image_xyz\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ours, theirs = closure(["kfp_gpu.steps.s"], tmp_path)
    assert ours == {"kfp_gpu", "kfp_gpu.steps", "kfp_gpu.steps.s", "kfp_gpu.util"}
    assert theirs == {"not_in_image_xyz"}


IMAGE = "localhost/kfp-gpu-test:1"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def kfp_gpu_like(x: int) -> int:
    """Stands for a kfp-gpu component: its body names the step entry (kfp_gpu.steps.entry), so it is routed to podman."""
    return x + 1


@dsl.component(base_image="python:3.11-slim", install_kfp_package=False)
def users(x: int) -> int:
    return x * 2


@dsl.pipeline(name="routing")
def routing(x: int = 1) -> int:
    return users(x=kfp_gpu_like(x=x).output).output


def test_kfp_gpu_tasks_go_to_podman_with_the_compiled_argv_and_user_tasks_stay_on_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``podman`` records its argv and runs what follows the image on the host (``python3`` is this
    interpreter there), so kfp.local gets real outputs back."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "podman").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(tmp_path / 'calls.jsonl')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"rest = sys.argv[sys.argv.index({IMAGE!r}) + 1:]\nos.execvp(rest[0], rest)\n")
    (bin_dir / "podman").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    monkeypatch.delenv("KUBECONFIG", raising=False)  # no kubeconfig to mount
    config = containers.Config(podman_env=env, expected_image=IMAGE)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    with containers.step_runner(config):
        task = routing(x=3)
    assert task.output == 8
    assert config.ran == [(IMAGE, "podman"), ("python:3.11-slim", "host")]
    from kfp.local import subprocess_task_handler

    assert subprocess_task_handler.SubprocessTaskHandler.__name__ == "SubprocessTaskHandler"  # restored

    (call,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    compiler.Compiler().compile(kfp_gpu_like, str(tmp_path / "c.yaml"))
    import yaml

    (ex,) = yaml.safe_load((tmp_path / "c.yaml").read_text())["deploymentSpec"]["executors"].values()
    after = call[call.index(IMAGE) + 1:]
    n = len(ex["container"]["command"])
    assert after[:n] == ex["container"]["command"]  # exactly the compiled command: python3 is not swapped
    assert after[n] == "--executor_input" and json.loads(after[n + 1])["inputs"]["parameterValues"] == {"x": 3}
    assert after[n + 2:] == ex["container"]["args"][2:] == ["--function_to_execute", "kfp_gpu_like"]


def test_cli_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from kfp_gpu.cli import main
    from kfp_gpu.image import VERSION

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"kfp-gpu {VERSION}"


def test_containers_without_the_image_fail_in_one_line_naming_make_images(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kfp_gpu.errors import InvalidSpec

    monkeypatch.setattr(images, "missing_tools", lambda: [])
    monkeypatch.setattr(images, "exists", lambda tag, env: False)
    with pytest.raises(InvalidSpec) as err:
        containers.prepare(tmp_path)
    assert images.COMPONENT in str(err.value) and "make images" in str(err.value) and "\n" not in str(err.value)


def test_progress_names_the_image_each_task_ran_in() -> None:
    import io

    from kfp_gpu_rehearsal.demo import Progress

    log, terminal = io.StringIO(), io.StringIO()
    p = Progress(log, terminal, clock=lambda: 0.0)
    p.write(f"INFO - Executing task 'teardown'\n    {containers.MARK} localhost/kfp-gpu:1 (podman)\n")
    p.write(f"INFO - Executing task 'evaluate'\n    {containers.MARK} host subprocess (python:3.11-slim is not built here)\n")
    assert terminal.getvalue().splitlines() == [
        "  > teardown started", "    teardown runs in localhost/kfp-gpu:1 (podman)",
        "  > evaluate started", "    evaluate runs in host subprocess (python:3.11-slim is not built here)"]
