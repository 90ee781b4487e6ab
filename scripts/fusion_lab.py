"""Fusion lab: chunk state + state passing as two kernels (shipped) against the fused kernel
(``kernels.chunk_state_passing``) under candidate tile configs, on the bench workloads' intermediates, one process.

    python scripts/fusion_lab.py [--reps 200] [--workload W ...]   # GPU: bits against the pair, stability, us
    python scripts/fusion_lab.py --dry-run                          # the same plumbing on the CPU (interpreter, small)

For each workload and path (snapshot; indexed where the workload has one sequence) the pair runs as ssd_prefill
launches it (chunk_state's checked-in config, then state_passing or state_passing_indexed) and the fused kernel
runs each candidate config, into fresh outputs (the indexed path writes its final slot, never its initial one, so
repeated launches are idempotent). Each fused launch is compared with the pair bit for bit (workspace and cache),
launched three times (a result that moves is a race) and timed by CUDA graph replay (``harness.cuda_timing``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

WORKLOADS = ["short-continuation", "prefill-4256", "continue-600", "mixed-3"]
# (BLOCK_SIZE_M headdim, BLOCK_SIZE_N dstate, BLOCK_SIZE_K tokens, warps, stages)
CANDIDATES = [(64, 32, 64, 4, 3), (64, 32, 32, 4, 4), (64, 32, 64, 4, 4), (64, 16, 64, 4, 3), (64, 64, 64, 4, 3),
              (64, 64, 32, 4, 4), (64, 64, 64, 8, 3), (64, 128, 32, 8, 3), (32, 64, 64, 4, 3), (64, 32, 128, 4, 2)]


# ---- experiment: the fused kernel with one flat loop over (chunk, token block) ----------------------------------
# The shipped fused kernel nests the token loop inside the chunk loop, so the software pipeline drains and refills at
# every chunk. Here one loop walks every chunk's token blocks (a persistent matmul's shape: the accumulator is
# finished and reset on a chunk's last block), so loads run ahead across chunk boundaries. Same arguments, same
# arithmetic per element.


def flat_kernel():
    import triton
    import triton.language as tl

    from kernels.backend import LOG2E, dot_acc, wait_for_previous_kernel
    from kernels.chunk_state_passing import SCALAR_ONLY, initial_state
    from kernels.state_passing import recurrence_step

    # A jit function reads its module's globals: the names it calls must be there (imported here, after the
    # backend was chosen).
    globals().update(triton=triton, tl=tl, LOG2E=LOG2E, dot_acc=dot_acc, initial_state=initial_state,
                     wait_for_previous_kernel=wait_for_previous_kernel, recurrence_step=recurrence_step)

    @triton.jit(**SCALAR_ONLY)
    def _chunk_state_passing_flat(
        x_ptr, B_ptr, dt_ptr, dA_cs_ptr, cu_chunk_seqlens_ptr, seq_idx_ptr, chunk_states_ptr, out_ptr, init_ptr,
        init_slot_ptr, has_init_ptr, cache_ptr, final_idx_ptr, last_chunk_ptr,
        hdim, dstate, chunk_size, nheads_per_group, nchunks,
        stride_x_token, stride_x_head, stride_x_hdim, stride_B_token, stride_B_group, stride_B_dstate,
        stride_dt_head, stride_dt_chunk, stride_dt_pos, stride_dA_head, stride_dA_chunk, stride_dA_pos,
        stride_seq_idx, stride_chunk_states_chunk, stride_chunk_states_head, stride_out_chunk, stride_out_head,
        stride_init_row, stride_init_head, stride_init_slot, stride_has_init, stride_cache_slot, stride_cache_head,
        stride_final_idx, stride_last_chunk, init_mode, store_entering, write_cache, read_chunk_states,
        DOT_FP32_OPERANDS: tl.constexpr, FP32_DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    ):
        wait_for_previous_kernel(USE_PDL)
        pid_mn = tl.program_id(axis=0)
        pid_h = tl.program_id(axis=1)
        num_pid_n = tl.cdiv(dstate, BLOCK_SIZE_N)
        pid_m = pid_mn // num_pid_n
        pid_n = pid_mn % num_pid_n
        offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        mask = (offs_m[:, None] < hdim) & (offs_n[None, :] < dstate)
        tile = offs_m[:, None] * dstate + offs_n[None, :]
        x_ptr += pid_h * stride_x_head
        B_ptr += (pid_h // nheads_per_group) * stride_B_group
        dt_ptr += pid_h * stride_dt_head
        dA_cs_ptr += pid_h * stride_dA_head
        out_ptr += pid_h * stride_out_head
        init_ptr += pid_h * stride_init_head
        cache_ptr += pid_h * stride_cache_head

        prev_seq = tl.load(seq_idx_ptr)
        entering = initial_state(init_ptr, tile, prev_seq, init_slot_ptr, has_init_ptr, stride_init_row,
                                 stride_init_slot, stride_has_init, init_mode, mask)
        s = entering.to(tl.float32)
        if store_entering:
            tl.store(out_ptr + tile, entering.to(out_ptr.dtype.element_ty), mask=mask)
        blocks = tl.cdiv(chunk_size, BLOCK_SIZE_K)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for it in range(nchunks * blocks):
            c = it // blocks
            k0 = (it - c * blocks) * BLOCK_SIZE_K
            chunk_start = tl.load(cu_chunk_seqlens_ptr + c).to(tl.int64)
            chunk_len = tl.load(cu_chunk_seqlens_ptr + c + 1).to(tl.int64) - chunk_start
            k_mask = offs_k < chunk_len - k0
            tok = chunk_start + k0 + offs_k
            x = tl.load(x_ptr + offs_m[:, None] * stride_x_hdim + tok[None, :] * stride_x_token,
                        mask=(offs_m[:, None] < hdim) & k_mask[None, :], other=0.0)
            b = tl.load(B_ptr + tok[:, None] * stride_B_token + offs_n[None, :] * stride_B_dstate,
                        mask=k_mask[:, None] & (offs_n[None, :] < dstate), other=0.0).to(tl.float32)
            dA_c = dA_cs_ptr + c * stride_dA_chunk
            dA_last = tl.load(dA_c + (chunk_size - 1) * stride_dA_pos)
            dA_k = tl.load(dA_c + (k0 + offs_k) * stride_dA_pos, mask=k_mask, other=0.0)
            dt_k = tl.load(dt_ptr + c * stride_dt_chunk + (k0 + offs_k) * stride_dt_pos, mask=k_mask, other=0.0)
            scale = tl.math.exp2((dA_last - dA_k) * LOG2E) * dt_k
            b = (b * scale[:, None]).to(x_ptr.dtype.element_ty)
            acc = dot_acc(acc, x, b, DOT_FP32_OPERANDS, FP32_DOT_PRECISION)
            if k0 + BLOCK_SIZE_K >= chunk_size:  # the chunk's last block: its state is complete
                seq = tl.load(seq_idx_ptr + c * stride_seq_idx)
                if seq != prev_seq:
                    s = initial_state(init_ptr, tile, seq, init_slot_ptr, has_init_ptr, stride_init_row,
                                      stride_init_slot, stride_has_init, init_mode, mask).to(tl.float32)
                prev_seq = seq
                s = recurrence_step(s, acc, dA_last)
                if store_entering:
                    if c + 1 < nchunks:
                        tl.store(out_ptr + (c + 1) * stride_out_chunk + tile, s.to(out_ptr.dtype.element_ty),
                                 mask=mask)
                else:
                    tl.store(out_ptr + c * stride_out_chunk + tile, s.to(out_ptr.dtype.element_ty), mask=mask)
                if write_cache:
                    if tl.load(last_chunk_ptr + seq.to(tl.int64) * stride_last_chunk) == c:
                        slot = tl.load(final_idx_ptr + seq.to(tl.int64) * stride_final_idx).to(tl.int64)
                        if slot >= 0:
                            tl.store(cache_ptr + slot * stride_cache_slot + tile, s.to(cache_ptr.dtype.element_ty),
                                     mask=mask)
                acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)

    return _chunk_state_passing_flat


def config_of(c: tuple) -> dict:
    m, n, k, w, s = c
    return dict(BLOCK_SIZE_M=m, BLOCK_SIZE_N=n, BLOCK_SIZE_K=k, num_warps=w, num_stages=s)


def describe(c: tuple) -> str:
    m, n, k, w, s = c
    return f"M{m} N{n} K{k} w{w} s{s}"


def launches(kw: dict, ws: dict, path: str):
    """(pair launch, fused launch by config, the tensors each writes): fresh workspace and, on the snapshot path, a
    fresh cache copy per launcher; the indexed path writes the call's cache in place (its final slot only)."""
    import torch
    import triton

    from kernels.chunk_state import chunk_state
    from kernels.chunk_state_passing import chunk_state_passing, launch_arguments
    from kernels.state_passing import state_passing
    from kernels.state_passing_indexed import state_passing_indexed

    x, B, cu, seq_idx = kw["x"], kw["B"], kw["cu_chunk_seqlens"], kw["seq_idx"]
    dA, dt_out = ws["dA_cumsum"], ws["dt_out"]
    pair_out, fused_out = torch.empty_like(ws["states"]), torch.empty_like(ws["states"])
    if path == "indexed":
        pair_cache = fused_cache = kw["state_cache"]
    else:
        pair_cache, fused_cache = kw["state_cache"].clone(), kw["state_cache"].clone()

    def pair():
        states = chunk_state(B, x, dt_out, dA, cu)
        if path == "indexed":
            state_passing_indexed(states, dA, state_cache=pair_cache, init_slot_index=kw["initial_state_indices"][:1],
                                  has_initial_state=kw["has_initial_states"][:1],
                                  final_slot_index=kw["final_state_indices"][:1], out=pair_out)
        else:
            pair_out.copy_(state_passing(states, dA, seq_idx, initial_states=ws["initial_states"],
                                         out_dtype=pair_out.dtype, state_cache=pair_cache,
                                         final_state_indices=kw["final_state_indices"],
                                         last_chunk_indices=kw["last_chunk_indices"]))

    def fused(config: dict, kernel=None):
        """The shipped fused kernel through its launcher, or ``kernel`` (same arguments) launched directly."""
        init = (dict(initial_state_indices=kw["initial_state_indices"][:1],
                     has_initial_states=kw["has_initial_states"][:1]) if path == "indexed"
                else dict(initial_states=ws["initial_states"]))
        common = dict(out=fused_out, state_cache=fused_cache, final_state_indices=kw["final_state_indices"],
                      last_chunk_indices=kw["last_chunk_indices"], config=config, **init)
        if kernel is None:
            chunk_state_passing(B, x, dt_out, dA, cu, seq_idx, **common)
            return
        args = launch_arguments(B, x, dt_out, dA, cu, seq_idx, **common)
        P, N = x.shape[2], B.shape[2]
        kernel[(triton.cdiv(P, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]), x.shape[1])](**args)

    return pair, fused, (pair_out, pair_cache), (fused_out, fused_cache)


