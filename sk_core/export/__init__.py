"""Upstream patch export: our kernels as `git format-patch` series against vLLM and SGLang source trees."""
from sk.export.command import main

__all__ = ["main"]
