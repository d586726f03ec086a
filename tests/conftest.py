"""Shared fixtures. One real vLLM engine per test session (it takes 15-30 s to
start on 2 CPU cores), started lazily by the first test that needs it; vLLM's own
servers, one of each per session, started as soon as collection shows they are used."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.datasets import gsm8k_file
from tests.servers import ServerProcess, start_vllm_server

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # as `make test` runs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray reads its auth mode once, when first imported (vLLM imports it): the test
# clusters (tests/eval/test_ray_pool.py) use token auth, as `ray start` does, with a
# token made for this test run (a fresh machine has no ~/.ray/auth_token).
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

ROOT = Path(__file__).resolve().parent.parent
# CI lays shared/ beside the clone; a clone elsewhere sets $REFINERY_GSM8K.
GSM8K = gsm8k_file("test").parent
FULL_SUITE = os.environ.get("REFINERY_TEST_ALL") == "1"


def repeat(quick: int, full: int) -> int:
    """How often a soak, kill loop or fuzz run repeats: ``quick`` in ``make test``,
    ``full`` in ``make test-all`` (the counts docs/reliability.md reports)."""
    return full if FULL_SUITE else quick


@pytest.fixture(scope="session")
async def vllm_backend():
    from refinery.engine.backends.vllm import VLLMBackend

    backend = await VLLMBackend.create(DEFAULT_MODEL)
    yield backend
    await backend.aclose()


THINK_MODEL = "smollm2-135m-think"  # distill/think_model.py: it writes <think>...</think>


def think_model_dir() -> str:
    """The built thinking model's directory; the test is skipped, with how to build it,
    when it is not built."""
    from refinery.engine.errors import UnknownModelError
    from refinery.engine.models import BUILT_MODELS, built_model

    try:
        return str(built_model(BUILT_MODELS[THINK_MODEL]))
    except UnknownModelError as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="session")
async def thinking_backend():
    """The small thinking model with vLLM's ``deepseek_r1`` reasoning parser: one engine
    for the session's tests of thinking (a second one beside ``vllm_backend``)."""
    from refinery.engine.backends.vllm import VLLMBackend, VLLMConfig

    think_model_dir()

    backend = await VLLMBackend.create(THINK_MODEL, VLLMConfig(reasoning_parser="deepseek_r1"))
    yield backend
    await backend.aclose()


# -- vLLM's own servers, beside the in-process engine --------------------------------------
#
# Each start is mostly one core importing vLLM twice (the server, then its engine
# core), so each server starts as soon as collection shows that a selected test
# needs it: beside the session engine's start and the one-core tests before its
# first user, instead of holding that test up. Niced, a start takes only the CPU
# the running tests leave; an idle server costs none.


@dataclass(frozen=True)
class PRMServer:
    """A process reward model being served: where, under which name, and the one
    token of its vocabulary its server pools at (a format needs the tag's text)."""

    url: str
    model: str
    step_tag: str
    step_tag_id: int


@dataclass(frozen=True)
class SessionServer:
    """How one of the session's vLLM servers serves the embedded model."""

    args: tuple[str, ...]
    kvcache_gib: int


PRM = PRMServer(url="", model=DEFAULT_MODEL + "-prm", step_tag="<file_sep>", step_tag_id=5)
SESSION_SERVERS = {
    # As the in-process engine runs: JSON without free whitespace, which a sampled
    # 135M model otherwise fills until max_tokens.
    "vllm_server": SessionServer(
        ("--served-model-name", DEFAULT_MODEL, "--structured-outputs-config",
         '{"backend": "xgrammar", "disable_any_whitespace": true}'), kvcache_gib=2),
    # The embedded model as a classifier whose two classes are the LM head's rows for
    # "No" and "Yes", read at every step tag (STEP pooling).
    "prm_server": SessionServer(
        ("--served-model-name", PRM.model, "--runner", "pooling", "--convert", "classify",
         "--hf-overrides",
         '{"classifier_from_token": ["No", "Yes"], "method": "no_post_processing"}',
         "--pooler-config",
         f'{{"task": "token_classify", "tok_pooling_type": "STEP", '
         f'"step_tag_id": {PRM.step_tag_id}}}'), kvcache_gib=1),
}
STARTED = pytest.StashKey[dict[str, ServerProcess]]()
LOGS = pytest.StashKey[Path]()
READY_WITHIN = 300  # seconds; engine starts share 2 cores with the tests
AHEAD_NICE = 10  # the niceness of a server started ahead of need


def _start(config: pytest.Config, name: str) -> ServerProcess:
    from refinery.engine.models import resolve_model

    if LOGS not in config.stash:
        config.stash[LOGS] = Path(tempfile.mkdtemp(prefix="refinery-vllm-servers-"))
    spec = SESSION_SERVERS[name]
    server = start_vllm_server(resolve_model(DEFAULT_MODEL), spec.args,
                               config.stash[LOGS] / f"{name}.log", spec.kvcache_gib,
                               nice=AHEAD_NICE)
    config.stash.setdefault(STARTED, {})[name] = server
    return server


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    for name in SESSION_SERVERS.keys() & used:
        _start(session.config, name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in session.config.stash.get(STARTED, {}).values():
        server.terminate()
    if LOGS in session.config.stash:
        shutil.rmtree(session.config.stash[LOGS], ignore_errors=True)


def _ready(config: pytest.Config, name: str) -> ServerProcess:
    """The session's ``name`` server (started at collection, or now), once it answers."""
    server = config.stash.get(STARTED, {}).get(name) or _start(config, name)
    server.wait_ready(READY_WITHIN)
    return server


@pytest.fixture(scope="session")
def vllm_server(request) -> str:
    """vLLM's own OpenAI server, its /v1 URL: a second engine, one for the session
    (seven modules use it)."""
    return _ready(request.config, "vllm_server").url + "/v1"


@pytest.fixture(scope="session")
def prm_server(request) -> PRMServer:
    """The embedded model served as a process reward model by vLLM's pooling runner:
    converted to a classifier whose two classes are the LM head's rows for "No" and
    "Yes", read at every ``<file_sep>`` (a special token of SmolLM2's vocabulary,
    STEP pooling), softmaxed. Its scores mean nothing; the wiring from text to
    per-step P(right) is real."""
    return replace(PRM, url=_ready(request.config, "prm_server").url)
