"""Shared fixtures. One real vLLM engine per test session (it takes 15-30 s to
start on 2 CPU cores), started lazily by the first test that needs it."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from refinery.engine.models import DEFAULT_MODEL

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # as `make test` runs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray reads its auth mode once, when first imported (vLLM imports it): the test
# clusters (tests/eval/test_ray_pool.py) use token auth, as `ray start` does, with a
# token made for this test run (a fresh machine has no ~/.ray/auth_token).
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

ROOT = Path(__file__).resolve().parent.parent
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
if not GSM8K.exists():  # CI lays shared/ beside the clone; a clone elsewhere uses this
    GSM8K = Path(os.environ.get("REFINERY_GSM8K", "/work/shared/data/gsm8k"))
# eval's loaders look here first, so a clone outside the work tree finds the data.
os.environ.setdefault("REFINERY_GSM8K", str(GSM8K))
FULL_SUITE = os.environ.get("REFINERY_TEST_ALL") == "1"


def repeat(quick: int, full: int) -> int:
    """How often a soak, kill loop or fuzz run repeats: ``quick`` in ``make test``,
    ``full`` in ``make test-all`` (the counts docs/reliability.md reports)."""
    return full if FULL_SUITE else quick


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
async def vllm_backend():
    from refinery.engine.backends.vllm import VLLMBackend

    backend = await VLLMBackend.create(DEFAULT_MODEL)
    yield backend
    await backend.aclose()


@pytest.fixture(scope="session")
def model_path() -> str:
    from refinery.engine.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@contextlib.contextmanager
def running_vllm_server(model_path: str, args: list[str], log: Path,
                        kvcache_gb: int = 2) -> Iterator[str]:
    """vLLM's OpenAI server for ``model_path`` on 127.0.0.1, run as a module (the
    ``vllm`` console script of vllm-cpu fails) with ``args`` after the common ones;
    yields its root URL once /health answers, stops it on exit."""
    port = free_port()
    from refinery.engine.backends.vllm import ONE_PROCESS_ENV

    # The model in the engine core process, as VLLMBackend runs it on CPU: one
    # process start less (worker_in_engine_core).
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kvcache_gb), **ONE_PROCESS_ENV}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
             "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
             "--max-model-len", "2048", "--disable-log-stats", *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server not ready: {log.read_text()[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def vllm_server(model_path, tmp_path_factory):
    """vLLM's own OpenAI server, its /v1 URL. A second engine, started once for the
    session: four modules use it and each start costs 15-30 s (its idle engine
    costs no CPU)."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    args = ["--served-model-name", DEFAULT_MODEL,
            # as the in-process engine runs: JSON without free whitespace, which a
            # sampled 135M model otherwise fills until max_tokens
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}']
    with running_vllm_server(model_path, args, log) as url:
        yield url + "/v1"


@dataclass(frozen=True)
class PRMServer:
    """A process reward model being served: where, under which name, and the one
    token of its vocabulary its server pools at (a format needs the tag's text)."""

    url: str
    model: str
    step_tag: str
    step_tag_id: int


@pytest.fixture(scope="session")
def prm_server(model_path, tmp_path_factory):
    """The embedded model served as a process reward model by vLLM's pooling runner:
    converted to a classifier whose two classes are the LM head's rows for "No" and
    "Yes", read at every ``<file_sep>`` (a special token of SmolLM2's vocabulary,
    STEP pooling), softmaxed. Its scores mean nothing; the wiring from text to
    per-step P(right) is real."""
    server = PRMServer(url="", model=DEFAULT_MODEL + "-prm", step_tag="<file_sep>",
                       step_tag_id=5)
    log = tmp_path_factory.mktemp("prm-server") / "server.log"
    args = ["--served-model-name", server.model, "--runner", "pooling",
            "--convert", "classify",
            "--hf-overrides",
            '{"classifier_from_token": ["No", "Yes"], "method": "no_post_processing"}',
            "--pooler-config",
            f'{{"task": "token_classify", "tok_pooling_type": "STEP", '
            f'"step_tag_id": {server.step_tag_id}}}']
    with running_vllm_server(model_path, args, log, kvcache_gb=1) as url:
        yield replace(server, url=url)
