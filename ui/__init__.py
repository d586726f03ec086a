"""The web page: playground, eval runs and trace explorer, under ``/ui``.

Above ``serving`` and ``eval`` (it reads both); the CLI mounts it on ``refinery
serve`` and serves it alone as ``refinery ui``. Server-rendered Jinja2 templates,
a little vanilla JavaScript and CSS, all shipped as package data.
"""

from refinery.ui.app import create_ui_app, mount_ui
from refinery.ui.settings import UISettings

__all__ = ["UISettings", "create_ui_app", "mount_ui"]
