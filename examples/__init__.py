"""Runnable examples of token-service (not part of the installed package)."""
