"""Correctness and regression harness for the Mamba2 SSD prefill path."""
