"""The project's trained models (models/trained/<style> in the repository, made by `python -m sk.models.train`).

They are files of the repository, found from wherever the package is installed: a wheel ships them as package
data (sk/trained_models/<style>), an editable install reads them from its checkout (models/trained/<style>).
"""
from __future__ import annotations

from pathlib import Path

# The styles the project trained (sk.models.tiny has more styles of random-weight models).
TRAINED_STYLES = ("llama", "gemma", "qwen3")

_PACKAGE = Path(__file__).resolve().parents[1]  # the installed `sk` package (sk_core in a checkout)
LOCATIONS = (
    _PACKAGE / "trained_models",  # a wheel's package data
    _PACKAGE.parent / "models" / "trained",  # an editable install's checkout
)


def trained_model(style: str) -> Path:
    """Directory of the trained model of `style` (ValueError for an unknown style, FileNotFoundError when the
    installed package has no copy of the files)."""
    if style not in TRAINED_STYLES:
        raise ValueError(f"unknown trained model style {style!r}; known: {', '.join(TRAINED_STYLES)}")
    for location in LOCATIONS:
        if (location / style / "model.safetensors").is_file():
            return location / style
    raise FileNotFoundError(
        f"trained model {style!r} not found in {' or '.join(str(loc / style) for loc in LOCATIONS)}; it is part of "
        "the repository (models/trained/): install the package from a checkout (pip install -e .) or as a wheel "
        "built from one, or give the model directory by path")
