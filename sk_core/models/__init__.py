"""Small models the project makes itself, with its own byte tokenizer, for engine tests and demos: random weights
of any size written on first use (sk.models.tiny), and the trained models it ships (sk.models.trained)."""
from sk.models.tiny import STYLES, TinyModelSpec, parameter_count, tiny_model
from sk.models.trained import TRAINED_STYLES, trained_model

__all__ = ["STYLES", "TRAINED_STYLES", "TinyModelSpec", "parameter_count", "tiny_model", "trained_model"]
