"""OpenAI-compatible HTTP server for refined answers."""

from serving.app import create_app
from serving.config import DEFAULT_PRESETS, ServerConfig, load_api_keys
from serving.service import Service

__all__ = ["DEFAULT_PRESETS", "ServerConfig", "Service", "create_app", "load_api_keys"]
