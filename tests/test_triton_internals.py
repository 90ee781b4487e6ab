"""Triton internals in the kernels are version-gated by the one check the harness's gates use too.

``kernels.triton_version`` holds the verified range; ``kernels.triton_internals`` is the one module of kernels/ that
imports Triton beyond its public API, under that check: programmatic launch falls back to plain launches, the
specialization keys refuse with the reason, and the harness's autotuner and launch gates refuse on the same range.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from harness import triton_autotuner, triton_launches
from kernels import triton_version

ROOT = Path(__file__).resolve().parents[1]
# Triton's modules that are not its public API (``triton``, ``triton.language``, ``triton.testing``, ``triton.knobs``
# and the documented extern-math route ``triton.language.extra.libdevice`` are).
INTERNAL = ("triton.runtime", "triton.backends", "triton.compiler", "triton._C", "triton.language.extra.cuda")
GATE = "kernels/triton_internals.py"


def internal_imports(sources: dict[str, str]) -> list[str]:
    """``path:line module`` for each import of a module under ``INTERNAL`` (``from triton.runtime.jit import X``
    as ``triton.runtime.jit.X``, ``from triton import runtime`` as ``triton.runtime``), outside the gate module."""
    found = []
    for path, text in sources.items():
        if path == GATE:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            found += [f"{path}:{node.lineno} {m}" for m in modules
                      if any(m == prefix or m.startswith(prefix + ".") for prefix in INTERNAL)]
    return found


def kernels_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "kernels").glob("*.py"))}


def test_kernels_reach_triton_internals_only_through_the_gate():
    assert internal_imports(kernels_sources()) == [], (
        "import these from kernels.triton_internals (its version gate and fallbacks), not from Triton directly")


def test_the_internal_import_check_sees_each_kind():
    source = ("import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"
              "from triton import knobs\nfrom triton.runtime.jit import MockTensor\n"
              "from triton.language.extra.cuda import gdc_wait\nimport triton.backends.compiler\n")
    assert internal_imports({"kernels/x.py": source, GATE: source}) == [
        "kernels/x.py:5 triton.runtime.jit.MockTensor",
        "kernels/x.py:6 triton.language.extra.cuda.gdc_wait", "kernels/x.py:7 triton.backends.compiler"]


def test_the_harness_gates_ask_the_one_version_check(monkeypatch):
    """The same range decides for the kernels' internals and the harness's: an unverified Triton is refused by both
    harness gates with the shared check's reason, and neither module keeps a range of its own."""
    assert triton_version.version_problem("x") is None  # the Triton this suite runs on is a verified one
    assert not hasattr(triton_autotuner, "VERIFIED") and not hasattr(triton_launches, "VERIFIED")
    assert triton_autotuner.UnsupportedTriton is triton_launches.UnsupportedTriton is triton_version.UnsupportedTriton
    monkeypatch.setattr(triton, "__version__", "3.99.0")
    reason = r"Triton 3\.99\.0: .* verified for Triton 3\.4 \.\. 3\.9; .*widen VERIFIED \(kernels/triton_version\.py\)"
    with pytest.raises(triton_version.UnsupportedTriton, match=reason):
        triton_autotuner.require_supported()
    with pytest.raises(triton_version.UnsupportedTriton, match=reason):
        triton_launches.require_supported()
    assert triton_version.triton_version("3.10.0rc1") == (3, 10) and triton_version.version_problem("x", "3.3.1")


FALLBACK = r"""
import triton, triton.language as tl
triton.__version__ = "3.99.0"  # before the gate is imported: an unverified Triton
from kernels import triton_internals as ti
from kernels.triton_version import UnsupportedTriton
import torch

assert not ti.PDL_AVAILABLE and "widen VERIFIED" in ti.PDL_PROBLEM, ti.PDL_PROBLEM
assert "widen VERIFIED" in ti.CACHE_KEY_PROBLEM, ti.CACHE_KEY_PROBLEM  # keys then left as Triton makes them

@triton.jit
def copy(x_ptr, y_ptr, USE_PDL: tl.constexpr):
    if USE_PDL:
        ti.gdc_wait()
    tl.store(y_ptr + tl.arange(0, 4), tl.load(x_ptr + tl.arange(0, 4)))
    if USE_PDL:
        ti.gdc_launch_dependents()

x, y = torch.arange(4.0), torch.zeros(4)
copy[(1,)](x, y, USE_PDL=False)
assert torch.equal(x, y)
try:  # the stand-in is never a silent no-op: a launch that reached it would skip its wait
    copy[(1,)](x, y, USE_PDL=True)
    raise SystemExit("the stand-in for gdc_wait ran")
except Exception as exc:
    assert "programmatic launch is off on this Triton" in str(exc), exc
from kernels.specialization import base_jit_function
try:
    base_jit_function(copy)
except UnsupportedTriton as exc:
    print("refused:", exc)
"""


