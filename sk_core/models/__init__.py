"""Small models the project makes itself, with its own byte tokenizer, for engine tests and demos: random weights
of any size written on first use (sk.models.tiny), and the trained models it ships (sk.models.trained)."""
from sk.models.tiny import STYLES, TinyModelSpec, tiny_model
from sk.models.trained import trained_model

__all__ = ["STYLES", "TinyModelSpec", "tiny_model", "trained_model"]
