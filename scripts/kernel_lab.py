"""Kernel lab: a stage's shipped Triton kernel against variants rewritten from its own source, on the intermediates of
the bench workloads (``harness.bench.WORKLOADS``), in one process; for chunk scan also vLLM's kernel.

    python scripts/kernel_lab.py compile [--stage S]          # CPU: registers, spills, shared memory per config
    python scripts/kernel_lab.py run [--stage S] [--reps 200]  # GPU: bits against the shipped kernel, stability, us
    python scripts/kernel_lab.py run --dry-run                 # the same plumbing on the CPU (interpreter, small)
    python scripts/kernel_lab.py chain [--variant V]           # GPU: the indexed path's kernels one after another
    ncu ... python scripts/kernel_lab.py profile --stage S     # GPU: each variant launched twice (compile, measure)

A variant is the shipped kernel's source with named parameters made constexprs and/or exact text substitutions
(``VARIANTS``), written into a generated module beside the shipped module's globals, so the lab never carries a copy
of a kernel: what it times is the shipped code with one change. Each (variant, config) is launched directly with
the stage's own ``launch_arguments`` (no autotuner), its output compared bit for bit with the shipped kernel's under
the same config, run three times (a result that moves is a race) and timed by CUDA graph replay
(``harness.cuda_timing``). A variant that wins moves into the kernel, with the run recorded in docs/gpu-runs.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKLOADS = ["short-continuation", "prefill-4256", "continue-600", "mixed-3"]


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """Parameters to make constexprs and (old, new) substitutions, each of which must match exactly once. With
    ``helper``, the substitutions rewrite that ``@triton.jit`` function of the kernel's module instead (the kernel's
    body lives there), and the variant kernel calls the rewritten copy."""

    constexprs: tuple[str, ...] = ()
    substitutions: tuple[tuple[str, str], ...] = ()
    helper: str | None = None


# bmm (its tile's code, ``bmm_tile``): a tile wholly past the chunk's end skips the dstate loop and stores the zeros
# it holds (the same bits).
BMM_DEAD_TILES = ("    for k in range(0, dstate, BLOCK_SIZE_K):",
                  "    live = (pid_m * BLOCK_SIZE_M < chunk_len) & (pid_n * BLOCK_SIZE_N < chunk_len)\n"
                  "    for k in range(0, tl.where(live, dstate, 0), BLOCK_SIZE_K):")

# chunk scan and chunk state: programs taking the tiles in the grid's own order (tiles fastest, then chunks, then
# heads), as both kernels did before their launch orders of docs/gpu-runs.md run 90 (the chunk scan's masked loads of
# before then were measured in runs 90-91 and are not kept: a variant repeating the kernel's load block would only
# restate it)
SCAN_LAUNCH_ORDER = """    launch_order = tl.program_id(axis=2) * tl.num_programs(axis=1) + tl.program_id(axis=1)
    launch_order = launch_order * tl.num_programs(axis=0) + tl.program_id(axis=0)
    pid_h = launch_order % tl.num_programs(axis=2)
    pid_mn = (launch_order // tl.num_programs(axis=2)) % tl.num_programs(axis=0)
    pid_c = launch_order // (tl.num_programs(axis=2) * tl.num_programs(axis=0))
"""
STATE_LAUNCH_ORDER = (
    "        tl.program_id(axis=0), chunk_major // tl.num_programs(axis=2), chunk_major % tl.num_programs(axis=2),\n",
    "        tl.program_id(axis=0), tl.program_id(axis=1), tl.program_id(axis=2),\n")
GRID_ORDER = """    pid_mn = tl.program_id(axis=0)
    pid_c = tl.program_id(axis=1)
    pid_h = tl.program_id(axis=2)
"""

# chunk state (its tile's code, ``chunk_state_tile``): x loaded without the shipped kernel's L2 hint (its former
# form); the gain or loss is the next kernel's, so ``chain`` measures it (the chain's other forms measured and
# dropped: docs/architecture.md, what L2 keeps)
STATE_X_LOAD = """        x = tl.load(x_ptrs, mask=(offs_m[:, None] < hdim) & k_mask[None, :], other=0.0,
                    eviction_policy="evict_first")
"""
STATE_X_NO_HINT = (STATE_X_LOAD,
                   "        x = tl.load(x_ptrs, mask=(offs_m[:, None] < hdim) & k_mask[None, :], other=0.0)\n")

# stage -> variant -> rewrite of the shipped kernel
VARIANTS: dict[str, dict[str, Rewrite]] = {
    "chunk_cumsum": {"cx": Rewrite(("nheads", "chunk_size"))},
    "bmm_chunk": {"cx": Rewrite(("dstate", "chunk_size")), "dead": Rewrite((), (BMM_DEAD_TILES,), "bmm_tile"),
                  "cxdead": Rewrite(("dstate", "chunk_size"), (BMM_DEAD_TILES,), "bmm_tile")},
    "state_passing_indexed": {"cx": Rewrite(("dim", "chunk_size"))},
    "chunk_scan": {"gridorder": Rewrite((), ((SCAN_LAUNCH_ORDER, GRID_ORDER),))},
    "chunk_state": {"gridorder": Rewrite((), (STATE_LAUNCH_ORDER,)),
                    "keepx": Rewrite((), (STATE_X_NO_HINT,), "chunk_state_tile")},
    "gather": {"cx": Rewrite(("row",))},
}
# stage -> (module, the jit kernel's attribute)
KERNELS = {
    "chunk_cumsum": ("kernels.chunk_cumsum", "_chunk_cumsum_kernel"),
    "chunk_state": ("kernels.chunk_state", "_chunk_state_kernel"),
    "bmm_chunk": ("kernels.bmm_chunk", "_bmm_chunk_kernel"),
    "state_passing_indexed": ("kernels.state_passing_indexed", "_state_passing_indexed_kernel"),
    "chunk_scan": ("kernels.chunk_scan", "_chunk_scan_kernel"),
    "gather": ("kernels.gather", "_gather_initial_states_kernel"),
}
# The fixed-block kernels (never tuned): candidate blocks instead of a config list.
FIXED_BLOCK_STAGES = {"state_passing_indexed": (256, 512, 1024, 2048), "gather": (512, 1024, 2048, 4096)}


def rewritten_source(src: str, name: str, new_name: str, rewrite: Rewrite) -> str:
    """``src`` (a kernel's ``def``, decorators stripped) renamed and rewritten; every change must apply once. With
    ``rewrite.helper`` the substitutions are the helper's (``rewritten_helper``), and the kernel's one call of the
    helper calls ``<helper>_<new_name>`` instead."""
    body = src.replace(f"def {name}(", f"def {new_name}(", 1)
    for param in rewrite.constexprs:
        body, n = re.subn(rf"^(\s+){param},", rf"\1{param}: tl.constexpr,", body, count=1, flags=re.MULTILINE)
        if n != 1:
            raise ValueError(f"{name}: no plain parameter {param!r} to make a constexpr")
    if rewrite.helper:
        return substituted(body, name, ((f"{rewrite.helper}(", f"{rewrite.helper}_{new_name}("),))
    return substituted(body, name, rewrite.substitutions)


def rewritten_helper(src: str, new_name: str, rewrite: Rewrite) -> str:
    """``src``, the ``def`` of ``rewrite.helper``, renamed to ``<helper>_<new_name>`` with the substitutions."""
    body = src.replace(f"def {rewrite.helper}(", f"def {rewrite.helper}_{new_name}(", 1)
    return substituted(body, rewrite.helper, rewrite.substitutions)


def substituted(body: str, name: str, substitutions) -> str:
    for old, new in substitutions:
        if body.count(old) != 1:
            raise ValueError(f"{name}: the substitution's text occurs {body.count(old)} times, not once: {old!r}")
        body = body.replace(old, new)
    return body


def jit_def(jit) -> str:
    """A ``@triton.jit`` function's source from its ``def`` (decorators stripped)."""
    src = inspect.getsource(jit.fn)
    return src[re.search(r"^def\s", src, re.MULTILINE).start():]


def load_variants(stages, kernels: dict = KERNELS, variants: dict = VARIANTS) -> dict:
    """stage -> {"shipped": the shipped jit function, variant: its rewritten jit function}, the stages' kernels and
    rewrites named in ``kernels`` and ``variants`` (this lab's by default). Each stage's variants
    live in a generated module (a file, since Triton reads a kernel's source) that holds the shipped module's
    globals, under the shipped kernel's specialization flags."""
    from kernels.specialization import base_jit_function, gpu_view

    folder = Path(tempfile.mkdtemp(prefix="kernel_lab-"))
    sys.path.insert(0, str(folder))
    out = {}
    for stage in stages:
        module, attr = kernels[stage]
        jit = base_jit_function(getattr(importlib.import_module(module), attr))
        src = jit_def(jit)
        view = gpu_view(jit)
        dns = [view.arg_names[i] if isinstance(i, int) else i for i in view.do_not_specialize]
        dnsa = [view.arg_names[i] if isinstance(i, int) else i for i in view.do_not_specialize_on_alignment]
        text = [f'"""Generated by scripts/kernel_lab.py: {stage} variants."""\n', "import importlib\n",
                f"globals().update({{k: v for k, v in vars(importlib.import_module({module!r})).items() "
                "if not k.startswith('__')})\n"]
        for variant, rewrite in variants.get(stage, {}).items():
            if rewrite.helper:
                helper = jit_def(getattr(importlib.import_module(module), rewrite.helper))
                text.append("\n\n@triton.jit\n" + rewritten_helper(helper, f"{stage}_{variant}", rewrite))
            text.append(f"\n\n@triton.jit(do_not_specialize={dns!r}, do_not_specialize_on_alignment={dnsa!r})\n"
                        + rewritten_source(src, attr, f"{stage}_{variant}", rewrite))
        module_name = f"lab_{stage}_{folder.name.replace('-', '_')}"  # unique: each call writes its own sources
        (folder / f"{module_name}.py").write_text("".join(text))
        generated = importlib.import_module(module_name)
        out[stage] = {"shipped": jit, **{v: getattr(generated, f"{stage}_{v}") for v in variants.get(stage, {})}}
    return out


def chosen_variants(names: list[str] | None) -> dict:
    """``VARIANTS`` less the variants not in ``names`` (all of them without ``names``); the shipped kernel always
    runs. A name no stage has is an error, not an empty run."""
    if not names:
        return VARIANTS
    unknown = set(names) - {v for stage in VARIANTS.values() for v in stage}
    if unknown:
        raise SystemExit(f"kernel_lab: no variant named {sorted(unknown)}; the variants: "
                         f"{ {stage: sorted(vs) for stage, vs in VARIANTS.items()} }")
    return {stage: {v: r for v, r in vs.items() if v in names} for stage, vs in VARIANTS.items()}


def launch_options(config) -> dict:
    """A config's launch options (what a launch takes beside its block sizes)."""
    return {"num_warps": config.num_warps, "num_stages": config.num_stages}


def describe(config) -> str:
    from harness.stage_bench import describe as described

    return described(config)


def stage_configs(stage: str, limit: int | None = None, like: list[str] | None = None) -> list:
    """The stage's shipped configs and the stage sweep's candidates (``harness.stage_bench.EXTRA_CANDIDATES``), each
    once, those whose description starts with one of ``like`` when given; the fixed-block kernels (never tuned: the
    indexed state passing, the gather) get candidate blocks."""
    import triton

    from harness.stage_bench import EXTRA_CANDIDATES

    if stage in FIXED_BLOCK_STAGES:
        configs = [triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
                   for bs in FIXED_BLOCK_STAGES[stage] for w in (2, 4, 8)]
    else:
        configs = list(importlib.import_module(KERNELS[stage][0]).CONFIGS) + EXTRA_CANDIDATES.get(stage, [])
    seen, out = set(), []
    for config in configs:
        if like and not describe(config).startswith(tuple(like)):
            continue
        if describe(config) not in seen:
            seen.add(describe(config))
            out.append(config)
    return out[:limit]


def stage_launch(stage: str, kw: dict, ws: dict):
    """(the kernel's arguments less the config's, the grid of a config, the tensors it writes) on a call's
    intermediates (``kw``: the call's keywords, ``ws``: its ``workspace_out``); outputs are fresh buffers except the
    indexed state passing's cache, which it writes in place (idempotently: the workloads' final slots are not their
    initial ones)."""
    import torch
    import triton

    from kernels import bmm_chunk, chunk_cumsum, chunk_scan, chunk_state, gather, state_passing_indexed

    cu = kw["cu_chunk_seqlens"]
    x, B, C = kw["x"], kw["B"], kw["C"]
    _, H, P = x.shape
    _, G, N = B.shape
    dA, dt_out = ws["dA_cumsum"], ws["dt_out"]
    nchunks, Q = dA.shape[1], dA.shape[2]
    if stage == "chunk_cumsum":
        outs = (torch.empty_like(dA), torch.empty_like(dt_out))
        args = chunk_cumsum.launch_arguments(kw["dt"], kw["A"], cu, outs[1], outs[0], dt_bias=kw["dt_bias"],
                                             dt_softplus=kw["dt_softplus"], dt_limit=kw["dt_limit"])
        return args, lambda c: (nchunks, triton.cdiv(H, c.kwargs["BLOCK_SIZE_H"])), outs
    if stage == "chunk_state":
        outs = (torch.empty_like(ws["chunk_states"]),)
        args = chunk_state.launch_arguments(B, x, dt_out, dA, cu, outs[0])
        return args, lambda c: (triton.cdiv(P, c.kwargs["BLOCK_SIZE_M"]) * triton.cdiv(N, c.kwargs["BLOCK_SIZE_N"]),
                                nchunks, H), outs
    if stage == "bmm_chunk":
        outs = (torch.empty(nchunks, G, Q, Q, device=x.device, dtype=torch.float32),)
        args = bmm_chunk.launch_arguments(C, B, cu, outs[0])
        return args, lambda c: (triton.cdiv(Q, c.kwargs["BLOCK_SIZE_M"]) * triton.cdiv(Q, c.kwargs["BLOCK_SIZE_N"]),
                                nchunks, G), outs
    if stage == "chunk_scan":
        outs = (torch.empty_like(kw["out"]),)
        args = chunk_scan.launch_arguments(
            ws["CB"], x, dt_out, dA, C, ws["states"], cu, kw["seq_idx"], out=outs[0], D=kw["D"], z=kw["z"],
            initial_states=ws["initial_states"], states_are_entering=ws["path"] == "indexed")
        return args, lambda c: (triton.cdiv(Q, c.kwargs["BLOCK_SIZE_M"]) * triton.cdiv(P, c.kwargs["BLOCK_SIZE_N"]),
                                nchunks, H), outs
    if stage == "gather":
        batch = kw["initial_state_indices"].shape[0]
        outs = (torch.empty((batch, *kw["state_cache"].shape[1:]), dtype=kw["state_cache"].dtype, device=x.device),)
        args = gather.launch_arguments(kw["state_cache"], kw["initial_state_indices"], kw["has_initial_states"],
                                       outs[0])
        del args["BLOCK_SIZE"], args["num_warps"]  # the candidate's
        return args, lambda c: (triton.cdiv(args["row"], c.kwargs["BLOCK_SIZE"]), batch), outs
    outs = (torch.empty_like(ws["states"]), kw["state_cache"])
    args = state_passing_indexed.launch_arguments(
        ws["chunk_states"], dA, state_cache=kw["state_cache"], init_slot_index=kw["initial_state_indices"][:1],
        has_initial_state=kw["has_initial_states"][:1], final_slot_index=kw["final_state_indices"][:1], out=outs[0])
    del args["BLOCK_SIZE"]
    return args, lambda c: (triton.cdiv(P * N, c.kwargs["BLOCK_SIZE"]), H), outs


def applies(stage: str, path: str) -> bool:
    """The indexed state passing runs on the indexed path only, the gather on the snapshot path only."""
    return {"state_passing_indexed": path == "indexed", "gather": path == "snapshot"}.get(stage, True)


def small_cases() -> dict:
    """Small stand-ins for the workloads (a dry run on the CPU): one sequence crossing chunks, and two."""
    from harness.bench import workload_case
    from harness.cases.model import SequenceSpec, Shape

    small = Shape(nheads=2, headdim=16, dstate=16, ngroups=1, chunk_size=16)
    base = workload_case("short-continuation")
    return {name: dataclasses.replace(base, id=f"lab-{name}", shape=small,
                                      sequences=tuple(SequenceSpec(*s) for s in sequences))
            for name, sequences in (("one", ((16, 40, 3, True, 5),)),
                                    ("two", ((16, 8, 3, True, 6), (0, 20, 4, False, 7))))}


def call_intermediates(case, device: str, path: str) -> tuple[dict, dict]:
    """One real call of ours on ``path``: its keywords and its ``workspace_out``, with the CB it computed and the
    chunk states (the snapshot path's fused kernel keeps them on chip: computed here by the chunk state stage)."""
    from harness.cases.builder import build_inputs
    from kernels import bmm_chunk, chunk_state, provider

    kw = build_inputs(case, device).kwargs(path=path)
    ws: dict = {}
    provider.ssd_prefill(**kw, **({"gather": "fused"} if path == "snapshot" and device == "cuda" else {}),
                         workspace_out=ws)
    ws["CB"] = bmm_chunk.bmm_chunk(kw["C"], kw["B"], kw["chunk_size"], kw["cu_chunk_seqlens"])
    if ws["chunk_states"] is None:
        ws["chunk_states"] = chunk_state.chunk_state(kw["B"], kw["x"], ws["dt_out"], ws["dA_cumsum"],
                                                     kw["cu_chunk_seqlens"])
    return kw, ws


# ---- run: bits, stability, time ---------------------------------------------------------------------------------


def run(stages: list[str], workloads: list[str], reps: int, dry_run: bool, limit: int | None,
        like: list[str] | None = None, variants: list[str] | None = None) -> list[tuple]:
    from harness.bench import workload_case
    from harness.cuda_timing import time_graph

    if dry_run:  # nothing to time on the CPU: each "timing" is one more call
        def time_graph(fn, reps):  # noqa: F811
            fn()
            return 0.0

    device = "cpu" if dry_run else "cuda"
    kernels = load_variants(stages, variants=chosen_variants(variants))
    cases = small_cases() if dry_run else {w: workload_case(w) for w in workloads}
    rows = []
    for workload, case in cases.items():
        for path in ("snapshot", "indexed") if len(case.sequences) == 1 else ("snapshot",):
            kw, ws = call_intermediates(case, device, path)
            tag = f"{workload}/{path}"
            for stage in stages:
                if not applies(stage, path):
                    continue
                args, grid, outs = stage_launch(stage, kw, ws)
                for config in stage_configs(stage, limit, like):
                    shipped = None
                    for name, kernel in kernels[stage].items():
                        def launch(kernel=kernel, config=config, args=args, grid=grid):
                            kernel[grid(config)](**args, **config.kwargs, **launch_options(config))

                        try:
                            # the indexed state passing's second output is the cache it also reads: not poisoned
                            results = three_runs(launch, outs, outs[:1], device)
                            us = time_graph(launch, reps)
                        except Exception as exc:  # out of resources, a compile error: reported, the rest go on
                            rows.append((tag, stage, name, f"{describe(config)} ({type(exc).__name__})", math.nan,
                                         "-", False))
                            continue
                        if name == "shipped":
                            shipped = results[0]
                        rows.append((tag, stage, name, describe(config), us, *verdict(name, results, shipped)))
            if "chunk_scan" in stages and path == "snapshot" and not dry_run:
                rows.extend(time_vllm_scan(tag, kw, ws, reps))
    return rows


# The indexed path's chain of kernels that hand each other the chunk states: what one kernel leaves in L2 (or takes
# from the next one's share of the multiprocessors) shows only when they run one after another.
CHAIN = ("chunk_state", "state_passing_indexed", "chunk_scan")
AUTOTUNED = {"chunk_state": "chunk_state_kernel", "chunk_scan": "chunk_scan_kernel"}


def checked_in_config(stage: str, args: dict):
    """The config the provider runs ``stage`` under for these arguments: its autotuner's pruning (on the H200 the
    checked-in config of ``kernels.tuned_configs``, elsewhere the first left); the indexed state passing's fixed
    block at the launch defaults (four warps, three stages)."""
    import triton

    from kernels import state_passing_indexed
    from kernels.backend import fixed_block

    if stage == "state_passing_indexed":
        return triton.Config({"BLOCK_SIZE": fixed_block(args["dim"], state_passing_indexed.BLOCK_SIZE)},
                             num_warps=4, num_stages=3)
    tuner = getattr(importlib.import_module(KERNELS[stage][0]), AUTOTUNED[stage])
    return tuner.early_config_prune(tuner.configs, args)[0]


def chain(workloads: list[str], reps: int, dry_run: bool, variants: list[str] | None = None) -> list[tuple]:
    """The indexed path's ``CHAIN`` timed as one graph per single-sequence workload at the checked-in configs: the
    shipped kernels, then per variant name the chain with each stage that has a variant of that name running it (the
    others shipped). Each kernel reads what the one before it wrote; the chain's three outputs (chunk states,
    entering states, the scan's output) are compared bit for bit with the shipped chain's, three runs each."""

    from harness.bench import workload_case
    from harness.cuda_timing import time_graph

    device = "cpu" if dry_run else "cuda"
    kernels = load_variants(CHAIN, variants=chosen_variants(variants))
    names = ["shipped", *sorted({v for stage in CHAIN for v in kernels[stage]} - {"shipped"})]
    cases = small_cases() if dry_run else {w: workload_case(w) for w in workloads}
    rows = []
    for workload, case in cases.items():
        if len(case.sequences) != 1:  # the indexed path takes one sequence
            continue
        kw, ws = call_intermediates(case, device, "indexed")
        launches = {stage: stage_launch(stage, kw, ws) for stage in CHAIN}
        chunk_states = launches["chunk_state"][2][0]
        entering = launches["state_passing_indexed"][2][0]
        launches["state_passing_indexed"][0]["states_ptr"] = chunk_states
        launches["chunk_scan"][0]["states_ptr"] = entering
        outs = [chunk_states, entering, launches["chunk_scan"][2][0]]
        configs = {stage: checked_in_config(stage, args) for stage, (args, _, _) in launches.items()}
        label = " | ".join(describe(configs[s]) for s in CHAIN if s in AUTOTUNED)
        shipped = None
        for name in names:
            chosen = {stage: kernels[stage].get(name, kernels[stage]["shipped"]) for stage in CHAIN}

            def launch(chosen=chosen, launches=launches, configs=configs):
                for stage, (args, grid, _) in launches.items():
                    config = configs[stage]
                    chosen[stage][grid(config)](**args, **config.kwargs, **launch_options(config))

            results = three_runs(launch, outs, outs, device)
            us = 0.0 if dry_run else time_graph(launch, reps)
            if name == "shipped":
                shipped = results[0]
            rows.append((f"{workload}/indexed", "chain", name, label, us, *verdict(name, results, shipped)))
    return rows


def three_runs(launch, outs: list, poisoned: list, device: str) -> list[list]:
    """Copies of ``outs`` after each of three runs of ``launch``, ``poisoned`` filled with NaN before each run (an
    output a variant leaves unwritten then differs)."""
    import torch

    results = []
    for _ in range(3):
        for t in poisoned:
            t.fill_(float("nan"))
        launch()
        if device == "cuda":
            torch.cuda.synchronize()
        results.append([t.clone() for t in outs])
    return results


def verdict(name: str, results: list[list], shipped: list | None) -> tuple[str, bool]:
    """A row's "bits=shipped" ("-" for the shipped kernel itself; False when the shipped run failed) and "stable" (the
    three runs gave the same bits; a result that moves is a race)."""
    same = "-" if name == "shipped" else str(shipped is not None and same_bits(results[0], shipped))
    return same, all(same_bits(r, results[0]) for r in results)


def same_bits(a: list, b: list) -> bool:
    """Whether two lists of tensors hold the same bytes, pairwise (the labs' exact comparison)."""
    import torch

    return all(torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
               for x, y in zip(a, b, strict=True))


def time_vllm_scan(tag: str, kw: dict, ws: dict, reps: int) -> list[tuple]:
    """vLLM's chunk scan on the same snapshot intermediates (``peers.vllm_ssd``'s ops): as its autotuner picks, then
    with each of its configs forced (``launch_autotuned`` caches a pick per key: cleared around each)."""
    import torch

    from harness.cuda_timing import time_graph
    from kernels.backend import forced_config

    try:
        import peers.vllm_ssd  # noqa: F401  (puts vLLM's ops modules in sys.modules)
    except ImportError as exc:
        print(f"vLLM's chunk scan not timed: {exc}")
        return []
    scan = sys.modules["vllm.model_executor.layers.mamba.ops.ssd_chunk_scan"]
    helpers = sys.modules["vllm.model_executor.layers.mamba.ops.triton_helpers"]
    out = torch.empty_like(kw["out"])

    def call():
        scan._chunk_scan_fwd(ws["CB"], kw["x"], ws["dt_out"], ws["dA_cumsum"], kw["C"], ws["states"],
                             kw["cu_chunk_seqlens"], out, kw["seq_idx"], D=kw["D"], z=kw["z"],
                             initial_states=ws["initial_states"])

    def measure(label: str) -> tuple:
        call()
        torch.cuda.synchronize()
        return (tag, "chunk_scan", "vllm", label, time_graph(call, reps), "-", bool(torch.isfinite(out.float()).all()))

    helpers._autotuned_configs.clear()
    rows = [measure("as tuned")]
    rows[0] = (*rows[0][:3], f"tuned: {describe(scan._chunk_scan_fwd_kernel.best_config)}", *rows[0][4:])
    for config in list(scan._chunk_scan_fwd_kernel.configs):
        helpers._autotuned_configs.clear()
        with forced_config(scan._chunk_scan_fwd_kernel, config):
            try:
                rows.append(measure(describe(config)))
            except Exception as exc:
                rows.append((tag, "chunk_scan", "vllm", f"{describe(config)} ({type(exc).__name__})", math.nan,
                             "-", False))
    helpers._autotuned_configs.clear()
    return rows


def print_rows(rows: list[tuple]) -> None:
    print(f"{'workload/path':<28} {'stage':<22} {'variant':<10} {'config':<30} {'us':>8} {'bits=shipped':>12} "
          f"{'stable':>6}")
    for tag, stage, name, config, us, same, stable in rows:
        print(f"{tag:<28} {stage:<22} {name:<10} {config:<30} {us:>8.1f} {same:>12} {str(stable):>6}")
    print("== fastest three per workload/path, stage and variant (stable only)")
    groups: dict = {}
    for r in rows:
        groups.setdefault((r[0], r[1], r[2]), []).append(r)
    for (tag, stage, name), rs in groups.items():
        ranked = sorted((r for r in rs if r[6] and not math.isnan(r[4])), key=lambda r: r[4])[:3]
        print(f"{tag:<28} {stage:<22} {name:<10} " + " | ".join(f"{r[3]} {r[4]:.1f}" for r in ranked))


# ---- compile: what the compiler made of each variant, without a GPU -----------------------------------------------


def serving_intermediates(workload: str) -> tuple[dict, dict]:
    """The workload's call keywords (CPU tensors) and stand-in intermediates of the right shapes and dtypes: enough
    for what a compile specializes on (dtypes, alignment, integer classes), nothing is launched."""
    import torch

    from harness.bench import workload_case
    from harness.cases.builder import build_inputs

    case = workload_case(workload)
    kw = build_inputs(case, "cpu").kwargs(path="indexed")
    _, H, P = kw["x"].shape
    _, G, N = kw["B"].shape
    Q, nchunks = kw["chunk_size"], kw["seq_idx"].shape[0]
    f32 = torch.float32
    state = kw["state_cache"].dtype
    ws = {"dA_cumsum": torch.empty(H, nchunks, Q, dtype=f32), "dt_out": torch.empty(H, nchunks, Q, dtype=f32),
          "chunk_states": torch.empty(nchunks, H, P, N, dtype=f32),
          "states": torch.empty(nchunks, H, P, N, dtype=state),
          "initial_states": None, "path": "indexed", "CB": torch.empty(nchunks, G, Q, Q, dtype=f32)}
    return kw, ws


# The H200's multiprocessor (sm_90): registers, shared memory a program may use, warps and programs at most.
SM90_REGISTERS = 65536
SM90_SHARED_MEMORY = 228 * 1024
SM90_WARPS = 64
SM90_PROGRAMS = 32


def programs_per_multiprocessor(registers: int, num_warps: int, shared: int) -> int:
    """How many programs of a kernel fit on one sm_90 multiprocessor at once: registers are allocated per warp in
    units of 256, and each program takes 1 KB of shared memory beside its own (the driver's)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = SM90_REGISTERS // (per_warp * num_warps)
    by_shared = SM90_SHARED_MEMORY // (shared + 1024)
    return min(by_registers, by_shared, SM90_WARPS // num_warps, SM90_PROGRAMS)


def compile_report(stages: list[str], workload: str, limit: int | None, like: list[str] | None = None,
                   variants: list[str] | None = None) -> None:
    """Each (variant, config) compiled for sm_90 in this process (``TRITON_INTERPRET=0``; no driver needed):
    registers, stack (spills), shared memory, the count of wgmma, mma and 16-byte global loads in its SASS, and the
    programs a multiprocessor holds at once (``programs_per_multiprocessor``)."""
    import os

    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["SSD_PDL"] = "0"  # no GPU here to ask whether it has programmatic launch (kernels.backend)
    from harness.guards.gpu_compile import PortableLaunch, compile_launch, portable_value
    from kernels.specialization import kernel_name

    cuobjdump = Path(importlib.import_module("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    kernels = load_variants(stages, variants=chosen_variants(variants))
    kw, ws = serving_intermediates(workload)
    print(f"{'stage':<22} {'variant':<10} {'config':<30} {'regs':>5} {'stack':>6} {'smem':>7} {'wgmma':>6} {'mma':>5} "
          f"{'ldg128':>6} {'ldgsts':>6} {'per_sm':>6}")
    for stage in stages:
        args, _, _ = stage_launch(stage, kw, ws)
        for config in stage_configs(stage, limit, like):
            for name, kernel in kernels[stage].items():
                launch_kw = {k: portable_value(v) for k, v in args.items()}
                launch_kw.update(config.kwargs, **launch_options(config))
                try:
                    compiled = compile_launch(PortableLaunch(kernel_name(kernel), (), launch_kw, name))
                except Exception as exc:  # a config the compiler rejects: reported, the rest go on
                    print(f"{stage:<22} {name:<10} {describe(config):<30} {type(exc).__name__}: {str(exc)[:60]}")
                    continue
                with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
                    fh.write(compiled.asm["cubin"])
                    fh.flush()
                    res = subprocess.run([str(cuobjdump), "-res-usage", fh.name], capture_output=True, text=True)
                    sass = subprocess.run([str(cuobjdump), "-sass", fh.name], capture_output=True, text=True).stdout
                regs = re.search(r"REG:(\d+)", res.stdout)
                stack = re.search(r"STACK:(\d+)", res.stdout)
                per_sm = (programs_per_multiprocessor(int(regs.group(1)), config.num_warps, compiled.metadata.shared)
                          if regs else "?")
                print(f"{stage:<22} {name:<10} {describe(config):<30} {regs.group(1) if regs else '?':>5} "
                      f"{stack.group(1) if stack else '?':>6} {compiled.metadata.shared:>7} {sass.count('HGMMA'):>6} "
                      f"{sass.count('HMMA'):>5} {sass.count('LDG.E.128'):>6} {sass.count('LDGSTS'):>6} {per_sm:>6}")


# ---- profile: one launch of each for ncu -----------------------------------------------------------------------


def profile(stage: str, workload: str, like: list[str] | None = None, variants: list[str] | None = None) -> None:
    """The shipped kernel and each variant under the stage's first config (of those ``like`` selects), launched twice
    each (the first compiles) on the workload's intermediates (snapshot, or indexed for the indexed state passing),
    for ``ncu -k regex:<kernel>``: nothing autotunes under the profiler."""
    import torch

    from harness.bench import workload_case

    kernels = load_variants([stage], variants=chosen_variants(variants))
    path = "snapshot" if applies(stage, "snapshot") else "indexed"
    kw, ws = call_intermediates(workload_case(workload), "cuda", path)
    args, grid, _ = stage_launch(stage, kw, ws)
    config = stage_configs(stage, like=like)[0]
    for name, kernel in kernels[stage].items():
        for _ in range(2):
            kernel[grid(config)](**args, **config.kwargs, **launch_options(config))
        torch.cuda.synchronize()
        print(f"profiled {stage} {name} {describe(config)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("compile", "run", "chain", "profile"))
    parser.add_argument("--stage", action="append", choices=sorted(KERNELS), help="stages (default: every one)")
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="bench workloads (default: all four)")
    parser.add_argument("--reps", type=int, default=200, help="graph replays per timing")
    parser.add_argument("--configs", type=int, default=None, help="at most this many configs per stage")
    parser.add_argument("--like", action="append",
                        help="only the configs whose description starts with this (repeatable), e.g. "
                             "'M=64 N=64 K=32 s1 w4'")
    parser.add_argument("--variant", action="append",
                        help="only these variants beside the shipped kernel (repeatable; default every one)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run mode's plumbing on the CPU under the interpreter, small shapes, nothing timed")
    args = parser.parse_args()
    stages = args.stage or list(KERNELS)
    workloads = args.workload or WORKLOADS
    if args.mode == "compile":
        compile_report(stages, workloads[0] if args.workload else "prefill-4256", args.configs, args.like,
                       args.variant)
    elif args.mode == "profile":
        profile(stages[0], workloads[0] if args.workload else "prefill-4256", args.like, args.variant)
    else:
        if args.dry_run:
            from harness.backend import configure

            configure("cpu")
        if args.mode == "chain":
            print_rows(chain(workloads, args.reps, args.dry_run, args.variant))
        else:
            print_rows(run(stages, workloads, args.reps, args.dry_run, args.configs, args.like, args.variant))


if __name__ == "__main__":
    main()
