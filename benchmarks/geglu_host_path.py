"""Host (Python) cost of one fused_pre_norm_geglu call, measured on CPU with the Triton kernels stubbed out.

    TRITON_INTERPRET=1 python benchmarks/geglu_host_path.py

Training launches the op from Python every step, so whatever the op does on the host between kernel launches
adds to each step while the GPU waits. This times that part alone: the kernels are replaced by no-ops (so
outputs are garbage), the interpreter makes CPU tensors count as covered, and the problem is tiny so that the
backward's PyTorch ops (cuBLAS GEMMs on the GPU) cost about a launch each. Not counted: Triton's own launch
path for the kernels (a few µs each on the GPU host). Buffers are zeroed after allocation (~1 µs each).
"""
from __future__ import annotations

import importlib
import os
import sys

import torch

if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
    sys.exit("geglu_host_path: run on a CPU machine with TRITON_INTERPRET=1")

import sk  # noqa: E402
from sk.bench.timing import host_us_per_call  # noqa: E402

gk = importlib.import_module("sk.ops.gated_mlp.geglu_kernels")
common = importlib.import_module("sk.ops.gated_mlp.common")


class _Stub:
    """A kernel whose launch does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls=2000, repeats=7):
    return host_us_per_call(fn, calls=calls, repeats=repeats)


def main():
    for name in ("ln_stats_kernel", "gate_up_kernel", "down_kernel", "geglu_backward_kernel", "ln_backward_kernel"):
        setattr(gk, name, _Stub())
    common.CHECK_DESCRIPTORS = False  # as on the GPU (the interpreter turns the checks on)
    for name in ("empty", "empty_like"):  # zeroed, not garbage: the stubs write nothing, and NaN or denormal
        allocate = getattr(torch, name)      # bits make the backward's CPU GEMMs a hundred times slower

        def zeroed(*args, allocate=allocate, **kwargs):
            return allocate(*args, **kwargs).zero_()
        setattr(torch, name, zeroed)
    torch.set_num_threads(1)  # tiny CPU ops: thread start-up and spinning would swamp the host cost measured
    torch.manual_seed(0)
    block = sk.nn.PreNormGEGLUFFN(16, 32)
    x = torch.randn(8, 16, dtype=torch.float16)
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)

    def inference():
        with torch.no_grad():
            block(x)

    def forward_for_training():
        block(xg)

    def step():
        block(xg).backward(dy)

    with sk.coverage.strict():  # every call must take the kernel path, not the fallback
        results = {"forward, no grad": per_call_us(inference),
                   "forward, saving for backward": per_call_us(forward_for_training),
                   "forward + backward": per_call_us(step, calls=500)}
    for what, us in results.items():
        print(f"{what}: {us:.1f} us")


if __name__ == "__main__":
    main()
