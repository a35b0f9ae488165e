"""Accuracy gates: the project's offline lm-eval tasks, and the gate that runs them with stock and our kernels."""
