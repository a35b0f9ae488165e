"""Compile the Triton specializations an engine will need before it captures CUDA graphs.

The kernels do not specialize on the number of rows; the gated activations pick a block size for small and
for large problems, so each width is run at one row and at a size past that threshold. Capture then launches
only compiled kernels. `training=True` also runs each op's backward kernels (what a captured training step
launches).
"""
from __future__ import annotations

from typing import Iterable

import torch

from sk import ops
from sk.ops.act_and_mul import SMALL_PROBLEM


def warmup(
    hidden_sizes: Iterable[int] = (),
    intermediate_sizes: Iterable[int] = (),
    *,
    dtypes: Iterable[torch.dtype] = (torch.bfloat16,),
    device: str | torch.device = "cuda",
    training: bool = False,
) -> int:
    """Run every norm at each hidden size and every gated activation at each intermediate size once (forward and,
    with `training`, backward).

    Returns the number of kernel calls made. Call it before `torch.cuda.graph` capture.
    """
    calls = 0
    for dtype in dtypes:
        for n in hidden_sizes:
            x = torch.randn(2, n, dtype=dtype, device=device)
            w = torch.randn(n, dtype=dtype, device=device)
            ops.rms_norm(x, w)
            ops.gemma_rms_norm(x, w)
            ops.fused_add_rms_norm(x, x.clone(), w)
            ops.fused_add_rms_norm_(x.clone(), x.clone(), w)
            ops.gemma_fused_add_rms_norm_(x.clone(), x.clone(), w)
            calls += 5
            if training:
                xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
                for norm in (ops.rms_norm, ops.gemma_rms_norm):
                    norm(xg, wg).sum().backward()
                for fused in (ops.fused_add_rms_norm, ops.gemma_fused_add_rms_norm):
                    sum(t.sum() for t in fused(xg, xg.detach().clone(), wg)).backward()
                calls += 8
        for d in intermediate_sizes:
            for rows in (1, SMALL_PROBLEM // d + 1):
                x = torch.randn(rows, 2 * d, dtype=dtype, device=device)
                ops.silu_and_mul(x)
                ops.gelu_and_mul(x)
                ops.gelu_and_mul(x, approximate="tanh")
                calls += 3
                if training:
                    xg = x.clone().requires_grad_()
                    (ops.silu_and_mul(xg).sum() + ops.gelu_and_mul(xg).sum()
                     + ops.gelu_and_mul(xg, approximate="tanh").sum()).backward()
                    calls += 6
    return calls