def same_bits(a, b) -> bool:
    import torch

    return all(torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
               for x, y in zip(a, b, strict=True))


def run(workloads: list[str], reps: int, dry_run: bool) -> list[tuple]:
    import torch
    from kernel_lab import call_intermediates, small_cases

    from harness.bench import workload_case
    from harness.cuda_timing import time_graph

    if dry_run:
        def time_graph(fn, reps):  # noqa: F811
            fn()
            return 0.0

    device = "cpu" if dry_run else "cuda"
    cases = small_cases() if dry_run else {w: workload_case(w) for w in workloads}
    candidates = [(16, 16, 16, 4, 3), (16, 32, 16, 4, 3)] if dry_run else CANDIDATES
    flat = flat_kernel()
    rows = []
    for workload, case in cases.items():
        for path in ("snapshot", "indexed") if len(case.sequences) == 1 else ("snapshot",):
            kw, ws = call_intermediates(case, device, path)
            pair, fused, pair_outs, fused_outs = launches(kw, ws, path)
            pair()
            expected = [o.clone() for o in pair_outs]
            tag = f"{workload}/{path}"
            rows.append((tag, "pair", "chunk_state + state_passing", time_graph(pair, reps), "-", True))
            for cand in candidates:
                for kind, kernel in (("fused", None), ("flat", flat)):
                    try:
                        results = []
                        for _ in range(3):
                            fused_outs[0].fill_(float("nan"))
                            fused(config_of(cand), kernel)
                            if device == "cuda":
                                torch.cuda.synchronize()
                            results.append([o.clone() for o in fused_outs])
                        us = time_graph(lambda cand=cand, fused=fused, kernel=kernel: fused(config_of(cand), kernel),
                                        reps)
                    except Exception as exc:  # out of resources, a compile error: reported, the rest go on
                        rows.append((tag, kind, f"{describe(cand)} ({type(exc).__name__}: {str(exc)[:40]})",
                                     math.nan, "-", False))
                        continue
                    stable = all(same_bits(r, results[0]) for r in results)
                    rows.append((tag, kind, describe(cand), us, str(same_bits(results[0], expected)), stable))
    return rows


