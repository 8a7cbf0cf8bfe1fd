"""Recipes: plangate's approval of a whole plan inside LangGraph, the OpenAI Agents SDK, Pydantic AI and FastAPI.

Each ``*_recipe`` module is what a user writes, between ``# recipe:begin`` and ``# recipe:end``,
then a ``main()`` that runs it offline end to end with the framework's own test model. Each
``*_percall`` module does the same task with that framework's own per-call approval, so the
two can be compared line for line (docs/integrations.md).
"""
