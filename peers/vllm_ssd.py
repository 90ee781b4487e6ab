"""vLLM's Mamba2 SSD prefill kernels as a harness provider: ``--provider peers.vllm_ssd:provider``.

Imports vLLM's ``mamba_chunk_scan_combined_varlen`` (ops/ssd_combined.py) and ``gather_initial_states``
(ops/gather_initial_states.py), from:

1. the folder ``SSD_HARNESS_VLLM_OPS`` names, when that variable is set (an explicit choice wins);
2. else an installed ``vllm``;
3. else the assembled folder ``.peers/vllm-0.33.0`` of this repository (``python scripts/assemble_vllm_ops.py``
   writes it from the vLLM 0.33.0 wheel: vLLM's own files, unchanged, plus stand-ins for the rest of vLLM).

When none of them has the ops, importing this module raises ImportError naming the import that failed and the
command that assembles the ops. ``provider.source`` says where the ops came from.

The call, mapped onto vLLM's arguments: x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens,
last_chunk_indices, seq_idx, out, D, z, dt_bias, dt_softplus and dt_limit pass through under the same names.
The initial states are a dense copy made first by vLLM's ``gather_initial_states(state_cache,
initial_state_indices, has_initial_states)`` (zeros where the mask is false), passed as ``initial_states``
for every call (the snapshot path). ``state_dtype`` is the cache dtype, as vLLM's Mamba2 mixer passes it. Direct
writeback passes ``final_states_out=state_cache, final_state_indices=final_state_indices`` (vLLM's kernel stores
each final state into its slot); returned mode passes neither and returns vLLM's ``states[last_chunk_indices]``;
checkpoint mode passes ``return_intermediate_states=True`` and no cache, so nothing is written.

The optional hooks (docs/provider.md#optional-hooks): ``warmup(requests)`` makes representative calls per model
configuration, as a vLLM server's startup dummy runs do (``VllmSSDProvider.warmup`` lists what they cover; the
recompile guard names whatever a real call needs beyond that); ``stages`` offers vLLM's gather, whose contract is
the harness's, and not its state passing, whose contract is not (the comment at ``VllmSSDProvider.stages``);
``tuning_caches`` names vLLM's own cache of tuned configs; ``stage_launches`` launches each of vLLM's stages alone
for the stage bench, through vLLM's private stage functions (``STAGE_FUNCTIONS`` says which, and the gate);
``exact_across_configs`` names the kernels whose configs cannot change the states (bmm and the chunk scan write none).

``SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS=1`` (read by ``keep_racy_configs`` alone, when the ops are imported) imports
vLLM's chunk scan with ``_drop_racy_wgmma_configs`` as the identity, so that ``every_config`` forces all of its configs
on sm90 too, the ones vLLM drops there because Triton miscompiles them (``_racy_configs_kept`` says how).

Where our contract and vLLM 0.33's differ:

- **No indexed path.** vLLM always reads initial states from a dense copy: ``supported_paths`` is {"snapshot"}
  and ``path="indexed"`` raises ValueError (the harness then reports indexed checks as unsupported).
- **Negative final slots.** Ours: a negative final slot (a padded sequence) writes nothing. vLLM 0.33's state
  passing kernel (ssd_state_passing.py, ``_state_passing_fwd_kernel`` under ``HAS_FINAL_STATES``) loads the slot and
  stores the final state at ``final_states_ptr + slot * stride(0)`` without a ``slot >= 0`` test, i.e. ``-slot``
  rows before slot 0. A vLLM bug, not a choice: causal_conv1d, called with the same index tensor in the same layer,
  skips ``PAD_SLOT_ID`` (-1). The adapter passes such calls through, so that the harness and the fuzzer see what vLLM
  does. On a GPU always (no index read, no sync; nothing differs inside CUDA graph capture): the harness's cases keep
  the row a negative slot addresses inside the cache's storage (``Case.cache_guard``), where ``untouched_storage``
  fails on the store; for other callers it lands in whatever memory precedes the cache, or faults, which the
  harness's isolation turns into that item's error. Under Triton's interpreter (CPU tensors) a store is a plain write
  to the host address computed, with no fault to stop it: a row before the cache's storage would be the process's
  heap, corrupting it silently or crashing later somewhere unrelated. There the adapter reads the (host) indices and
  refuses a call with NotImplementedError, naming the cause, when a negative slot's row starts before the storage;
  one whose rows lie inside (every harness case) goes through. ``cases/regressions/vllm-0.33-negative-final-slot.yaml``
  keeps the failure visible (an xfail for this provider only).
- **Checkpoint mode with final slots.** Ours writes nothing in checkpoint mode whatever ``final_state_indices``
  holds; vLLM asserts that the two are not combined, so checkpoint mode never passes the cache.
- **has_initial_states** may be int in ours; vLLM's gather asserts bool, so an int mask is passed as ``mask != 0``.
- **No extensions.** ``state_dtype``, ``gather`` and ``workspace_out`` (extensions of ``kernels:provider``) are not
  accepted: a call with them fails with TypeError naming the keyword.
- **Under Triton's interpreter (CPU tensors)** vLLM's ``gather_initial_states`` wrapper asserts CUDA/XPU tensors,
  so the provider launches the wrapper's own kernel (``_gather_initial_states_kernel``) with the wrapper's
  arguments (launch_pdl off, as on a device without programmatic dependent launch). The interpreter has no GPU
  benchmarker: the harness gives every autotuner without one of its own a deterministic stand-in when it configures
  the CPU device (``harness.triton_autotuner.use_interpreter_benchmarker``), vLLM's included. Calls with bf16
  x/B/C give garbage there (|out| ~ 1e10, reference_bound fails): Triton 3.6's interpreter keeps bf16 values as
  their uint16 bit patterns and its ``tl.dot`` multiplies those integers (``InterpreterBuilder.create_dot`` converts
  only 8-bit floats). vLLM's kernels dot bf16 tiles; ours widen
  them to fp32 under the interpreter (``kernels.backend.DOT_FP32_OPERANDS``). Not a vLLM fault: with the
  interpreter's dot widening bf16 operands, the same cases pass. bf16 is for the GPU tier.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

OPS_ENV = "SSD_HARNESS_VLLM_OPS"
# "1": import vLLM's chunk scan with every one of its configs, the ones ``_drop_racy_wgmma_configs`` drops on sm90
# included (``_racy_configs_kept``); read by ``keep_racy_configs`` alone.
KEEP_RACY_ENV = "SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS"
VLLM_VERSION = "0.33.0"
DEFAULT_OPS_DIR = Path(__file__).resolve().parents[1] / ".peers" / f"vllm-{VLLM_VERSION}"
ASSEMBLE_COMMAND = "python scripts/assemble_vllm_ops.py"
OPS = "vllm.model_executor.layers.mamba.ops"
COMBINED = f"{OPS}.ssd_combined"
GATHER = f"{OPS}.gather_initial_states"
CHUNK_SCAN = f"{OPS}.ssd_chunk_scan"
_ABSENT = object()
# vLLM keywords the mapping relies on: a vLLM whose function lacks one cannot be driven faithfully.
NEEDED_KEYWORDS = ("chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices", "seq_idx", "out", "D", "z",
                   "dt_bias", "initial_states", "dt_softplus", "dt_limit", "return_intermediate_states",
                   "state_dtype", "final_states_out", "final_state_indices")


def keep_racy_configs() -> bool:
    """``SSD_HARNESS_VLLM_KEEP_RACY_CONFIGS``: "1" keeps every chunk-scan config (``_racy_configs_kept``), unset or
    "0" imports vLLM's ops as they are."""
    raw = os.environ.get(KEEP_RACY_ENV, "")
    if raw not in ("", "0", "1"):
        raise ImportError(f"peers.vllm_ssd: {KEEP_RACY_ENV}={raw!r}: expected '1' (keep the racy chunk-scan "
                          "configs) or '0' / unset (vLLM's ops as they are)")
    return raw == "1"


