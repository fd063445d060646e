# no `from __future__ import annotations`: kfp components need real annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kfp import compiler, dsl

from tests.submit.standins import FakeKfp


@dsl.component(base_image="python:3.11-slim")
def _hello(msg: str) -> str:
    return msg


@dsl.pipeline(name="tiny-pipeline")
def tiny_pipeline(msg: str = "hi") -> None:
    _hello(msg=msg)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    out = tmp_path / "tiny.yaml"
    compiler.Compiler().compile(tiny_pipeline, str(out))
    return out


@pytest.fixture
def two_doc_package(package: Path, tmp_path: Path) -> Path:
    """What kfp-kubernetes produces: the PipelineSpec plus a platform-spec document."""
    out = tmp_path / "two.yaml"
    out.write_text(package.read_text() + "\n---\nplatforms:\n  kubernetes:\n    deploymentSpec: {}\n")
    return out


@pytest.fixture
def kfp_server() -> Iterator[FakeKfp]:
    fake = FakeKfp()
    fake.http.start()
    yield fake
    fake.http.stop()


@pytest.fixture
def kfp_server_with_token() -> Iterator[FakeKfp]:
    fake = FakeKfp(token="s3cret-token-value")
    fake.http.start()
    yield fake
    fake.http.stop()
