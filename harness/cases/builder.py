"""Build the tensors of one case: generated on the CPU from ``case.seed``, then moved, so every device sees the same
inputs.

Each tensor draws from its own generator (seeded from the case seed and the tensor's name), so switching an option
on or off (z, D, dt_bias) never changes the other tensors of a case. The cache is one backing storage tensor filled
with ``cache.fill``; ``state_cache`` is a ``(slots, H, P, N)`` view into it with stride(0) = H*P*N + row_pad and the
case's storage offset, so the gaps and the bytes before slot 0 can be checked byte for byte. A direct call with a
negative final slot gets ``case.cache_guard()`` more fill elements before those of the offset: the row that slot
addresses is then inside the storage, and a provider that writes it is seen.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, fields

import torch

from harness.cases.model import TORCH_DTYPES, Case
from harness.varlen import VarlenMetadata

# Metadata tensors are int32, as vLLM builds them.
METADATA_DTYPE = torch.int32


def generator_for(seed: int, stream: str) -> torch.Generator:
    """A CPU generator for one named tensor of a case (stable across runs, platforms and option changes)."""
    mixed = (seed * 0x9E3779B97F4A7C15 + zlib.crc32(stream.encode())) % (2**63)
    return torch.Generator(device="cpu").manual_seed(mixed)


def _randn(shape: tuple[int, ...], seed: int, stream: str) -> torch.Tensor:
    return torch.randn(shape, generator=generator_for(seed, stream), dtype=torch.float32)


def _rand(shape: tuple[int, ...], seed: int, stream: str) -> torch.Tensor:
    return torch.rand(shape, generator=generator_for(seed, stream), dtype=torch.float32)


@dataclass
class CaseInputs:
    """Everything one ``ssd_prefill`` call of a case takes. Shapes: T tokens, H heads, P headdim, N dstate,
    G groups, Bt sequences.

    Tensors other than ``out`` and the cache are read-only inputs (``read_only_tensors``).
    """

    case: Case
    device: torch.device
    metadata: VarlenMetadata
    x: torch.Tensor  # (T, H, P) io
    dt: torch.Tensor  # (T, H) fp32
    A: torch.Tensor  # (H,) fp32, negative
    B: torch.Tensor  # (T, G, N) io
    C: torch.Tensor  # (T, G, N) io
    D: torch.Tensor | None  # (H,) or (H, P) fp32
    z: torch.Tensor | None  # (T, H, P) io
    dt_bias: torch.Tensor | None  # (H,) fp32
    cache_base: torch.Tensor  # (guard + offset + slots * row_stride,) state dtype: the whole backing storage
    state_cache: torch.Tensor  # (slots, H, P, N) view of cache_base, stride(0) = H*P*N + row_pad
    index_table: torch.Tensor | None  # (rows_before + Bt, columns) for the block_table layout
    initial_state_indices: torch.Tensor  # (Bt,) int32/int64, contiguous or a table column
    final_state_indices: torch.Tensor | None  # (Bt,) as above; None unless call.final_state is direct
    has_initial_states: torch.Tensor  # (Bt,) bool
    cu_seqlens: torch.Tensor  # (Bt + 1,) int32
    cu_chunk_seqlens: torch.Tensor  # (nchunks + 1,) int32
    last_chunk_indices: torch.Tensor  # (Bt,) int32
    seq_idx: torch.Tensor  # (nchunks,) int32
    out: torch.Tensor  # (T, H, P) io, NaN-poisoned by kwargs()

    def tensor_fields(self) -> dict[str, torch.Tensor]:
        """Every tensor held, by field name (None fields left out)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }

    def read_only_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors a kernel must not write: all but ``out`` and the cache."""
        return {k: t for k, t in self.tensor_fields().items() if k not in ("out", "cache_base", "state_cache")}

    def kwargs(self, path: str | None = None, final_state: str | None = None) -> dict:
        """Keyword arguments of ``provider.ssd_prefill`` (docs/provider.md); poisons ``out`` with NaN first.

        ``path`` and ``final_state`` default to the case's call; a ``direct`` case may be called as ``returned`` or
        ``checkpoint`` (nothing written), not the other way round (it has no final slots).
        """
        case = self.case
        path = path or case.call.path
        final_state = final_state or case.call.final_state
        if final_state == "direct" and self.final_state_indices is None:
            raise ValueError(
                f"{case.id}: final_state 'direct' needs final slots; the case's call is {case.call.final_state!r}"
            )
        self.out.fill_(math.nan)
        o = case.options
        return {
            "x": self.x,
            "dt": self.dt,
            "A": self.A,
            "B": self.B,
            "C": self.C,
            "chunk_size": case.shape.chunk_size,
            "cu_seqlens": self.cu_seqlens,
            "cu_chunk_seqlens": self.cu_chunk_seqlens,
            "last_chunk_indices": self.last_chunk_indices,
            "seq_idx": self.seq_idx,
            "out": self.out,
            "D": self.D,
            "z": self.z,
            "dt_bias": self.dt_bias,
            "dt_softplus": o.dt_softplus,
            "dt_limit": o.dt_limit,
            "state_cache": self.state_cache,
            "initial_state_indices": self.initial_state_indices,
            "has_initial_states": self.has_initial_states,
            "final_state_indices": self.final_state_indices if final_state == "direct" else None,
            "return_intermediate_states": final_state == "checkpoint",
            "path": path,
        }

    def clone(self) -> CaseInputs:
        """A deep copy with the same layouts: strides, storage offsets, and which tensors share a storage."""
        return _rebuild(self, lambda storage_bytes: storage_bytes.clone(), self.device)

    def to(self, device: torch.device | str) -> CaseInputs:
        """A copy on ``device`` with the same layouts and aliasing."""
        device = torch.device(device)
        return _rebuild(self, lambda storage_bytes: storage_bytes.to(device, copy=True), device)


def _storage_as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``t`` as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _rebuild(inputs: CaseInputs, copy_bytes, device: torch.device) -> CaseInputs:
    """Copy each distinct storage once with ``copy_bytes`` and re-create every tensor view on the copy."""
    copies: dict[int, torch.Tensor] = {}
    replaced: dict[str, torch.Tensor] = {}
    for name, t in inputs.tensor_fields().items():
        key = t.untyped_storage().data_ptr()
        if key not in copies:
            copies[key] = copy_bytes(_storage_as_bytes(t))
        new = torch.empty(0, dtype=t.dtype, device=device)
        new.set_(copies[key].untyped_storage(), t.storage_offset(), t.size(), t.stride())
        replaced[name] = new
    kept = {f.name: getattr(inputs, f.name) for f in fields(inputs) if f.name not in replaced}
    kept["device"] = device
    return CaseInputs(**kept, **replaced)


def _dt(case: Case, T: int, H: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    k, o, seed = case.inputs, case.options, case.seed
    noise = _randn((T, H), seed, "dt") * k.dt_scale
    if o.dt_softplus:
        # Pre-activation values; softplus(dt_offset) ~ exp(dt_offset). With a bias, the bias carries the offset.
        dt = noise + (0.0 if o.dt_bias else k.dt_offset)
        bias = k.dt_offset + 0.5 * _randn((H,), seed, "dt_bias") if o.dt_bias else None
    else:
        # Without softplus dt must already be positive.
        dt = torch.exp(noise + k.dt_offset)
        bias = 0.01 * _rand((H,), seed, "dt_bias") if o.dt_bias else None
    return dt, bias


def _indices(case: Case, values: list[int], column: int | None, table: torch.Tensor | None) -> torch.Tensor:
    if table is None:
        return torch.tensor(values, dtype=TORCH_DTYPES[case.indices.dtype])
    rows = case.indices.rows_before
    view = table[rows:, column]
    view.copy_(torch.tensor(values, dtype=table.dtype))
    return view


def build_cpu_inputs(case: Case) -> CaseInputs:
    """The case's tensors on the CPU (the source of truth every device copies)."""
    sh, seed, knobs = case.shape, case.seed, case.inputs
    meta = case.metadata()
    T, H, P, N, G = meta.total_tokens, sh.nheads, sh.headdim, sh.dstate, sh.ngroups
    io, state = case.dtype.io_torch, case.dtype.state_torch

    x = (_randn((T, H, P), seed, "x") * knobs.x_scale).to(io)
    dt, dt_bias = _dt(case, T, H)
    A = -(knobs.A_min + (knobs.A_max - knobs.A_min) * _rand((H,), seed, "A"))
    B = (_randn((T, G, N), seed, "B") * knobs.bc_scale).to(io)
    C = (_randn((T, G, N), seed, "C") * knobs.bc_scale).to(io)
    D = {"none": None, "per_head": lambda: _randn((H,), seed, "D"), "per_channel": lambda: _randn((H, P), seed, "D")}[
        case.options.D
    ]
    D = D() if D is not None else None
    z = _randn((T, H, P), seed, "z").to(io) if case.options.z else None

    # Cache: sentinel everywhere, a random state in every slot row, NaN in slots read only as masked states.
    cache = case.cache
    row = H * P * N
    row_stride = row + cache.row_pad
    fill = math.nan if cache.fill == "nan" else cache.fill
    start = case.cache_guard() + cache.offset
    cache_base = torch.full((start + cache.slots * row_stride,), fill, dtype=state)
    state_cache = cache_base.as_strided((cache.slots, H, P, N), (row_stride, P * N, N, 1), start)
    state_cache.copy_((_randn((cache.slots, H, P, N), seed, "state_cache") * knobs.state_scale).to(state))
    for s in case.sequences:
        if not s.has_state:
            state_cache[s.init_slot].fill_(math.nan)

    idx = case.indices
    init_slots = [s.init_slot for s in case.sequences]
    final_slots = [s.final_slot for s in case.sequences]
    direct = case.call.final_state == "direct"
    table = None
    if idx.layout == "block_table":
        # Other entries hold valid but wrong slots: reading the wrong entry shows as wrong data, not a fault.
        shape = (idx.rows_before + case.batch, idx.columns)
        table = torch.randint(0, cache.slots, shape, generator=generator_for(seed, "index_table")).to(
            TORCH_DTYPES[idx.dtype]
        )
    initial = _indices(case, init_slots, idx.init_column, table)
    if not direct:
        final = None
    elif table is None and init_slots == final_slots:
        final = initial  # in-place update: vLLM passes one index tensor for both
    else:
        final = _indices(case, final_slots, idx.final_column, table)

    mt = meta.tensors("cpu", METADATA_DTYPE)
    return CaseInputs(
        case=case,
        device=torch.device("cpu"),
        metadata=meta,
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=dt_bias,
        cache_base=cache_base,
        state_cache=state_cache,
        index_table=table,
        initial_state_indices=initial,
        final_state_indices=final,
        has_initial_states=torch.tensor([s.has_state for s in case.sequences], dtype=torch.bool),
        cu_seqlens=mt["cu_seqlens"],
        cu_chunk_seqlens=mt["cu_chunk_seqlens"],
        last_chunk_indices=mt["last_chunk_indices"],
        seq_idx=mt["seq_idx"],
        out=torch.full((T, H, P), math.nan, dtype=io),
    )


def build_inputs(case: Case, device: torch.device | str = "cpu") -> CaseInputs:
    """The case's tensors on ``device``: generated on the CPU from ``case.seed``, then copied with layouts kept."""
    cpu = build_cpu_inputs(case)
    return cpu if torch.device(device).type == "cpu" else cpu.to(device)