@contextlib.contextmanager
def _racy_configs_kept():
    """vLLM's ssd_chunk_scan filters its autotuner's configs when the module is imported: ``_drop_racy_wgmma_configs``
    returns the list unchanged unless ``current_platform`` is CUDA with capability 9.0, where it drops the configs
    Triton miscompiles. While the ops are imported here, ``current_platform.is_device_capability`` answers False
    (ssd_chunk_scan asks it nothing else at import), so that filter is the identity and every config stays, for
    ``every_config`` to force them. The module must not be imported already: its configs are fixed then."""
    if CHUNK_SCAN in sys.modules:
        raise ImportError(f"peers.vllm_ssd: {KEEP_RACY_ENV}=1 but {CHUNK_SCAN} was imported already, with its configs "
                          "filtered; set the variable before anything imports vLLM's ops")
    platform = importlib.import_module("vllm.platforms").current_platform
    own = vars(platform).get("is_device_capability", _ABSENT)
    platform.is_device_capability = lambda *args, **kwargs: False
    try:
        yield
    finally:
        if own is _ABSENT:
            del platform.is_device_capability
        else:
            platform.is_device_capability = own


def _import_modules():
    """ssd_combined and gather_initial_states, every chunk-scan config kept where ``keep_racy_configs()``."""
    with _racy_configs_kept() if keep_racy_configs() else contextlib.nullcontext():
        return importlib.import_module(COMBINED), importlib.import_module(GATHER)


