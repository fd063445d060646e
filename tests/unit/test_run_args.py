"""`kfp-gpu run`: --arg parsing and typing by the pipeline's signature, bad files, the progress stream."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kfp_gpu import cli
from kfp_gpu.errors import InvalidSpec
from kfp_gpu_rehearsal import demo

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/integration/pipelines/tiny_pipeline.py"
PLAIN = """from kfp import dsl

@dsl.component(base_image="python:3.11-slim")
def hello() -> str:
    return "hi"

@dsl.pipeline(name="plain")
def plain() -> None:
    hello()
"""


@pytest.fixture(scope="module")
def tiny_inputs() -> dict[str, object]:
    return dict(demo.load(TINY).component_spec.inputs or {})


def _one_line(exc: pytest.ExceptionInfo[InvalidSpec]) -> str:
    msg = cli.one_line(exc.value)
    assert "\n" not in msg
    return msg


def test_args_are_typed_by_the_signature(tiny_inputs: dict[str, object]) -> None:
    got = demo.typed_args(["greeting=a=b c", "repeat=3", "shout=Yes"], tiny_inputs, "tiny-l4")
    assert got == {"greeting": "a=b c", "repeat": 3, "shout": True}
    assert type(got["repeat"]) is int and type(got["shout"]) is bool
    assert demo.typed_args(["shout=0"], tiny_inputs, "tiny-l4") == {"shout": False}
    assert demo.typed_args([], tiny_inputs, "tiny-l4") == {}  # defaults come from the pipeline


def test_unknown_arg_lists_the_parameters(tiny_inputs: dict[str, object]) -> None:
    with pytest.raises(InvalidSpec) as err:
        demo.typed_args(["steps=5"], tiny_inputs, "tiny-l4")
    msg = _one_line(err)
    assert "invalid --arg='steps': is not a parameter of pipeline tiny-l4" in msg
    assert "greeting:String, repeat:Integer, shout:Boolean" in msg


@pytest.mark.parametrize("pair,needle", [
    ("repeat=three", "invalid --arg repeat='three': must be an integer"),
    ("repeat=1.5", "the pipeline declares it Integer"),
    ("shout=maybe", "must be true or false"),
    ("greeting", "invalid --arg='greeting': must be NAME=VALUE"),
    ("=x", "must be NAME=VALUE"),
])
def test_bad_values_are_one_line(tiny_inputs: dict[str, object], pair: str, needle: str) -> None:
    with pytest.raises(InvalidSpec) as err:
        demo.typed_args([pair], tiny_inputs, "tiny-l4")
    assert needle in _one_line(err)


def test_twice_and_missing_required() -> None:
    class Spec:
        def __init__(self, type: str, default: object = None, optional: bool = False) -> None:
            self.type, self.default, self.optional = type, default, optional

    inputs = {"lr": Spec("Float"), "tags": Spec("List", [], True), "cfg": Spec("Dict", {}, True),
              "data": Spec("system.Dataset@0.0.1", None, True)}
    assert demo.typed_args(["lr=1e-3", "tags=[\"a\"]", "cfg={\"k\": 1}"], inputs, "p") == \
        {"lr": 0.001, "tags": ["a"], "cfg": {"k": 1}}
    with pytest.raises(InvalidSpec, match="is given twice"):
        demo.typed_args(["lr=1", "lr=2"], inputs, "p")
    with pytest.raises(InvalidSpec) as err:
        demo.typed_args([], inputs, "p")
    assert "invalid --arg='lr': required by pipeline p (no default) (fix: --arg lr=VALUE)" in _one_line(err)
    with pytest.raises(InvalidSpec, match="must be a JSON list"):
        demo.typed_args(["lr=1", "tags={}"], inputs, "p")
    with pytest.raises(InvalidSpec, match="kfp-gpu run passes parameters only"):
        demo.typed_args(["lr=1", "data=/tmp/x"], inputs, "p")


@pytest.mark.parametrize("body,needle", [
    ("x = 1\n", "must define exactly one @kfp_gpu.provisioned pipeline, found none"),
    (PLAIN, "found none (fix: decorate the pipeline with @kfp_gpu.provisioned(spec))"),
    ("def broken(:\n", "fails to import: SyntaxError"),
    ("import no_such_module_kfp_gpu\n", "fails to import: ModuleNotFoundError: No module named 'no_such_module_kfp_gpu'"),
])
def test_files_without_a_provisioned_pipeline_fail_in_one_line_before_booting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, needle: str) -> None:
    f = tmp_path / "user_pipeline.py"
    f.write_text(body)
    assert cli.main(["run", str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kfp-gpu: invalid pipeline file="), err
    assert needle in lines[0]


def test_missing_file_and_unknown_pipeline_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "no/such/pipeline.py"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["run", str(TINY), "--pipeline", "nope"]) == 2
    assert "invalid --pipeline='nope': not found" in capsys.readouterr().err


def test_progress_lines_and_run_id_from_the_kfp_local_stream() -> None:
    log, term = io.StringIO(), io.StringIO()
    clock = iter([10.0, 12.5, 20.0, 21.25]).__next__
    p = demo.Progress(log, term, clock=clock)
    stream = ("12:00:00.000 - INFO - Executing task \x1b[96m'quota-preflight'\x1b[0m\n"
              '    {"inputs": {"parameterValues": {"run_id": "1234",\n'
              "12:00:02.500 - INFO - Task \x1b[96m'quota-preflight'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m\n"
              "12:00:03.000 - INFO - Executing task 'train-pytorchjob'\n"
              '    "run_id": "9999"\n'
              "12:00:04.000 - INFO - Task 'train-pytorchjob' finished with status FAILURE\n")
    for i in range(0, len(stream), 7):  # kfp.local writes in arbitrary pieces
        p.write(stream[i:i + 7])
    assert log.getvalue() == stream
    assert term.getvalue().splitlines() == [
        "  > quota-preflight started", "  ✓ quota-preflight finished in 2.5s",
        "  > train-pytorchjob started", "  ✗ train-pytorchjob failed (FAILURE) in 1.2s"]
    assert p.run_id == "1234"
    assert p.finished == {"quota-preflight": "SUCCESS", "train-pytorchjob": "FAILURE"}


def test_progress_lines_say_durations_in_the_world_s_clock() -> None:
    log, term = io.StringIO(), io.StringIO()
    clock = iter([10.0, 12.5]).__next__
    p = demo.Progress(log, term, clock=clock, scale=120.0)
    p.write("Executing task 'scale-up'\nTask 'scale-up' finished with status SUCCESS\n")
    assert term.getvalue().splitlines() == ["  > scale-up started", "  ✓ scale-up finished in 5.0 min"]


def test_a_failed_step_s_error_line_is_shown_under_its_failure_once_per_distinct_error() -> None:
    """The step's ``{"error": ...}`` line (kfp_gpu.errors' JSON) under the task's failure line; KFP's retries of the same
    error do not repeat it; a success's earlier error (a retry that then passed) is not shown."""
    log, term = io.StringIO(), io.StringIO()
    p = demo.Progress(log, term, clock=lambda: 0.0)
    err = ('    {"error": {"type": "InvalidSpec", "message": "invalid nodes=0: must be in [1, 4096]", '
           '"remediation": "set nodes to a value in [1, 4096]", "transient": false}}\n')
    attempt = "Executing task 'quota-preflight'\n" + err + "Task 'quota-preflight' finished with status FAILURE\n"
    p.write(attempt + attempt)
    p.write("Executing task 'scale-up'\n" + err.replace("nodes=0", "x") + "Task 'scale-up' finished with status SUCCESS\n")
    p.write("Executing task 'teardown'\n" + '    {"error": not json\n' + "Task 'teardown' finished with status FAILURE\n")
    assert term.getvalue().splitlines() == [
        "  > quota-preflight started", "  ✗ quota-preflight failed (FAILURE) in 0.0s",
        "    invalid nodes=0: must be in [1, 4096] (fix: set nodes to a value in [1, 4096])",
        "  > quota-preflight started", "  ✗ quota-preflight failed (FAILURE) in 0.0s",
        "  > scale-up started", "  ✓ scale-up finished in 0.0s",
        "  > teardown started", "  ✗ teardown failed (FAILURE) in 0.0s"]
    assert p.step_errors == {"quota-preflight": "invalid nodes=0: must be in [1, 4096] (fix: set nodes to a value in "
                             "[1, 4096])", "scale-up": "invalid x: must be in [1, 4096] (fix: set nodes to a value in "
                             "[1, 4096])"}


