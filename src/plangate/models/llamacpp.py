"""A local GGUF model in this process, through llama-cpp-python.

When the request carries a JSON schema (the planner sends the Plan schema) the output is
constrained by a grammar generated from it: the model can only write tokens that keep
the JSON valid against the schema. Install with ``pip install 'plangate[llamacpp]'``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from plangate.models._base import ModelError, ModelRequest, ModelResponse, Usage, token_count

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the llama.cpp adapter needs llama-cpp-python: pip install 'plangate[llamacpp]'") from exc


class LlamaCppModel:
    """``llamacpp:PATH.gguf``: deterministic by default (temperature 0, fixed seed)."""

    def __init__(self, path: str | Path, *, context: int = 8192, threads: int | None = None, seed: int = 0) -> None:
        self.path = Path(path)
        self.name = f"llamacpp:{self.path.name}"
        if not self.path.is_file():
            raise ModelError(f"no GGUF model at {str(self.path)!r}")
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
            self.llm = llama_cpp.Llama(
                model_path=str(self.path), n_ctx=context, n_threads=threads, seed=seed, verbose=False
            )

    def complete(self, request: ModelRequest) -> ModelResponse:
        messages = [{"role": "system", "content": request.system}]
        messages += [{"role": m.role if m.role != "tool" else "user", "content": m.content} for m in request.messages]
        params: dict[str, Any] = {
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature or 0.0,
        }
        if request.stop:
            params["stop"] = list(request.stop)
        if request.json_schema is not None:
            params["response_format"] = {"type": "json_object", "schema": request.json_schema}
        start = time.perf_counter()
        try:
            result: Any = self.llm.create_chat_completion(**params)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"{self.name}: {exc}") from None
        choices = result.get("choices") if isinstance(result, dict) else None
        message = choices[0].get("message") if isinstance(choices, list) and choices else None
        if not isinstance(message, dict) or not isinstance(message.get("content") or "", str):
            raise ModelError(f"{self.name}: malformed response: no message with text content")
        choice = choices[0]  # type: ignore[index]
        usage = result.get("usage") or {}
        return ModelResponse(
            text=message.get("content") or "",
            usage=Usage(
                input=token_count(self.name, "prompt_tokens", usage.get("prompt_tokens"), absent=0),
                output=token_count(self.name, "completion_tokens", usage.get("completion_tokens"), absent=0),
            ),
            model=self.name,
            stop_reason=choice.get("finish_reason"),
            seconds=time.perf_counter() - start,
        )
