"""PyTorch references: fp64 sequential scan (ground truth), chunked five-stage reference, snapshot semantics."""

from reference.provider import provider

__all__ = ["provider"]
