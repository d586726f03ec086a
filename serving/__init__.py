"""OpenAI-compatible HTTP server for refined answers."""

from refinery.serving.app import create_app
from refinery.serving.config import DEFAULT_PRESETS, ServerConfig, load_api_keys
from refinery.serving.service import Service

__all__ = ["DEFAULT_PRESETS", "ServerConfig", "Service", "create_app", "load_api_keys"]