def print_rows(rows: list[tuple]) -> None:
    print(f"{'workload/path':<28} {'kernel':<6} {'config':<30} {'us':>8} {'bits=pair':>9} {'stable':>6}")
    for tag, kind, config, us, same, stable in rows:
        print(f"{tag:<28} {kind:<6} {config:<30} {us:>8.1f} {same:>9} {str(stable):>6}")
    print("== per workload/path: the pair, and the fastest three configs of each fused kernel (stable only)")
    tags = dict.fromkeys(r[0] for r in rows)
    for tag in tags:
        pair = [r for r in rows if r[0] == tag and r[1] == "pair"][0]
        for kind in ("fused", "flat"):
            best = sorted((r for r in rows if r[0] == tag and r[1] == kind and r[5] and not math.isnan(r[3])),
                          key=lambda r: r[3])[:3]
            print(f"{tag:<28} pair {pair[3]:.1f} | {kind}: " + " | ".join(f"{r[2]} {r[3]:.1f} ({r[4]})" for r in best))
    print("== summed over the workloads, per fused kernel and config (the proposal for kernels.chunk_state_passing)")
    sums: dict = {}
    for r in rows:
        if r[1] != "pair" and r[5] and not math.isnan(r[3]):
            sums.setdefault(f"{r[1]} {r[2]}", []).append(r[3])
    full = max((len(v) for v in sums.values()), default=0)
    pair_sum = sum(r[3] for r in rows if r[1] == "pair")
    for config, times in sorted(((c, t) for c, t in sums.items() if len(t) == full), key=lambda ct: sum(ct[1])):
        print(f"{config:<36} {sum(times):8.1f} us (pair {pair_sum:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="bench workloads (default: all four)")
    parser.add_argument("--reps", type=int, default=200, help="graph replays per timing")
    parser.add_argument("--dry-run", action="store_true",
                        help="the plumbing on the CPU under the interpreter, small shapes, nothing timed")
    args = parser.parse_args()
    from harness.backend import configure

    configure("cpu" if args.dry_run else "cuda")
    print_rows(run(args.workload or WORKLOADS, args.reps, args.dry_run))


if __name__ == "__main__":
    main()
