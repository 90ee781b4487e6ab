"""The kernel lab (scripts/kernel_lab.py): its variants are the shipped kernels' own source with exactly the named
change, a rewrite that does not apply is refused (a lab that silently timed the shipped kernel twice would report a
variant as no faster), and its run mode's plumbing works end to end under the interpreter."""

from __future__ import annotations

import inspect
import re

import pytest

from tests.support import loaded_script


@pytest.fixture(scope="module")
def lab():
    yield from loaded_script("kernel_lab")


def _def(kernel) -> str:
    src = inspect.getsource(kernel.fn)
    return src[re.search(r"^def\s", src, re.MULTILINE).start():]


def test_each_variant_is_the_shipped_source_with_its_rewrite_only(lab):
    """A variant is the shipped kernel renamed with its parameters made constexprs and its substitutions; where the
    substitutions are a helper's (the tile code the kernel calls), the helper is the shipped one renamed and
    rewritten, and the kernel differs from the shipped one only in calling it."""
    import importlib

    kernels = lab.load_variants(list(lab.KERNELS))
    for stage, variants in lab.VARIANTS.items():
        shipped = _def(kernels[stage]["shipped"])
        module, attr = lab.KERNELS[stage]
        for name, rewrite in variants.items():
            variant = kernels[stage][name]
            got = _def(variant)
            expected = shipped.replace(f"def {attr}(", f"def {stage}_{name}(", 1)
            for param in rewrite.constexprs:
                expected = re.sub(rf"^(\s+){param},", rf"\1{param}: tl.constexpr,", expected, count=1,
                                  flags=re.MULTILINE)
            substitutions = rewrite.substitutions
            if rewrite.helper:
                renamed = f"{rewrite.helper}_{stage}_{name}"
                expected = expected.replace(f"{rewrite.helper}(", f"{renamed}(")
                helper = _def(getattr(importlib.import_module(module), rewrite.helper))
                want_helper = helper.replace(f"def {rewrite.helper}(", f"def {renamed}(", 1)
                for old, new in substitutions:
                    want_helper = want_helper.replace(old, new)
                got_helper = _def(variant.fn.__globals__[renamed])
                assert got_helper == want_helper and got_helper != helper.replace(
                    f"def {rewrite.helper}(", f"def {renamed}(", 1), (stage, name, "helper")
                substitutions = ()
            for old, new in substitutions:
                expected = expected.replace(old, new)
            assert got == expected, (stage, name)
            if not rewrite.helper:
                assert got != shipped.replace(f"def {attr}(", f"def {stage}_{name}(", 1), (
                    f"{stage} {name} changed nothing")


def test_a_rewrite_that_does_not_apply_is_refused(lab):
    src = "def k(\n    a,\n    b,\n):\n    x = a + b\n    x = a + b\n"
    with pytest.raises(ValueError, match="no plain parameter 'c'"):
        lab.rewritten_source(src, "k", "k2", lab.Rewrite(("c",)))
    with pytest.raises(ValueError, match="occurs 2 times"):
        lab.rewritten_source(src, "k", "k2", lab.Rewrite((), (("x = a + b", "x = a * b"),)))
    with pytest.raises(ValueError, match="occurs 0 times"):
        lab.rewritten_source(src, "k", "k2", lab.Rewrite((), (("y", "z"),)))
    assert "b: tl.constexpr," in lab.rewritten_source(src, "k", "k2", lab.Rewrite(("b",)))
    # a helper's rewrite: the kernel must call the helper exactly once, and the substitution must apply to it
    with pytest.raises(ValueError, match=r"k: the substitution's text occurs 0 times, not once: 'tile\('"):
        lab.rewritten_source(src, "k", "k2", lab.Rewrite((), (("y", "z"),), "tile"))
    helper = "def tile(\n    a,\n):\n    y = a\n"
    with pytest.raises(ValueError, match="tile: the substitution's text occurs 0 times"):
        lab.rewritten_helper(helper, "k2", lab.Rewrite((), (("w", "z"),), "tile"))
    assert lab.rewritten_helper(helper, "k2", lab.Rewrite((), (("y = a", "y = -a"),), "tile")) == (
        "def tile_k2(\n    a,\n):\n    y = -a\n")


@pytest.mark.interpreter(reason="the lab's dry run is its plumbing under the interpreter, on CPU tensors")
def test_the_dry_run_compares_every_variant_with_the_shipped_kernel(lab):
    stages = ["bmm_chunk", "state_passing_indexed", "chunk_scan", "gather"]
    rows = lab.run(stages, lab.WORKLOADS, reps=1, dry_run=True, limit=1)
    variants = {(r[1], r[2]) for r in rows}
    assert variants == {(s, v) for s in stages for v in ("shipped", *lab.VARIANTS[s])}, variants
    for tag, stage, name, config, _us, same, stable in rows:
        assert stable, (tag, stage, name, config)
        assert same == ("-" if name == "shipped" else "True"), (tag, stage, name, config, same)


