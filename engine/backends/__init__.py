"""Model backends: a small async protocol and its adapters."""

from refinery.engine.backends.base import Backend

__all__ = ["Backend", "VLLMBackend", "OpenAIBackend"]


def __getattr__(name: str):
    # Adapters import heavy deps (vllm, openai); load them only when asked for.
    if name == "VLLMBackend":
        from refinery.engine.backends.vllm import VLLMBackend
        return VLLMBackend
    if name == "OpenAIBackend":
        from refinery.engine.backends.openai import OpenAIBackend
        return OpenAIBackend
    raise AttributeError(name)
