"""``refinery ui``: the web page over eval runs and their traces, without a model.

Example:
    $ refinery ui --runs runs --port 8001
"""

from __future__ import annotations

from pathlib import Path

import click

from refinery.cli.console import USAGE, fail
from refinery.cli.options import (
    allowed_hosts,
    api_key_file_option,
    host_option,
    hosts_option,
    warn_if_open,
)

__all__ = ["ui"]


@click.command()
@click.option("--runs", default="runs", show_default=True,
              help="directory of eval runs (refinery eval run --out)")
@host_option
@click.option("--port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@api_key_file_option
@hosts_option
@click.option("--forwarded-allow-ips", "forwarded", multiple=True, metavar="IPS",
              help="addresses whose X-Forwarded-For is believed (a reverse proxy's); "
              "comma-separated or repeated; none by default")
def ui(runs: str, host: str, port: int, api_key_file: str | None,
       hosts: tuple[str, ...], forwarded: tuple[str, ...]) -> None:
    """Serve the web page over eval runs and their traces, without a model (no engine)."""
    import uvicorn

    from refinery.serving import load_api_keys
    from refinery.serving.clients import uvicorn_proxy_options
    from refinery.ui import UISettings, create_ui_app

    if not Path(runs).is_dir():
        fail(f"no directory {runs!r} (make one with refinery eval run --out {runs}/NAME)",
             USAGE)
    keys = load_api_keys(api_key_file)
    warn_if_open(host, keys)
    click.secho(f"refinery ui: http://{host}:{port}/ui/runs", fg="cyan", err=True)
    proxies = frozenset(ip for value in forwarded for ip in value.split(",") if ip)
    settings = UISettings(api_keys=keys, runs=Path(runs), allowed_hosts=allowed_hosts(hosts),
                          forwarded_allow_ips=proxies)
    uvicorn.run(create_ui_app(settings), host=host, port=port, log_level="warning",
                **uvicorn_proxy_options(proxies))
