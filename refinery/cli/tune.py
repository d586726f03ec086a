"""``refinery tune``: measure candidate strategies on dev data, write a profile.

Its flags are :class:`~refinery.eval.tune.TuneConfig`'s fields. Each candidate is an
eval run in ``OUT/runs/<candidate>/`` (rerun to resume; a finished one costs
nothing; ``--adopt DIR`` copies in a run of the same configuration found in DIR);
then ``OUT/profile.json`` holds the frontier, the effort levels and the router
that ``auto(profile="OUT")`` dispatches by.

Example:
    $ refinery tune --dataset arith --limit 200 --out profiles/arith --adopt runs/m60
    $ refinery eval run --dataset arith --strategy 'auto(profile="profiles/arith")' ...
"""

from __future__ import annotations

import asyncio
import os

import click

from refinery.cli.console import INTERRUPTED, fail, missing_extra
from refinery.cli.eval import HELP as EVAL_HELP
from refinery.cli.flags import config_flags
from refinery.engine.errors import RefineryError
from refinery.eval.tune import TuneConfig

__all__ = ["tune_cmd"]

HELP = {k: v for k, v in EVAL_HELP.items() if k in TuneConfig.model_fields and k != "out"} | {
    "split": "dev split measured (test is refused)",
    "limit": "first N dev problems",
    "max_tokens": "tokens per model call",
}


@click.command("tune")
@config_flags(TuneConfig, help=HELP)
@click.option("--progress/--no-progress", default=False, show_default=True,
              help="show each run's progress bar")
def tune_cmd(config: TuneConfig, progress: bool) -> None:
    """Run each candidate on the dev split; write OUT/profile.json (frontier, levels, router)."""
    from refinery.eval.tune import tune

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        profile = asyncio.run(tune(config, progress=progress))
    except RefineryError as exc:
        fail(exc)
    except ModuleNotFoundError as exc:
        missing_extra(exc)
    except (KeyboardInterrupt, asyncio.CancelledError):
        fail(f"interrupted; finished problems are in {config.out}/runs; rerun to resume",
             INTERRUPTED)
    levels = {i: name for name, i in profile.levels.items()}
    for i, s in enumerate(profile.candidates):
        mark = ("  <- " + "/".join(n for n, j in profile.levels.items() if j == i)
                if i in levels else "")
        front = "*" if i in profile.frontier else " "
        click.echo(f"{front} {s.candidate.spec} @T={s.candidate.temperature:g}: "
                   f"{100 * s.accuracy:.1f}% ({100 * s.low:.1f}-{100 * s.high:.1f}) "
                   f"{s.tokens:.0f} tokens {s.calls:.2f} calls {s.seconds:.2f}s{mark}")
    click.echo(f"wrote {config.out}/profile.json (* on the frontier; router "
               f"{'fitted' if profile.router else 'not fitted: too few problems'})")
