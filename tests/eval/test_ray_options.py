"""Ray options without a cluster: CPU shares, the CLI's checks, no Ray import, and the
driver's drain."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import deque

from click.testing import CliRunner

from refinery.cli import app
from refinery.engine.trace import Trace
from refinery.engine.types import Task
from refinery.eval.ray_pool import Placement, _Board, _next_result, _Replica, split_cpus


def test_engines_on_one_node_split_its_cpus_and_nodes_do_not_share():
    a, b, c = (Placement("n1", (0, 1, 2, 3), 1), Placement("n1", (0, 1, 2, 3), 2),
               Placement("n2", (0, 1), 3))
    assert split_cpus([a, b, c], on_gpu=False) == ["0,1", "2,3", "0,1"]
    three = [Placement("n", (4, 5), i) for i in range(3)]  # more engines than cores
    assert split_cpus(three, on_gpu=False) == ["4", "4", "5"]
    assert split_cpus([a, b], on_gpu=True) == [None, None]


def test_replicas_without_ray_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(app, ["eval", "run", "--dataset", "arith", "--strategy", "cot",
                                   "--out", str(tmp_path / "r"), "--ray-replicas", "2"])
    assert res.exit_code == 2 and "--ray-replicas needs --ray" in res.output
    assert not (tmp_path / "r").exists()


def test_importing_refinery_and_its_commands_does_not_import_ray():
    code = ("import sys, refinery, refinery.cli, refinery.eval.runner, refinery.distill.loop; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_run_records_the_names_of_the_actors_env_never_the_values():
    from refinery.eval.ray_pool import RayOptions

    opts = RayOptions(replicas=3, env={"HF_TOKEN": "hf_secret", "VLLM_CPU_KVCACHE_SPACE": "1"})
    rec = opts.recorded()
    assert rec["env"] == ["HF_TOKEN", "VLLM_CPU_KVCACHE_SPACE"] and rec["replicas"] == 3
    assert "hf_secret" not in str(rec)


async def test_a_drain_forgets_the_waiting_tasks_and_ends_once_the_flight_is_in():
    waiting = deque(Task.from_prompt(f"q{i}", id=f"t{i}") for i in range(3))
    stop = asyncio.Event()
    board = _Board(waiting, asyncio.Queue(), {}, 5, stop)  # 2 in flight, 3 waiting
    alive = [_Replica(handle=None, pid=1)]
    board.drop_waiting()
    assert len(board.queue) == 3 and board.undelivered == 5  # no drain asked yet
    stop.set()
    board.drop_waiting()
    assert not board.queue and board.undelivered == 2
    for tid in ("a", "b"):  # the two in flight still arrive, in order
        board.results.put_nowait(Trace(task_id=tid))
        assert (await _next_result(board, alive)).task_id == tid
        board.undelivered -= 1
    assert await asyncio.wait_for(_next_result(board, alive), 10) is None  # nothing left
