"""Benchmarks: per-call timing inside CUDA graphs, and our ops side by side with PyTorch and peer libraries."""
