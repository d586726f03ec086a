"""Step searches served: ``beam@MODEL`` and ``particle@MODEL`` stream every step they
grew and every level's search (what was kept, pruned, resampled) as
``reasoning_content``; the best finished path is the content."""

from __future__ import annotations

import pytest

from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import MODEL
from tests.serving.test_execution import streamed
from tests.strategies.test_step_search import ANSWER, by_level

pytestmark = pytest.mark.timeout(60)

STEPS = by_level(["3 + 4 = 7.", "3 + 4 = 8."], [ANSWER])


@pytest.mark.parametrize("preset", ["beam", "dvts", "particle"])
async def test_a_search_streams_its_steps_and_levels_as_reasoning(scripted_serve, client,
                                                                  preset):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", STEPS)]))
    reasoning, content = await streamed(client, url, f"{preset}@{MODEL}")
    assert f"[{preset} · draft]" in reasoning and "3 + 4 = 7." in reasoning
    assert f"[{preset} · search] level 0: kept" in reasoning
    assert f"[{preset} · continue]" in reasoning  # the kept paths, continued
    assert content.startswith("3 + 4 = 7.") and "\\boxed{14}" in content
