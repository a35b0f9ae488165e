"""Standard Kernels modules: complete nn.Modules that own their parameters and call the fused ops."""
from sk.nn.geglu import PreNormGEGLUFFN

__all__ = ["PreNormGEGLUFFN"]