def _import_from_folder(folder: Path, why: str):
    """The two ops modules from an assembled folder; ImportError with the assemble command when it lacks them."""
    marker = folder / Path(*COMBINED.split(".")).with_suffix(".py")
    if not marker.is_file():
        raise ImportError(
            f"peers.vllm_ssd: cannot import mamba_chunk_scan_combined_varlen from {COMBINED}: {why}, and the "
            f"assembled ops folder {folder} has no {marker.relative_to(folder)}. Assemble vLLM {VLLM_VERSION}'s "
            f"ops there with: {ASSEMBLE_COMMAND} --out {folder}   (or install vllm, or set {OPS_ENV} to an "
            f"assembled folder)")
    loaded = sys.modules.get("vllm")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(folder)):
        raise ImportError(f"peers.vllm_ssd: {OPS_ENV}={folder} asks for the assembled ops, but this process already "
                          f"imported vllm from {getattr(loaded, '__file__', '?')}")
    sys.path.insert(0, str(folder))
    try:
        combined, gather = _import_modules()
    finally:
        sys.path.remove(str(folder))
    manifest = folder / "ASSEMBLED.json"
    version = json.loads(manifest.read_text())["vllm_version"] if manifest.is_file() else "unknown"
    return combined, gather, version, f"vLLM {version} ops assembled in {folder}"


def _import_ops():
    """(ssd_combined module, gather module, vLLM version, where they came from), in the order the module says."""
    chosen = os.environ.get(OPS_ENV)
    if chosen:
        return _import_from_folder(Path(chosen).resolve(), f"{OPS_ENV} names this folder")
    try:
        import vllm
    except ImportError as exc:
        return _import_from_folder(DEFAULT_OPS_DIR, f"vllm is not installed ({exc})")
    combined, gather = _import_modules()
    version = getattr(vllm, "__version__", "unknown")
    return combined, gather, version, f"installed vllm {version} ({os.path.dirname(vllm.__file__)})"


_combined, _gather_module, VERSION, SOURCE = _import_ops()
CHUNK_SCAN_CONFIGS = len(sys.modules[CHUNK_SCAN]._chunk_scan_fwd_kernel.configs)
if keep_racy_configs():
    SOURCE += f"; {KEEP_RACY_ENV}=1: _drop_racy_wgmma_configs bypassed, {CHUNK_SCAN_CONFIGS} chunk-scan configs kept"
mamba_chunk_scan_combined_varlen = _combined.mamba_chunk_scan_combined_varlen
gather_initial_states = _gather_module.gather_initial_states

