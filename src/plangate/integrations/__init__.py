"""Glue for agent frameworks, each behind its own extra; the core package never imports them.

``plangate.integrations.pydantic_ai``: :class:`~plangate.integrations.pydantic_ai.PlanGateToolset`
(the ``pydantic-ai`` extra). The recipes for LangGraph, the OpenAI Agents SDK and FastAPI need
no glue beyond the async API: see docs/integrations.md.
"""
