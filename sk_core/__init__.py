"""Standard Kernels: fused Triton kernels for LLM layers, with honest fallback to PyTorch.

    import sk                      # or: import standardkernels
    y = sk.ops.rms_norm(x, w, 1e-6)
    with sk.coverage.strict():     # a fallback to PyTorch becomes an error
        ...
    sk.coverage.write_report("standardkernels-coverage.json")
"""
__version__ = "0.1.0"

from sk import coverage, cuda_graphs, nn, ops, reports, settings  # noqa: E402
from sk.coverage import CoverageError  # noqa: E402
from sk.warmup import warmup  # noqa: E402

__all__ = ["ops", "nn", "cuda_graphs", "coverage", "settings", "reports", "CoverageError", "warmup", "__version__"]
