"""Fixtures of the web page's tests.

``recorded_runs`` is a runs directory holding one eval run made through the real
runner and trace writer over a scripted backend: a problem whose model output is
hostile markup (``<script>``, ``<img onerror>``), one whose samples the loop
monitor stopped (``finish_reason="loop"``, then the Context's retry), and a
wrong one. The fast tests read it through ``TestClient``; the browser tests
(``test_browser.py``) serve it beside a real run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from refinery.engine.types import Completion, Message, SamplingParams
from refinery.eval.datasets import Example
from refinery.eval.runner import EvalConfig, run_eval
from refinery.serving import ServerConfig, create_app
from refinery.ui import mount_ui
from tests.scripted_backend import ScriptedBackend

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert("y")> The answer is 4.'
RUN = "toy-sc"
EXAMPLES = [
    Example(id="p-hostile", prompt="hostile: what is 2+2?", gold="4", verifier="math",
            dataset="toy"),
    Example(id="p-loop", prompt="loopy: what is 2+2?", gold="4", verifier="math",
            dataset="toy"),
    Example(id="p-wrong", prompt="what is 2+3?", gold="5", verifier="math", dataset="toy"),
]


class LoopingBackend(ScriptedBackend):
    """A scripted backend whose replies containing ``LOOP`` end as the loop monitor
    stops them (``finish_reason="loop"``), except the retry after the nudge."""

    def _completion(self, messages: Sequence[Message], params: SamplingParams,
                    i: int) -> Completion:
        comp = super()._completion(messages, params, i)
        retried = "went in circles" in messages[-1].content
        if "LOOP" in comp.text and not retried:
            return comp.model_copy(update={"finish_reason": "loop"})
        return comp


def scripted_backend(**knobs: Any) -> LoopingBackend:
    return LoopingBackend([(r"hostile", HOSTILE), (r"loopy", "LOOP LOOP LOOP 4"),
                           (r".*", "The answer is \\boxed{4}.")], **knobs)


async def record_run(out: Path, strategy: str = "sc(cot, n=2)") -> None:
    """The toy run, made by the real runner (results, traces, config) over the script."""
    config = EvalConfig(dataset="toy", strategy=strategy, out=str(out))
    await run_eval(config, backend=scripted_backend(), examples=EXAMPLES, progress=False)


@pytest.fixture(scope="session")
async def recorded_runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    await record_run(root / RUN)
    return root


def ui_app(runs: Path | None = None, **config: Any) -> FastAPI:
    """``refinery serve``'s app over the scripted backend, with the page mounted."""
    return mount_ui(create_app(ServerConfig(**config), backend=scripted_backend()), runs=runs)


@pytest.fixture
def client(recorded_runs) -> TestClient:
    return TestClient(ui_app(recorded_runs))
