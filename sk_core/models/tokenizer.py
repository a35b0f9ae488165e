"""A byte-level tokenizer made here, so engine tests and demos need no model hub.

Every byte is one token (no merges), with <pad>, <bos>, <eos> first; the files are the Hugging Face
`tokenizer.json` + `tokenizer_config.json` pair that vLLM and transformers load with PreTrainedTokenizerFast.
Needs the `tokenizers` package (installed with vLLM).
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def write_byte_tokenizer(out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "model_max_length": 4096,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
