"""Where kernels run in this test session, the tolerances the tests use, and how errors are measured."""
import math
import zlib

import torch

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Relative norm error of an output against the fp64 reference. Each output is rounded once from fp32, so the
# error is about the unit roundoff u of the output dtype (relative norm of uniform rounding errors ≈ u/√3):
#   fp32  u = 6e-8; 1e-5 leaves room for fp32 summation order over rows of up to 64k elements;
#   fp16  u = 4.9e-4; 2e-3 is 4u;
#   bf16  u = 3.9e-3; 1e-2 also covers Triton's interpreter, which rounds fp32 -> bf16 by truncation (2u).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = list(TOLERANCE)
# Odd widths beside real ones; the interpreter is slow, so the largest real widths are GPU-only.
ODD_WIDTHS = [1, 3, 1023, 4097]
REAL_WIDTHS = [4096, 8192] if KERNEL_DEVICE == "cuda" else []


def seed_of(*case) -> int:
    """A seed per test case, the same in every run (Python's hash() of a str changes from process to process),
    so that a failing draw can be reproduced."""
    return zlib.crc32(repr(case).encode())


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    denom = expected.norm().item() or 1.0
    return (actual.double() - expected).norm().item() / denom


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so an element the kernel fails to write shows up in the error."""
    return torch.full_like(t, float("nan"))


def fp64_act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(x[..., :d]) · x[..., d:] in fp64, from the formulas (silu, gelu (erf), gelu_tanh): the tests' oracle."""
    x = x.double()
    d = x.shape[-1] // 2
    g, u = x[..., :d], x[..., d:]
    if activation == "silu":
        a = g / (1 + torch.exp(-g))
    elif activation == "gelu":
        a = 0.5 * g * (1 + torch.special.erf(g / math.sqrt(2)))
    else:
        a = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    return a * u
