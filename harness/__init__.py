"""Correctness and regression harness for the Mamba2 SSD prefill path."""

# The provider under test unless ``--provider`` names another. Here, not in harness.checks, so that the xdist
# controller can name it without importing the checks (and torch) before it starts the workers.
DEFAULT_PROVIDER = "kernels:provider"
