"""Adapters that put other engines' SSD prefill kernels behind the harness's provider interface
(``--provider peers.vllm_ssd:provider``). Their code is never part of this repository: each adapter imports it
from an installed package or from a folder a script under ``scripts/`` assembles."""
