"""The web page in a real browser: Debian's headless Chromium driven by Playwright,
against ``refinery serve``'s app (uvicorn on loopback) over the session's real vLLM
engine, with a real eval run and a recorded one (hostile output, a loop stop).

``REFINERY_UI_SCREENSHOTS=docs/img`` makes the tests save the README's screenshots
(ui-playground.png, ui-runs.png, ui-trace.png) there.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from refinery.eval.runner import EvalConfig, run_eval
from refinery.serving import ServerConfig, create_app
from refinery.ui import mount_ui
from tests.servers import LoopServers
from tests.ui.conftest import HOSTILE, RUN, record_run, scripted_backend

pytestmark = pytest.mark.e2e
KEY = "sk-browser-test"
REAL_RUN = "arith-cot"
SHOTS = os.environ.get("REFINERY_UI_SCREENSHOTS")
SLOW = 120_000  # ms: a strategy run on the CPU engine, on a machine shared with others


def chromium() -> str:
    path = os.environ.get("REFINERY_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("no chromium on PATH: `make setup` installs Debian's (system-packages)")
    return path


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium(), headless=True)
        yield b
        await b.close()


@pytest.fixture(scope="session")
async def runs(tmp_path_factory, vllm_backend) -> Path:
    """A real 4-problem arith run with cot on the real engine, beside the recorded one."""
    root = tmp_path_factory.mktemp("ui-runs")
    await record_run(root / RUN)
    await run_eval(EvalConfig(dataset="arith", strategy="cot", limit=4, max_tokens=128,
                              out=str(root / REAL_RUN)), backend=vllm_backend, progress=False)
    return root


@pytest.fixture(scope="session")
async def servers(vllm_backend, runs) -> AsyncIterator[dict[str, str]]:
    """``open``: no keys; ``locked``: one API key; ``scripted``: a backend that answers
    hostile markup. Each is ``refinery serve``'s app with the page mounted."""
    apps = {"open": (ServerConfig(), vllm_backend),
            "locked": (ServerConfig(api_keys=frozenset({KEY})), vllm_backend),
            "scripted": (ServerConfig(), scripted_backend())}
    running = LoopServers()
    yield {name: await running.start(mount_ui(create_app(config, backend=backend), runs=runs))
           for name, (config, backend) in apps.items()}
    await running.stop()


@dataclass
class Watched:
    """A page, and what it did that a safe page must not: dialogs, script errors, CSP
    refusals (the browser's log of a refused request, a 400 or 401 the test asked
    for, is not one)."""

    page: Page
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_quiet(self) -> None:
        assert self.dialogs == [], self.dialogs
        assert self.errors == [], self.errors


