"""Backends execute a compiled plan's forward passes: `local` (this machine, nnsight traces)."""
