"""Performance model: pure cost functions (no I/O, no torch, no ray)."""