@pytest.mark.interpreter(reason="the lab's dry run is its plumbing under the interpreter, on CPU tensors")
def test_the_chain_runs_each_variant_name_against_the_shipped_chain(lab, monkeypatch):
    """``chain``: one row per single-sequence workload and variant name of the chain's stages, each chain's three
    outputs compared with the shipped chain's; a variant of one stage runs with the other stages shipped."""
    doubled = ("    tl.store(out_ptrs, acc.to(", "    tl.store(out_ptrs, (acc * 2).to(")  # a wrong output, to be caught
    unwritten = ("acc.to(out_ptr.dtype.element_ty), mask=tile_mask)",  # stores nothing: the NaN poison must show
                 "acc.to(out_ptr.dtype.element_ty), mask=tile_mask & (pid_m < 0))")
    monkeypatch.setitem(lab.VARIANTS, "chunk_scan", {**lab.VARIANTS["chunk_scan"],
                                                     "doubled": lab.Rewrite((), (doubled,)),
                                                     "unwritten": lab.Rewrite((), (unwritten,))})
    rows = lab.chain(lab.WORKLOADS, reps=1, dry_run=True, variants=["keepx", "gridorder", "doubled", "unwritten"])
    names = ("shipped", "doubled", "gridorder", "keepx", "unwritten")  # gridorder: chunk state's and the scan's
    assert [(r[0], r[2]) for r in rows] == [("one/indexed", name) for name in names]
    for tag, _stage, name, _config, _us, same, stable in rows:
        assert stable, (tag, name)
        assert same == {"shipped": "-", "doubled": "False", "unwritten": "False"}.get(name, "True"), (tag, name, same)


def test_like_keeps_only_the_configs_it_names(lab):
    """``--like``: each prefix keeps the configs whose description starts with it; one that names none keeps none
    (the lab then times nothing for that stage, rather than everything)."""
    scan = lab.stage_configs("chunk_scan", like=["M=64 N=64 K=32 s1 w4"])
    assert [lab.describe(c) for c in scan] == ["M=64 N=64 K=32 s1 w4"]
    both = lab.stage_configs("chunk_scan", like=["M=64 N=64 K=32 s1 w4", "M=64 N=64 K=64 s1 w4"])
    assert sorted(lab.describe(c) for c in both) == ["M=64 N=64 K=32 s1 w4", "M=64 N=64 K=64 s1 w4"]
    assert lab.stage_configs("chunk_scan", like=["M=999"]) == []
    assert len(lab.stage_configs("chunk_scan")) > len(both)


def test_variant_keeps_only_the_named_variants_and_refuses_an_unknown_name(lab):
    """``--variant``: the named variants of each stage stay (the shipped kernel always runs); a misspelt name is an
    error, not a run that silently times the shipped kernel alone."""
    chosen = lab.chosen_variants(["gridorder"])
    assert chosen["chunk_scan"].keys() == {"gridorder"} and chosen["bmm_chunk"] == {}
    assert lab.chosen_variants(None) is lab.VARIANTS
    with pytest.raises(SystemExit, match=r"no variant named \['gridordr'\]"):
        lab.chosen_variants(["gridordr"])


# The measured optimum at the serving shape on the H200: four programs a multiprocessor for both kernels (five ran
# slower for the chunk scan, docs/gpu-runs.md runs 81, 84 and 90; three slower for chunk state, runs 47 and 81).
SERVING_PROGRAMS_PER_SM = {"chunk_scan": (("sm90", 256, 64, 128), 4), "chunk_state": (("sm90", 64, 128, 256, 1), 4)}


def _compile_rows(lab, stages: list[str], variants: list[str]) -> dict[tuple[str, str], int]:
    """(stage, variant) -> programs a multiprocessor, from the lab's compile report (sm_90, no GPU needed) at each
    stage's checked-in serving config, in a process of its own (the compiler needs TRITON_INTERPRET=0)."""
    import os
    import subprocess
    import sys

    import triton

    from kernels.tuned_configs import TUNED

    cmd = [sys.executable, str(lab.REPO / "scripts" / "kernel_lab.py"), "compile"]
    for stage in stages:
        key, _ = SERVING_PROGRAMS_PER_SM[stage]
        blocks = dict(TUNED[stage][key])
        config = triton.Config({k: v for k, v in blocks.items() if k.startswith("BLOCK")},
                               num_warps=blocks["num_warps"], num_stages=blocks["num_stages"])
        cmd += ["--stage", stage, "--like", lab.describe(config)]
    for variant in variants:
        cmd += ["--variant", variant]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "0"}, cwd=lab.REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in stages and fields[-1].isdigit():
            rows[(fields[0], fields[1])] = int(fields[-1])
    return rows


def test_the_serving_configs_hold_four_programs_a_multiprocessor(lab):
    """Both kernels sit at a register boundary (the chunk scan at 121 of 128 registers, chunk state at 128): an
    edit that crosses it changes their speed by 8-10% (docs/gpu-runs.md) and nothing on the CPU would show it. So
    the CPU tier compiles them for sm_90 and holds the programs a multiprocessor to the measured optimum; a change
    that moves it must be measured on the GPU (kernel lab) and this table updated with the run. The chunk scan's
    grid-order variant (the same code in the grid's own order, 96 registers) reads five: the check tells them apart."""
    rows = _compile_rows(lab, ["chunk_scan", "chunk_state"], ["gridorder"])
    for stage, (_, expected) in SERVING_PROGRAMS_PER_SM.items():
        assert rows[(stage, "shipped")] == expected, (stage, rows)
    assert rows[("chunk_scan", "gridorder")] == 5, rows