@pytest.mark.parametrize("argv", [["compile", "-o", "{out}"], ["preflight"], ["submit", "--kfp-host", "http://x:1"]])
@pytest.mark.parametrize("body,needle", [
    ("def broken(:\n    pass\n", "fails to import: SyntaxError: invalid syntax at {file}:1"),
    ("x = 1\nimport no_such_module_kfp_gpu\n",
     "fails to import: ModuleNotFoundError: No module named 'no_such_module_kfp_gpu' at {file}:2"),
    ("def f():\n    raise RuntimeError('boom\\nsecond line')\n\nf()\n", "fails to import: RuntimeError: boom at {file}:2"),
])
def test_every_command_that_reads_a_pipeline_file_says_its_import_error_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], body: str, needle: str) -> None:
    """compile, preflight and submit read the file through the same loader as run: the user's error, where it is
    (the file's own line, not importlib's), and no traceback; nothing is written."""
    f = tmp_path / "user_pipeline.py"
    f.write_text(body)
    out = tmp_path / "out.yaml"
    assert cli.main([argv[0], str(f), *[a.format(out=out) for a in argv[1:]]]) == 2
    printed, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert printed == "" and len(lines) == 1, err
    assert needle.format(file=f) in lines[0] and f"(fix: run python {f} for the traceback" in lines[0]
    assert not out.exists()


def test_a_directory_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(tmp_path), "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"kfp-gpu: invalid pipeline file='{tmp_path}': is a directory, not a file (fix: pass the path of "
                   "a Python file that defines one @kfp_gpu.provisioned pipeline (e.g. pipelines/llm_finetune.py))")


@pytest.mark.parametrize("flags,needle", [
    ([], "invalid --kfp-host='': required unless --vertex"),
    (["--kfp-host", "ml-pipeline-ui:80"], "invalid --kfp-host='ml-pipeline-ui:80': required unless --vertex, an http"),
    (["--vertex", "--pipeline-root", "gs://b/root"], "invalid --project='': Vertex needs the GCP project id"),
    (["--vertex", "--project", "p", "--pipeline-root", "/local"], "invalid --pipeline-root='/local': Vertex needs a gs://"),
])
def test_submit_names_the_flag_it_lacks_before_reading_the_file(
        capsys: pytest.CaptureFixture[str], flags: list[str], needle: str) -> None:
    """The flag as typed (not the Python keyword), before the file is loaded: a missing file is not the error."""
    assert cli.main(["submit", "no/such/file.py", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kfp-gpu: {needle}"), err
