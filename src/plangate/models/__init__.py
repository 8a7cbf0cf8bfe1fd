"""Models: one interface, adapters behind extras, and test doubles that need no network.

``from_spec("anthropic:claude-sonnet-4-5")`` builds an adapter from a ``provider:name``
string; the provider's SDK is imported only then, so the core never needs it.

| spec | adapter | extra |
| --- | --- | --- |
| ``anthropic:MODEL`` | Claude, extended thinking | ``anthropic`` |
| ``openai:MODEL`` | OpenAI, reasoning effort, structured output | ``openai`` |
| ``openai-compatible:MODEL`` (with a base URL) | vLLM, Ollama, the llama.cpp server | ``openai`` |
| ``llamacpp:PATH.gguf`` | a local GGUF model in process, schema-constrained | ``llamacpp`` |

Any other provider is refused with a UsageError naming these four. The test doubles,
``ScriptedModel`` and ``FunctionModel`` in :mod:`plangate.models.test`, have no spec:
build them directly and pass them where a model goes.
"""

from __future__ import annotations

from plangate._extras import need
from plangate.errors import UsageError
from plangate.models._base import (
    Effort,
    Message,
    Model,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)

__all__ = [
    "Effort",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "from_spec",
]

PROVIDERS = ("anthropic", "openai", "openai-compatible", "llamacpp")
_EXTRA = {"anthropic": "anthropic", "openai": "openai", "openai-compatible": "openai", "llamacpp": "llamacpp"}


def from_spec(spec: str, *, base_url: str | None = None) -> Model:
    """A model from ``provider:name`` (see the table above)."""
    provider, _, name = spec.partition(":")
    if not name:
        raise UsageError(f"model {spec!r}: write PROVIDER:NAME, with PROVIDER one of {', '.join(PROVIDERS)}")
    if provider in _EXTRA:
        need(_EXTRA[provider], f"the {provider} model provider")
    if provider == "anthropic":
        from plangate.models.anthropic import AnthropicModel

        return AnthropicModel(name, base_url=base_url) if base_url else AnthropicModel(name)
    if provider == "openai":
        from plangate.models.openai import OpenAIModel

        return OpenAIModel(name, base_url=base_url)
    if provider == "openai-compatible":
        if not base_url:
            raise UsageError("openai-compatible models need --base-url (e.g. http://127.0.0.1:8080/v1)")
        from plangate.models.openai import OpenAIModel

        return OpenAIModel(
            name,
            base_url=base_url,
            provider="openai-compatible",
            structured="json_object",
            reasoning=False,
            api_key="not-needed",
        )
    if provider == "llamacpp":
        from plangate.models.llamacpp import LlamaCppModel

        return LlamaCppModel(name)
    raise UsageError(f"unknown model provider {provider!r}: use one of {', '.join(PROVIDERS)}")
