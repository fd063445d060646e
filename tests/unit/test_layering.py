"""Layering rules of docs/architecture.md, checked on the source tree."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "kfp_gpu"
CLOUD = ("google.cloud", "boto3", "botocore", "google.auth", "google.api_core")
CLOUD_OK = ("providers/gke", "providers/eks", "submit", "checkpoint")
IO_MODULES = ("kubernetes", "requests", "socket", "urllib3", "subprocess", "http", "boto3", "google")


def _imports(path: Path, top_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def _py_files():
    return sorted(p for p in PKG.rglob("*.py"))


@pytest.mark.parametrize("path", _py_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_cloud_sdks_only_in_their_packages_and_only_lazily(path):
    rel = str(path.relative_to(PKG))
    allowed = rel.startswith(CLOUD_OK)
    for mod in _imports(path, top_level_only=not allowed):
        if mod.startswith(CLOUD):
            assert allowed, f"{rel} imports {mod}; only {CLOUD_OK} may"
    if allowed:
        for mod in _imports(path, top_level_only=True):
            assert not mod.startswith(CLOUD), f"{rel} imports {mod} at module level; import it lazily"


@pytest.mark.parametrize("path", sorted((PKG / "plan").glob("*.py")), ids=lambda p: p.name)
def test_plan_does_no_io(path):
    for mod in _imports(path, top_level_only=False):
        assert mod.split(".")[0] not in IO_MODULES, f"plan/{path.name} imports {mod}"


@pytest.mark.parametrize("path", sorted((PKG / "cluster").rglob("*.py")), ids=lambda p: p.name)
def test_cluster_never_imports_steps(path):
    """cluster/ sits below steps/: not even a lazy (function-level) import of kfp_gpu.steps."""
    for mod in _imports(path, top_level_only=False):
        assert mod != "kfp_gpu.steps" and not mod.startswith("kfp_gpu.steps."), f"cluster/{path.name} imports {mod}"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # ``from kfp_gpu import steps``
        if isinstance(node, ast.ImportFrom) and node.module == "kfp_gpu":
            assert "steps" not in [a.name for a in node.names], f"cluster/{path.name} imports kfp_gpu.steps"


@pytest.mark.parametrize("path", sorted((PKG / "provisioners").rglob("*.py")), ids=lambda p: p.name)
def test_provisioners_never_import_steps(path):
    """provisioners/ sits between the steps and cluster/providers: it never imports kfp_gpu.steps."""
    for mod in _imports(path, top_level_only=False):
        assert mod != "kfp_gpu.steps" and not mod.startswith("kfp_gpu.steps."), f"provisioners/{path.name} imports {mod}"


def test_importing_the_sdk_loads_no_cloud_sdk():
    code = ("import sys, kfp_gpu, kfp_gpu.spec, kfp_gpu.dsl, kfp_gpu.steps.entry, kfp_gpu.providers\n"
            "bad = [m for m in sys.modules if m.startswith(('google.cloud.', 'boto3', 'botocore'))]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_checkpoint_helper_needs_no_kfp():
    code = "import sys, kfp_gpu.checkpoint\nsys.exit(1 if 'kfp' in sys.modules or 'kubernetes' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("path", _py_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= 450, f"{path.name} is too big; split it by concern"


# ---- the rehearsal (kfp_gpu_rehearsal/: sim, devcluster, demo) and bench/ -----------------------------------------
REH = PKG.parent / "kfp_gpu_rehearsal"  # the rehearsal world: its own distribution (kfp-gpu[rehearsal])
REHEARSAL_MODULES = ("kfp_gpu_rehearsal",)
STOOD_IN = ("kfp_gpu.steps", "kfp_gpu.provisioners", "kfp_gpu.providers", "kfp_gpu.controller")
BENCH = PKG.parent / "bench"


def _names(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth, with ``from X import Y`` also as ``X.Y``."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return out


def _under(mod: str, roots: tuple[str, ...]) -> bool:
    return any(mod == r or mod.startswith(r + ".") for r in roots)


def test_the_product_holds_no_rehearsal_code():
    """The stand-ins, the dev cluster and the rehearsal command live in kfp_gpu_rehearsal/, not in the wheel."""
    assert [p for p in ("sim", "devcluster", "demo.py") if (PKG / p).exists()] == []


@pytest.mark.parametrize("path", _py_files(), ids=lambda p: str(p.relative_to(PKG)))
def test_core_reaches_the_rehearsal_only_through_its_seam(path):
    """Core code never imports the stand-ins, the dev cluster, the rehearsal command or the benchmarks, not even
    lazily: it knows only kfp_gpu/rehearsal_seam.py (paths, environment names, the local node-label scheme, and
    load() for `kfp-gpu run`, `demo` and `dev-cluster`)."""
    bad = [m for m in _names(path) if _under(m, (*REHEARSAL_MODULES, "bench"))]
    assert bad == [], f"{path.relative_to(PKG)} imports {bad}; go through kfp_gpu.rehearsal_seam"


@pytest.mark.parametrize("path", sorted((REH / "devcluster").rglob("*.py")), ids=lambda p: p.name)
def test_the_dev_cluster_never_imports_the_standins(path):
    """One direction inside the rehearsal: the stand-ins (sim/) drive the dev cluster's nodes, never the reverse."""
    bad = [m for m in _names(path) if _under(m, ("kfp_gpu_rehearsal.sim",))]
    assert bad == [], f"devcluster/{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted(p for d in ("sim", "devcluster") for p in (REH / d).rglob("*.py")),
                         ids=lambda p: str(p.relative_to(REH)))
def test_the_rehearsal_never_reuses_what_it_stands_in_for(path):
    """The stand-ins and the dev cluster never import the steps, backends, providers or the controller: a world
    built from the code under test could not catch its mistakes (nor import the benchmarks). demo.py, the rehearsal
    command, runs the product and is not checked here."""
    bad = [m for m in _names(path) if _under(m, (*STOOD_IN, "bench"))]
    assert bad == [], f"{path.relative_to(REH)} imports {bad}"


@pytest.mark.parametrize("path", sorted(REH.rglob("*.py")), ids=lambda p: str(p.relative_to(REH)))
def test_the_rehearsal_imports_cloud_sdks_only_lazily_and_stays_small(path):
    for mod in _imports(path, top_level_only=True):
        assert not mod.startswith(CLOUD), f"{path.relative_to(REH)} imports {mod} at module level; import it lazily"
    assert len(path.read_text().splitlines()) <= 450, f"{path.name} is too big; split it by concern"


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_is_the_top(path):
    """bench/ may use anything; nothing in kfp_gpu uses it (checked above), and it never imports the tests."""
    bad = [m for m in _names(path) if _under(m, ("tests",))]
    assert bad == [], f"bench/{path.name} imports {bad}"


def test_importing_the_product_loads_no_rehearsal_module():
    code = ("import sys, kfp_gpu.cli, kfp_gpu.steps.entry, kfp_gpu.providers, kfp_gpu.provisioners, "
            "kfp_gpu.controller.runner, kfp_gpu.cluster.kube, kfp_gpu.rehearsal_seam\n"
            f"bad = [m for m in sys.modules if m.startswith({REHEARSAL_MODULES!r})]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
