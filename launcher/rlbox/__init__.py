"""rlbox: reproducible verl images and launcher for Ascend NPU clusters."""

__version__ = "0.1.0"