_missing = [k for k in NEEDED_KEYWORDS if k not in inspect.signature(mamba_chunk_scan_combined_varlen).parameters]
if _missing:
    raise ImportError(f"peers.vllm_ssd: {SOURCE}: mamba_chunk_scan_combined_varlen has no keyword(s) {_missing}; "
                      f"the adapter maps onto vLLM {VLLM_VERSION}'s signature")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _snapshot(state_cache: torch.Tensor, initial_state_indices: torch.Tensor,
              has_initial_states: torch.Tensor) -> torch.Tensor:
    """vLLM's dense initial-state copy (zeros where the mask is false); the stage contract's names and semantics."""
    indices, has_initial = initial_state_indices, has_initial_states
    if has_initial.dtype != torch.bool:
        has_initial = has_initial != 0
    if state_cache.is_cuda or state_cache.is_xpu:
        return gather_initial_states(state_cache, indices, has_initial)
    if not _interpreting():
        raise RuntimeError("peers.vllm_ssd: CPU tensors need Triton's interpreter (TRITON_INTERPRET=1; "
                           "python -m harness --device cpu sets it)")
    # The wrapper's launch, without its CUDA/XPU assertion.
    import triton

    assert state_cache[0].is_contiguous(), "state_cache: each (H, P, N) row must be dense"
    row = state_cache[0].numel()
    out = torch.empty((indices.numel(), *state_cache.shape[1:]), dtype=state_cache.dtype, device=state_cache.device)
    block = min(triton.next_power_of_2(row), 1024)
    _gather_module._gather_initial_states_kernel[(triton.cdiv(row, block), indices.numel())](
        state_cache, indices, has_initial, out, state_cache.stride(0), indices.stride(0), has_initial.stride(0),
        row_size=row, BLOCK_SIZE=block, num_warps=8, launch_pdl=False,
    )
    return out


def _refuse_stores_outside_the_storage(state_cache: torch.Tensor, final_state_indices: torch.Tensor) -> None:
    """CPU tensors (the interpreter): NotImplementedError when vLLM would store a negative slot's final state before
    the cache's storage, i.e. into the process's heap (the module's docstring, "Negative final slots")."""
    slots = final_state_indices.tolist()
    outside = sorted({s for s in slots if s < 0 and state_cache.storage_offset() + s * state_cache.stride(0) < 0})
    if outside:
        padded = [b for b, s in enumerate(slots) if s in outside]
        raise NotImplementedError(
            f"vLLM {VERSION}: final_state_indices {slots}: the state passing kernel stores a negative slot's final "
            "state at slot * stride(0) without skipping it (ssd_state_passing.py, HAS_FINAL_STATES), where our "
            f"contract writes nothing. For slots {outside} (sequences {padded}) that row starts before the cache's "
            f"storage (storage_offset {state_cache.storage_offset()}, stride(0) {state_cache.stride(0)}); under "
            "Triton's interpreter the store would write into this process's heap, so the adapter refuses the call "
            "on CPU tensors (on a GPU it passes it through)")


# ---- the stage_launches hook: each of vLLM's stages alone ---------------------------------------------------------
# vLLM's stage functions are private (underscored) names that ssd_combined.py imports from its stage modules and
# calls in ``_mamba_chunk_scan_combined_fwd``: the only way to launch one stage alone. Each is used only where it has
# the keywords named here (vLLM 0.33's); a vLLM without them gets no stage launches (the hook says which name is
# missing) and keeps the profiled stage comparison, which needs no hook.
STAGE_FUNCTIONS = {
    "_chunk_cumsum_fwd": ("dt_bias", "dt_softplus", "dt_limit"),
    "_chunk_state_fwd": ("states_in_fp32",),
    "_state_passing_fwd": ("initial_states", "out_dtype", "final_states", "final_state_indices"),
    "_bmm_chunk_fwd": ("output_dtype",),
    "_chunk_scan_fwd": ("D", "z", "initial_states"),
}


def _stage_functions() -> SimpleNamespace:
    """vLLM's stage functions as ssd_combined.py calls them; NotImplementedError naming what this vLLM lacks."""
    found = {}
    for name, keywords in STAGE_FUNCTIONS.items():
        fn = getattr(_combined, name, None)
        missing = [k for k in keywords if fn is None or k not in inspect.signature(fn).parameters]
        if fn is None or missing:
            raise NotImplementedError(
                f"{SOURCE}: ssd_combined has no {name}" + (f" with keyword(s) {missing}" if fn is not None else "")
                + f"; the stage launches follow vLLM {VLLM_VERSION}'s _mamba_chunk_scan_combined_fwd")
        found[name.strip("_").removesuffix("_fwd")] = fn
    return SimpleNamespace(**found)


