"""The prm step scorer: the text a process reward model reads, the per-step P(right)
read back from vLLM's /pooling, one request a level, errors as the hierarchy's, and
its configuration from the environment. A scripted pooling server on loopback
plays vLLM's part; the last test runs the embedded model behind vLLM's own."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from refinery.engine.errors import BackendError, BackendUnavailableError, SpecError
from refinery.verifiers import PRMStepScorer
from refinery.verifiers.step_prm import CHATML, QWEN_MATH_PRM, PRMFormat
from refinery.verifiers.steps import SCORERS, StepScorer, build_scorer
from tests.servers import ThreadedApp, free_port
from tests.strategies._util import QUESTION, task

TAG = QWEN_MATH_PRM.step_tag
TAG_ID = QWEN_MATH_PRM.step_tag_id
RIGHT, WRONG = "3 + 4 = 7.", "3 + 4 = 8."


def p_right(step: str, j: int) -> float:
    """The scripted PRM's verdict on step ``j``: low for a wrong sum, else falling a
    little with depth (so a score read from the wrong tag or column shows)."""
    return 0.125 if "= 8" in step else 0.875 - 0.0625 * j


def assistant_steps(text: str) -> list[str]:
    return text.split("<|im_start|>assistant\n")[1].split(TAG)[:-1]


class FakePRM(ThreadedApp):
    """vLLM's /pooling and /tokenize as a Qwen PRM answers them: a ``[P(wrong),
    P(right)]`` row at each ``<extra_0>`` (STEP pooling), or at every token with
    ``every_token`` (ALL pooling; a token is a character, the tag one token).
    ``status``/``body`` replace the pooling reply; every request body is kept."""

    def __init__(self, *, every_token: bool = False, status: int = 200, body=None):
        self.requests: list[tuple[str, dict, dict]] = []
        self.every_token, self.status, self.body = every_token, status, body
        app = FastAPI()

        @app.post("/pooling")
        async def pooling(request: Request):
            self.requests.append(("/pooling", await request.json(), dict(request.headers)))
            if self.body is not None:
                return PlainTextResponse(self.body, status_code=self.status)
            if self.status != 200:
                return JSONResponse({"error": {"message": "engine died"}}, self.status)
            texts = self.requests[-1][1]["input"]
            return {"object": "list", "model": "prm", "usage": {"prompt_tokens": 1},
                    "data": [{"index": i, "object": "pooling", "data": self.rows(t)}
                             for i, t in reversed(list(enumerate(texts)))]}

        @app.post("/tokenize")
        async def tokenize(request: Request):
            body = await request.json()
            self.requests.append(("/tokenize", body, dict(request.headers)))
            ids = [TAG_ID if piece == TAG else 100 for piece in tokens(body["prompt"])]
            return {"count": len(ids), "max_model_len": 4096, "tokens": ids}

        super().__init__(app)

    def rows(self, text: str) -> list[list[float]]:
        scores = iter([p_right(s, j) for j, s in enumerate(assistant_steps(text))])
        if not self.every_token:
            return [[1 - p, p] for p in scores]
        return [[1 - (p := next(scores)), p] if piece == TAG else [0.5, 0.5]
                for piece in tokens(text)]

    @property
    def posted(self) -> list[dict]:
        return [body for route, body, _ in self.requests if route == "/pooling"]


def tokens(text: str) -> list[str]:
    return re.findall(re.escape(TAG) + "|.", text, re.DOTALL)


def test_the_input_is_the_chat_with_the_tag_after_each_step():
    text = QWEN_MATH_PRM.render("What is 3 + 4?", ["3 + 4 = 7.", "The answer is 7."])
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
        "<|im_start|>assistant\n3 + 4 = 7.<extra_0>The answer is 7.<extra_0><|im_end|>\n")
    # a tag a step writes itself is no step end
    assert QWEN_MATH_PRM.render("q", ["a<extra_0>b"]).count(TAG) == 1
    assert QWEN_MATH_PRM.render("{x}", []).endswith("user\n{x}<|im_end|>\n"
                                                   "<|im_start|>assistant\n<|im_end|>\n")


async def test_all_paths_go_in_one_request_and_each_step_reads_p_right_at_its_tag():
    server = FakePRM()
    with server as url:  # its /v1 URL, as an OpenAI-style setting would give it
        scorer = PRMStepScorer(url, "Qwen/Qwen2.5-Math-PRM-7B", api_key="k3y", timeout=10)
        assert isinstance(scorer, StepScorer) and scorer.base_url == url.removesuffix("/v1")
        paths = [[RIGHT, "7 * 2 = 14.", "The answer is 14."], [WRONG], []]
        scores = await scorer.score(task(), paths, None)
    assert scores == [[0.875, 0.8125, 0.75], [0.125], []]
    [(route, body, headers)] = server.requests
    assert route == "/pooling"
    assert body["input"] == [QWEN_MATH_PRM.render(QUESTION, p) for p in paths]
    assert (body["model"], body["task"], body["use_activation"]) == (
        "Qwen/Qwen2.5-Math-PRM-7B", "token_classify", True)
    assert headers["authorization"] == "Bearer k3y"


async def test_the_right_column_is_the_formats():
    wrong_first = replace(QWEN_MATH_PRM, right=0)
    server = FakePRM()
    with server as url:
        scores = await PRMStepScorer(url, fmt=wrong_first).score(task(), [[RIGHT, WRONG]], None)
    assert scores == [[0.125, 0.875]]
    assert "model" not in server.posted[0]  # the server's one model


async def test_a_server_that_returns_every_token_is_read_at_the_tag_tokens():
    every = replace(QWEN_MATH_PRM, server_pools_steps=False)
    paths = [[RIGHT, "7 * 2 = 14."], [WRONG]]
    server = FakePRM(every_token=True)
    with server as url:
        scores = await PRMStepScorer(url, fmt=every).score(task(), paths, None)
    routes = [route for route, _, _ in server.requests]
    assert scores == [[0.875, 0.8125], [0.125]]
    assert sorted(routes) == ["/pooling", "/tokenize", "/tokenize"]
    with pytest.raises(ValueError, match="step_tag_id"):
        PRMFormat(template=CHATML, system="", step_tag="\n", server_pools_steps=False)


async def test_no_paths_no_request():
    server = FakePRM()
    with server as url:
        assert await PRMStepScorer(url).score(task(), [], None) == []
    assert server.requests == []


@pytest.mark.parametrize(("status", "body", "error", "said"), [
    (500, None, BackendUnavailableError, "answered 500 on /pooling: .*engine died"),
    (503, None, BackendUnavailableError, "answered 503"),
    (400, None, BackendError, "answered 400"),
    (200, "not json", BackendError, "malformed"),
    # a sequence task's reply: one list per input, not rows
    (200, '{"data": [{"index": 0, "data": [0.2, 0.8]}]}', BackendError, "token_classify"),
    (200, '{"data": [{"index": 3, "data": [[0.2, 0.8]]}]}', BackendError, "indices"),
    (200, '{"data": [{"index": 0, "data": [[0.2, 0.8], [0.3, 0.7]]}]}', BackendError,
     "2 step rows for path 0's 1 steps"),
    (200, '{"data": [{"index": 0, "data": [[-3.1, 4.2]]}]}', BackendError, "no probability"),
    (200, '{"data": [{"index": 0, "data": [[1.0]]}]}', BackendError, "column 1"),
])
async def test_a_failed_or_malformed_reply_raises_the_hierarchys_error(status, body, error,
                                                                       said):
    with FakePRM(status=status, body=body) as url:
        with pytest.raises(error, match=said) as caught:
            await PRMStepScorer(url).score(task(), [[RIGHT]], None)
    if error is BackendError:  # not a retryable outage
        assert not isinstance(caught.value, BackendUnavailableError)
    assert url.removesuffix("/v1") in caught.value.message


async def test_an_unreachable_server_is_unavailable():
    with pytest.raises(BackendUnavailableError, match="/pooling"):
        await PRMStepScorer(f"http://127.0.0.1:{free_port()}", timeout=5).score(
            task(), [[RIGHT]], None)


def test_the_environment_configures_prm(monkeypatch):
    for var in ("REFINERY_PRM_MODEL", "REFINERY_PRM_API_KEY", "REFINERY_PRM_FORMAT",
                "REFINERY_PRM_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("REFINERY_PRM_URL", "http://prm.example:8000/v1/")
    scorer = build_scorer("prm")
    assert isinstance(scorer, PRMStepScorer) and "prm" in SCORERS
    assert (scorer.base_url, scorer.model, scorer.fmt, scorer.timeout) == (
        "http://prm.example:8000", None, QWEN_MATH_PRM, 60.0)
    monkeypatch.setenv("REFINERY_PRM_MODEL", "Qwen/Qwen2.5-Math-PRM-7B")
    monkeypatch.setenv("REFINERY_PRM_TIMEOUT", "7.5")
    monkeypatch.setenv("REFINERY_PRM_FORMAT", "qwen-math")
    scorer = build_scorer("prm")
    assert (scorer.model, scorer.timeout) == ("Qwen/Qwen2.5-Math-PRM-7B", 7.5)


@pytest.mark.parametrize(("var", "value", "said"), [
    ("REFINERY_PRM_URL", "", "set REFINERY_PRM_URL"),
    ("REFINERY_PRM_FORMAT", "shepherd", "no PRM format; known: qwen-math"),
    ("REFINERY_PRM_TIMEOUT", "soon", "no positive number"),
    ("REFINERY_PRM_TIMEOUT", "0", "no positive number"),
])
def test_a_missing_or_bad_setting_is_a_spec_error(monkeypatch, var, value, said):
    monkeypatch.setenv("REFINERY_PRM_URL", "http://127.0.0.1:1")
    monkeypatch.setenv(var, value)
    with pytest.raises(SpecError, match=said) as caught:
        build_scorer("prm")
    assert caught.value.param == "scorer"


@pytest.mark.e2e
async def test_a_real_vllm_pooling_server_scores_every_step(prm_server):
    fmt = PRMFormat(template=CHATML, system=QWEN_MATH_PRM.system,
                    step_tag=prm_server.step_tag)
    scorer = PRMStepScorer(prm_server.url, prm_server.model, fmt=fmt, timeout=120)
    steps = ["Tom has 3 apples and buys 4 more: 3 + 4 = 7.", "The pile doubles: 7 * 2 = 14.",
             "The answer is 14."]
    paths = [steps, steps[:1], [WRONG, "So 8 * 2 = 16."]]
    first = await scorer.score(task(), paths, None)
    again = await scorer.score(task(), paths, None)
    assert [len(s) for s in first] == [3, 1, 2]
    assert all(0.0 <= p <= 1.0 for s in first for p in s)
    assert again == first  # the same text, the same scores
    # causal: a step's score sees only the text up to its tag
    assert first[1][0] == pytest.approx(first[0][0], abs=1e-5)
    assert len({round(p, 4) for s in first for p in s}) > 1  # not one constant
