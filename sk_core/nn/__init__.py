"""Standard Kernels modules: complete nn.Modules that own their parameters and call the fused ops, and `swap`,
which puts them in place of a Hugging Face model's own."""
from sk.nn.geglu import PreNormGEGLUFFN
from sk.nn.mlp import GatedMLP, PreNormGatedFFN, PreNormSwiGLUFFN
from sk.nn.norm import GemmaRMSNorm, RMSNorm
from sk.nn.swap import SwapError, SwapResult, swap

__all__ = ["PreNormGEGLUFFN", "RMSNorm", "GemmaRMSNorm", "GatedMLP", "PreNormGatedFFN", "PreNormSwiGLUFFN",
           "swap", "SwapResult", "SwapError"]