def test_an_unverified_triton_runs_the_kernels_without_programmatic_launch_and_refuses_keys():
    """In a fresh process whose Triton claims an unverified version: programmatic launch is off with the reason,
    a kernel written for it runs as a plain launch (its stand-ins refuse to run if reached), and the specialization
    keys are refused with the reason."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", FALLBACK], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("refused: Triton 3.99.0: kernels/triton_internals.py relies on triton.runtime.jit"), \
        run.stdout


# Three jit functions, a constexpr global read by the innermost: the chain Triton keys by hashing order.
TOY_KERNELS = """
import triton
import triton.language as tl

SCALE = tl.constexpr(2.0)


@triton.jit
def leaf(x):
    return x * SCALE


@triton.jit
def middle(x):
    return leaf(x)


@triton.jit
def kernel(p):
    tl.store(p, middle(tl.load(p)))
"""

HASHING_ORDERS = r"""
import importlib.util, json, sys
from kernels import triton_internals as ti

def fresh(name):  # new jit function objects, none hashed yet
    spec = importlib.util.spec_from_file_location(name, sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

callers_first = fresh("a").kernel.cache_key
leaves = fresh("b")
leaves.leaf.cache_key, leaves.middle.cache_key
callees_first = leaves.kernel.cache_key
settled = fresh("c")
settled.kernel.cache_key
ti.settle_cache_keys(vars(settled))
gated = fresh("d")
gated.kernel.cache_key
ti.CACHE_KEY_PROBLEM = "not verified here"
ti.settle_cache_keys(vars(gated))
print(json.dumps({"callers_first": callers_first, "callees_first": callees_first,
                  "settled": settled.kernel.cache_key, "gated": gated.kernel.cache_key,
                  "globals": [name for name, _ in settled.kernel.used_global_vals]}))
"""


def _in_a_compiling_process(script: str, *args: str) -> str:
    """``script``'s output in a fresh process whose ``@triton.jit`` makes real jit functions (TRITON_INTERPRET=0:
    their cache keys are computed without a GPU)."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_triton_keys_a_kernel_by_hashing_order_and_settling_gives_the_callees_first_key(tmp_path):
    """Triton 3.6 adds a called function's constexpr globals to the caller's key before hashing it: a kernel hashed
    first lacks its helpers' globals and gets another key than where the helpers were hashed first (so two pytest
    workers compile one binary under two keys). ``settle_cache_keys`` gives the callees-first key whatever was
    hashed before it; outside the verified Triton range it leaves Triton's key."""
    toy = tmp_path / "toy_kernels.py"
    toy.write_text(TOY_KERNELS)
    keys = json.loads(_in_a_compiling_process(HASHING_ORDERS, str(toy)))
    assert keys["callers_first"] != keys["callees_first"], keys  # what the settling exists for
    assert keys["settled"] == keys["callees_first"] and keys["globals"] == ["SCALE"], keys
    assert keys["gated"] == keys["callers_first"], keys


OUR_KEYS = r"""
import importlib, json, sys
from kernels.triton_internals import JITFunction

names = sys.argv[1].split(",")
modules = [importlib.import_module(f"kernels.{name}") for name in names]
functions = {f"{m.__name__}.{n}": v for m in modules for n, v in vars(m).items() if isinstance(v, JITFunction)}
order = sorted(functions) if sys.argv[2] == "names" else sorted(functions, reverse=True)
print(json.dumps({name: functions[name].cache_key for name in order}))
"""


def test_our_kernels_cache_keys_do_not_depend_on_import_or_hashing_order():
    """Every jit function of kernels/ has one cache key whatever a process imported and hashed first: the fused
    chunk state kernel (its helper's helper reads ``LOG2E``) as much as the rest."""
    modules = ["chunk_state", "chunk_state_bmm", "chunk_cumsum", "chunk_cumsum_gather", "chunk_state_passing",
               "state_passing", "state_passing_batched", "state_passing_indexed", "bmm_chunk", "chunk_scan",
               "gather", "backend"]
    one = json.loads(_in_a_compiling_process(OUR_KEYS, ",".join(modules), "names"))
    other = json.loads(_in_a_compiling_process(OUR_KEYS, ",".join(reversed(modules)), "reversed"))
    assert one == other
    assert "kernels.chunk_state._chunk_state_kernel" in one and len(one) >= 20, sorted(one)
