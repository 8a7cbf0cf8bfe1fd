"""Tools: typed functions with governance metadata, and the catalogue that holds them."""

from plangate.tools._catalogue import Catalogue
from plangate.tools._context import RunContext, idempotency_key
from plangate.tools._render import render_tool
from plangate.tools._tool import EFFECTS, Effect, Tool, tool

__all__ = ["EFFECTS", "Catalogue", "Effect", "RunContext", "Tool", "idempotency_key", "render_tool", "tool"]
