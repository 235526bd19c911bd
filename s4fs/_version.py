"""The version of s4fs (a leaf module: what reports it need not import the package)."""

__version__ = "0.1.0"
