"""Model backends: a small async protocol and its adapters."""

from refinery.engine.backends.base import Backend

__all__ = ["Backend", "OpenAIBackend", "OpenAIConfig", "VLLMBackend", "VLLMConfig"]


def __getattr__(name: str):
    # Adapters import heavy deps (vllm, openai); load them only when asked for.
    if name in ("VLLMBackend", "VLLMConfig"):
        from refinery.engine.backends import vllm
        return getattr(vllm, name)
    if name in ("OpenAIBackend", "OpenAIConfig"):
        from refinery.engine.backends import openai
        return getattr(openai, name)
    raise AttributeError(name)