def _vllm_stage_launches(x, dt, A, B, C, *, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx,
                         out, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                         state_cache, initial_state_indices, has_initial_states, final_state_indices=None,
                         return_intermediate_states=False, path="auto") -> dict:
    """The stages of the adapter's call (``VllmSSDProvider.ssd_prefill``), each a closure launching it alone on
    the intermediates, in the order and with the arguments of vLLM's ``_mamba_chunk_scan_combined_fwd``."""
    if path not in ("auto", "snapshot"):
        raise ValueError(f"path={path!r}: vLLM {VERSION} has the snapshot path only")
    if return_intermediate_states or final_state_indices is None:
        raise NotImplementedError("stage launches: direct writeback only (final_state_indices given, no "
                                  "intermediate states), the mode a serving engine's call runs")
    f = _stage_functions()
    if state_cache.device.type == "cpu":  # the state passing's launches store final states, as the call does
        _refuse_stores_outside_the_storage(state_cache, final_state_indices)
    B = B if B.stride(-1) == 1 else B.contiguous()  # the combined function's own layout fixes, so the stages
    C = C if C.stride(-1) == 1 else C.contiguous()  # read what they read in a call
    x = x if x.stride(-1) == 1 or x.stride(0) == 1 else x.contiguous()
    z = z if z is None or z.stride(-1) == 1 or z.stride(0) == 1 else z.contiguous()
    D = D if D is None or D.stride(-1) == 1 else D.contiguous()
    P, N = x.shape[-1], B.shape[-1]
    initial = _snapshot(state_cache, initial_state_indices, has_initial_states)
    dA, dt_out = f.chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                dt_limit=dt_limit)
    chunk_states = f.chunk_state(B, x, dt_out, dA, cu_chunk_seqlens, states_in_fp32=True)

    def passing():
        return f.state_passing(chunk_states.flatten(-2), dA, last_chunk_indices, initial_states=initial.flatten(-2),
                               out_dtype=state_cache.dtype, final_states=state_cache.flatten(-2),
                               final_state_indices=final_state_indices)

    states = passing().unflatten(-1, (P, N))
    CB = f.bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, output_dtype=torch.float32)

    def scan():
        f.chunk_scan(CB, x, dt_out, dA, C, states, cu_chunk_seqlens, out, seq_idx, D=D, z=z, initial_states=initial)
        return out

    return {
        "gather": lambda: _snapshot(state_cache, initial_state_indices, has_initial_states),
        "chunk_cumsum": lambda: f.chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, dt_bias=dt_bias,
                                               dt_softplus=dt_softplus, dt_limit=dt_limit)[0],
        "chunk_state": lambda: f.chunk_state(B, x, dt_out, dA, cu_chunk_seqlens, states_in_fp32=True),
        "state_passing": passing,
        "bmm_chunk": lambda: f.bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, output_dtype=torch.float32),
        "chunk_scan": scan,
    }


# ---- the warmup hook: representative calls, as a vLLM server warms --------------------------------------------------
# A vLLM server does not enumerate Triton specializations: it runs dummy forward passes at startup (profiling, and
# the compile sizes), and whatever those launches compiled is warm. The hook does the same with representative calls
# per model configuration: sequences as (context tokens already cached, new tokens, has an initial state).
WARMUP_BATCHES = (
    ((0, None, False),),  # one new sequence of exactly one chunk (None: the chunk size)
    ((5, 20, True), (0, 7, False)),  # one continuing mid-chunk over a chunk boundary, one new and short
)
WARMUP_MODES = ("direct", "returned", "checkpoint")
WARMUP_ROW_PADS = (0, 1)  # compact state rows, and rows padded by one element (vLLM pages may pad stride(0))


