"""Intervention kinds: what a condition changes in the prompt forward, one module per kind.

`base` holds what every kind shares (`Intervention`, `apply_rows`); every other module here is
one built-in kind, declared with `workbench.extend.register_intervention` the way a plugin's kind
is (`workbench.extend.intervention_kinds()` imports them all).
"""

from .base import Intervention, apply_rows, needs_source

__all__ = ["Intervention", "apply_rows", "needs_source"]