@pytest.fixture
async def tab(browser: Browser) -> AsyncIterator[Watched]:
    """A fresh context (no cookies) and page, watched for dialogs and script errors."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    watched = Watched(await context.new_page())
    watch(watched, watched.page)
    yield watched
    await context.close()


def watch(watched: Watched, page: Page) -> None:
    async def dismiss(dialog) -> None:
        watched.dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    page.on("pageerror", lambda exc: watched.errors.append(str(exc)))
    page.on("console", lambda m: m.type == "error" and not m.text.startswith(
        "Failed to load resource") and watched.errors.append(m.text))  # CSP refusals...


async def shot(page: Page, name: str) -> None:
    if SHOTS:  # Playwright makes the directory
        await page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


async def test_playground_streams_sc_and_opens_its_trace(tab: Watched, servers) -> None:
    page = tab.page
    await page.goto(servers["open"] + "/ui")
    await page.fill("#spec", "sc(cot, n=2)")
    await expect(page.locator("#spec-check")).to_contain_text("worst case 1 call per question")
    await expect(page.locator("#spec-check .spec-tree")).to_contain_text("cot")
    await page.fill("#question", "Tom has 3 apples and buys 4 more. How many apples now?")
    await page.fill("#max-tokens", "96")
    await page.click("#run")
    await expect(page.locator("#open-trace")).to_be_enabled(timeout=SLOW)
    await expect(page.locator("#answer")).to_have_text(re.compile(r"\S"))
    await expect(page.locator("#steps .step").first).to_contain_text("[cot · draft]")
    await expect(page.locator("#steps")).to_contain_text("[sc · vote]")
    await expect(page.locator("#usage")).to_contain_text("sc(cot, n=2)")
    await expect(page.locator("#error")).to_have_text("")
    await shot(page, "ui-playground.png")
    async with page.context.expect_page() as opened:
        await page.click("#open-trace")
    trace = await opened.value
    watch(tab, trace)
    await expect(trace.locator(".call .role-vote")).to_be_visible()
    await expect(trace.locator(".call.is-answer .role-select")).to_be_visible()
    await expect(trace.locator("#budget")).to_contain_text("spec's worst case 1")
    output = trace.locator(".call.generation details.output").first
    await expect(output.locator("pre")).to_be_hidden()  # collapsed by default
    await output.locator("summary").click()
    await expect(output.locator("pre")).to_be_visible()
    await shot(trace, "ui-trace.png")
    tab.assert_quiet()


async def test_an_invalid_spec_shows_the_error_and_the_suggestion(tab: Watched,
                                                                  servers) -> None:
    page = tab.page
    await page.goto(servers["open"] + "/ui")
    await page.fill("#spec", "sc(cott, n=2)")
    await expect(page.locator("#spec-check")).to_contain_text("unknown strategy 'cott'")
    await expect(page.locator("#suggestion")).to_have_text("did you mean cot?")
    await page.click("#run")  # the server refuses it too, before any model call
    await expect(page.locator("#error")).to_contain_text("unknown strategy 'cott'")
    await page.click("#suggestion")
    await expect(page.locator("#spec")).to_have_value("sc(cot, n=2)")
    await expect(page.locator("#spec-check")).to_contain_text("✓ sc(cot, n=2)")
    tab.assert_quiet()


async def test_runs_page_lists_a_real_run_and_opens_a_problems_trace(tab: Watched,
                                                                     servers) -> None:
    page = tab.page
    await page.goto(servers["open"] + "/ui/runs")
    row = page.locator("#runs tr", has=page.get_by_role("link", name=REAL_RUN, exact=True))
    await expect(row).to_contain_text("arith")
    await expect(row).to_contain_text("cot")
    await expect(row).to_contain_text("%")
    await expect(page.locator("figure.plot svg circle")).to_have_count(2)  # two datasets
    await shot(page, "ui-runs.png")
    await page.get_by_role("link", name=REAL_RUN, exact=True).click()
    await expect(page.locator("#problems tbody tr")).to_have_count(4)
    await expect(page.locator("#problems")).to_contain_text(re.compile("right|wrong"))
    await page.locator("#problems tbody tr a").first.click()
    await expect(page.locator("h1")).to_contain_text("arith-test-")
    call = page.locator("#tree .call.generation").first
    await call.locator("details.prompt summary").click()
    await expect(call.locator("details.prompt .msg pre")).to_be_visible()
    tab.assert_quiet()


async def test_trace_explorer_marks_a_loop_stop(tab: Watched, servers) -> None:
    page = tab.page
    await page.goto(f"{servers['open']}/ui/trace?run={RUN}&task=p-loop")
    looped = page.locator(".call.is-loop")
    await expect(looped).to_have_count(1)
    await expect(looped.locator(".head .loop")).to_have_text("loop")
    output = looped.locator("details.output").first
    await expect(output.locator("summary")).to_contain_text("loop stop")
    await output.locator("summary").click()
    await expect(output.locator("pre")).to_have_text("LOOP LOOP LOOP 4")
    await expect(page.locator(".role-loop_retry")).to_be_visible()
    await page.click("#expand-all")
    await expect(page.locator("#tree details:not([open])")).to_have_count(0)
    tab.assert_quiet()


async def test_hostile_model_output_is_shown_as_text_and_runs_nothing(tab: Watched,
                                                                      servers) -> None:
    page = tab.page
    # A recorded run's trace...
    await page.goto(f"{servers['open']}/ui/trace?run={RUN}&task=p-hostile")
    await page.click("#expand-all")
    await expect(page.locator("#tree").get_by_text(HOSTILE, exact=True).first).to_be_visible()
    await expect(page.locator("main img")).to_have_count(0)
    await expect(page.locator("script:not([src])")).to_have_count(0)
    # ...and the playground, streaming it live from a (scripted) model.
    await page.goto(servers["scripted"] + "/ui")
    await page.fill("#question", "hostile: what is 2+2?")
    await page.click("#run")
    await expect(page.locator("#answer")).to_have_text(HOSTILE, timeout=SLOW)
    await expect(page.locator("#answer img")).to_have_count(0)
    await expect(page.locator("#answer script")).to_have_count(0)
    tab.assert_quiet()


async def test_with_an_api_key_the_page_asks_for_it_and_refuses_without(tab: Watched,
                                                                        servers) -> None:
    page = tab.page
    response = await page.goto(servers["locked"] + "/ui/runs")
    assert response is not None and response.status == 401
    await expect(page.locator("#runs")).to_have_count(0)
    await page.fill("#key", "wrong")
    await page.click("#login")
    await expect(page.locator("#login-error")).to_have_text("wrong API key")
    await page.fill("#key", KEY)
    await page.click("#login")
    await expect(page).to_have_url(servers["locked"] + "/ui/runs")
    await expect(page.get_by_role("link", name=REAL_RUN, exact=True)).to_be_visible()
    await page.goto(servers["locked"] + "/ui")
    await page.fill("#question", "Say hi.")
    await page.fill("#max-tokens", "8")
    await page.click("#run")  # the page's fetch carries the cookie to the API
    await expect(page.locator("#open-trace")).to_be_enabled(timeout=SLOW)
    await expect(page.locator("#error")).to_have_text("")
    await page.click("text=Log out")
    response = await page.goto(servers["locked"] + "/ui")
    assert response is not None and response.status == 401
    tab.assert_quiet()
