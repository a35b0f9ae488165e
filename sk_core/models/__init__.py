"""Small models the project makes itself (random weights, fixed seed, own tokenizer) for engine tests and demos."""
from sk.models.tiny import STYLES, TinyModelSpec, tiny_model

__all__ = ["STYLES", "TinyModelSpec", "tiny_model"]