def _varlen(sequences, chunk_size: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """cu_seqlens, cu_chunk_seqlens, last_chunk_indices and seq_idx, chunks aligned to absolute positions."""
    cu_seqlens, cu_chunks, last_chunk, seq_idx = [0], [0], [], []
    for b, (context, tokens, _) in enumerate(sequences):
        start, pos = cu_seqlens[-1], 0
        while pos < tokens:
            pos = min(tokens, pos + chunk_size - (context + pos) % chunk_size)
            cu_chunks.append(start + pos)
            seq_idx.append(b)
        last_chunk.append(len(seq_idx) - 1)
        cu_seqlens.append(start + tokens)
    return cu_seqlens, cu_chunks, last_chunk, seq_idx


def _warmup_call(config, sequences, mode: str, row_pad: int, device: str) -> dict:
    """``ssd_prefill`` keywords for ``sequences`` under ``config`` (a ModelConfig, read by attribute): int32 slot
    indices (as vLLM's metadata makes them), slot b the initial state and slot b + batch the final state of
    sequence b."""
    H, P, N, G, Q = config.nheads, config.headdim, config.dstate, config.ngroups, config.chunk_size
    sequences = [(c, Q if t is None else t, h) for c, t, h in sequences]
    cu_seqlens, cu_chunks, last_chunk, seq_idx = _varlen(sequences, Q)
    T, batch = cu_seqlens[-1], len(sequences)
    io = dict(dtype=config.io_dtype, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    row = H * P * N + row_pad
    cache = torch.zeros(2 * batch * row, dtype=config.state_dtype, device=device)
    d_shape = {"none": None, "per_head": (H,), "per_channel": (H, P)}[config.D]
    return dict(
        x=torch.randn(T, H, P, **io), dt=torch.rand(T, H, **f32), A=-torch.rand(H, **f32),
        B=torch.randn(T, G, N, **io), C=torch.randn(T, G, N, **io), chunk_size=Q,
        cu_seqlens=torch.tensor(cu_seqlens, **i32), cu_chunk_seqlens=torch.tensor(cu_chunks, **i32),
        last_chunk_indices=torch.tensor(last_chunk, **i32), seq_idx=torch.tensor(seq_idx, **i32),
        out=torch.empty(T, H, P, **io), D=torch.rand(d_shape, **f32) if d_shape else None,
        z=torch.randn(T, H, P, **io) if config.z else None, dt_bias=torch.rand(H, **f32) if config.dt_bias else None,
        dt_softplus=bool(config.dt_softplus), dt_limit=tuple(config.dt_limit),
        state_cache=cache.as_strided((2 * batch, H, P, N), (row, P * N, N, 1)),
        initial_state_indices=torch.arange(batch, **i32),
        has_initial_states=torch.tensor([h for _, _, h in sequences], device=device),
        final_state_indices=torch.arange(batch, 2 * batch, **i32) if mode == "direct" else None,
        return_intermediate_states=mode == "checkpoint",
    )


class VllmSSDProvider:
    """vLLM's ``mamba_chunk_scan_combined_varlen`` behind the harness's ``ssd_prefill`` (snapshot path only), with
    the optional hooks (docs/provider.md#optional-hooks): ``warmup(requests)``, ``stages``, ``tuning_caches`` and
    ``stage_launches``."""

    name = f"vllm-{VERSION}-ssd" + ("-all-chunk-scan-configs" if keep_racy_configs() else "")
    supported_paths = frozenset({"snapshot"})
    source = SOURCE
    # bmm and the chunk scan write no state (CB and out only): the final states and the cache keep their bits
    # whichever of their configs runs (``every_config`` holds them to it; docs/provider.md).
    exact_across_configs = {f"{OPS}.ssd_bmm._bmm_chunk_fwd_kernel": ("states",),
                            f"{CHUNK_SCAN}._chunk_scan_fwd_kernel": ("states",)}
    # Stage hooks with the harness's stage contracts (docs/architecture.md). The snapshot gather is vLLM's, with the
    # same contract (the adapter's copy: a bool mask made from an int one, and under the interpreter the wrapper's
    # own kernel launch). Not offered: vLLM's state passing (``_state_passing_fwd``, private) takes (C, H, P*N)
    # states and finds sequences by ``last_chunk_indices`` instead of ``seq_idx``, and stores a negative slot's
    # final state outside the cache where the contract writes nothing: not the same contract. vLLM has no indexed
    # twin.
    stages = SimpleNamespace(gather_initial_states=_snapshot)

    def tuning_caches(self) -> list[dict]:
        """vLLM's ``triton_helpers.launch_autotuned`` keeps each autotuned kernel's chosen config in the module's
        ``_autotuned_configs`` (keyed by kernel, tuning-key values and argument dtypes) and launches ``kernel.fn``
        directly after the first tune, so Triton's autotuner never runs again for that key: the autotuning check
        empties this dict for its tuned call. [] where the module has no such cache (another vLLM version)."""
        helpers = sys.modules.get(f"{OPS}.triton_helpers")
        cache = getattr(helpers, "_autotuned_configs", None)
        return [cache] if isinstance(cache, dict) else []

    def stage_launches(self, **call) -> dict:
        """Each of vLLM's stages in this call as a closure launching it alone on the call's intermediates (the
        optional hook of docs/provider.md; direct writeback calls only). NotImplementedError where this vLLM lacks
        a stage function the launches need (``STAGE_FUNCTIONS``)."""
        return _vllm_stage_launches(**call)

    def warmup(self, requests) -> int:
        """What a vLLM server's startup dummy runs compile, for each model configuration: representative calls
        (``WARMUP_BATCHES``: one new sequence of one chunk; a sequence continuing mid-chunk over a chunk boundary
        beside a new short one) in each final-state mode, on compact and padded cache rows, int32 contiguous slot
        indices and bool masks; vLLM's autotuners tune on the first of them. What real calls bring beyond that
        (int64 or strided slot indices, caches at a storage offset, other token and chunk counts where a kernel
        specializes on them) compiles at first use, and the recompile guard names it. Returns the calls made."""
        device = "cuda" if not _interpreting() else "cpu"
        calls = 0
        for config in requests:
            for sequences in WARMUP_BATCHES:
                for mode in WARMUP_MODES:
                    for row_pad in WARMUP_ROW_PADS:
                        self.ssd_prefill(**_warmup_call(config, sequences, mode, row_pad, device))
                        calls += 1
        if device == "cuda":
            torch.cuda.synchronize()
        return calls

    def ssd_prefill(self, x, dt, A, B, C, *, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx,
                    out, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf), state_cache,
                    initial_state_indices, has_initial_states, final_state_indices=None,
                    return_intermediate_states=False, path="auto"):
        if path == "indexed":
            raise ValueError(f"path='indexed': vLLM {VERSION} has no indexed path (it always reads initial states "
                             "from a dense copy: snapshot only)")
        if path not in ("auto", "snapshot"):
            raise ValueError(f"path: expected one of auto, snapshot, indexed; found {path!r}")
        direct = final_state_indices is not None and not return_intermediate_states
        if direct and state_cache.device.type == "cpu":
            _refuse_stores_outside_the_storage(state_cache, final_state_indices)
        initial_states = _snapshot(state_cache, initial_state_indices, has_initial_states)
        return mamba_chunk_scan_combined_varlen(
            x, dt, A, B, C,
            chunk_size=chunk_size,
            cu_seqlens=cu_seqlens,
            cu_chunk_seqlens=cu_chunk_seqlens,
            last_chunk_indices=last_chunk_indices,
            seq_idx=seq_idx,
            out=out,
            D=D,
            z=z,
            dt_bias=dt_bias,
            initial_states=initial_states,
            dt_softplus=dt_softplus,
            dt_limit=dt_limit,
            return_intermediate_states=bool(return_intermediate_states),
            state_dtype=state_cache.dtype,
            final_states_out=state_cache if direct else None,
            final_state_indices=final_state_indices if direct else None,
        )

    def __repr__(self) -> str:
        return f"<provider {self.name} from {self.source}>"


provider = VllmSSDProvider()

__all__ = ["provider", "VllmSSDProvider", "mamba_chunk_scan_combined_varlen", "gather_initial_states"]
