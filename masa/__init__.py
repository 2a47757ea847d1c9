"""Masa: memory-aware multi-DNN inference middleware for small edge devices."""

__version__ = "0.1.0"
