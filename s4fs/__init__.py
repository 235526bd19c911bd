"""s4fs — lossless, GPU-accelerated, transparent checkpoint filesystem for PyTorch."""

__version__ = "0.1.0"
