"""Helpers that more than one test module uses: small kernel-test cases, paged caches and index views, and the CLI
run in this process. Test modules import them from here (``from tests.support import ...``), never from each other.

Imported by test modules only, after the ssd_pytest plugin has configured the backend (tests/conftest.py says why);
every helper that makes tensors takes the device from its caller (the ``device`` fixture).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.backend import interpreter_install_problem
from harness.cases.model import CacheSpec, CallSpec, Case, IndicesSpec, Options, Shape, Tiers

# For tests that start a process on device "cpu" wherever they run (the plugin's machinery, the backend's order): a
# GPU runner's Python may lack what Triton's interpreter needs there (numpy < 2.4), and then configure refuses.
_INTERPRETER_PROBLEM = interpreter_install_problem()
needs_cpu_interpreter = pytest.mark.skipif(
    _INTERPRETER_PROBLEM is not None,
    reason=f"starts a process on device cpu, and this Python cannot run the interpreter: {_INTERPRETER_PROBLEM}")


def unset_for_the_test(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset ``names`` for this test; monkeypatch gives back their values (or their absence) at its end, whatever the
    code under test sets meanwhile (``monkeypatch.delenv`` of a variable that is not set records nothing to undo)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


# ---- kernel-test cases ---------------------------------------------------------------------------------------------

# The case corpus's smallest model shape (one group per head), so that a GPU compiles nothing for these cases that
# the corpus's warmup has not compiled already.
NHEADS, DSTATE, CHUNK, NGROUPS = 3, 16, 64, 3
# The case files' model shape of 16-token chunks (cases/regressions/vllm-0.33-negative-final-slot.yaml; the corpus
# has none), whose binaries the warmup of cases/ compiles: many chunks for few tokens.
CHUNK16_SHAPE = dict(nheads=2, headdim=4, dstate=16, ngroups=1, chunk_size=16)
ALL_OPTIONS = Options(D="per_channel", z=True, dt_bias=True, dt_softplus=True)
CONTIGUOUS_INDICES = IndicesSpec()


def case_file_shapes() -> set[Shape]:
    """The model shapes of the checked-in case files (cases/), whose binaries the warmup of cases/ compiles."""
    from harness.cases.loader import load_cases

    return {case.shape for case in load_cases([Path(__file__).resolve().parents[1] / "cases"])}


def make_case(sequences, *, io="float32", state="float32", headdim=5, options=ALL_OPTIONS, mode="direct",
              slots=8, row_pad=24, offset=7, fill="nan", indices=CONTIGUOUS_INDICES, seed=0, case_id="unit",
              nheads=NHEADS, dstate=DSTATE, chunk_size=CHUNK, ngroups=NGROUPS):
    """A case, small by default (the shape above). ``sequences``: (context, tokens, init_slot, has_state, final_slot)
    tuples. The builder fills every slot with random states, masked-off init slots with NaN and every
    gap (``offset`` elements before slot 0, ``row_pad`` after each row) with ``fill``. Tests call the kernels on it
    directly, on either device, so it belongs to the CPU tier."""
    return Case.create(
        case_id, description="kernel unit test", seed=seed,
        shape=Shape(nheads=nheads, headdim=headdim, dstate=dstate, ngroups=ngroups, chunk_size=chunk_size),
        dtype=(io, state), options=options, sequences=sequences,
        cache=CacheSpec(slots=slots, row_pad=row_pad, offset=offset, fill=fill), indices=indices,
        call=CallSpec(final_state=mode), tiers=Tiers(cpu=True), family="unit",
    )


def direct_launch_cases(device: str, why_not_interpreted: str) -> tuple[Case, Case]:
    """(one sequence, two sequences): the bf16 calls of 16-token chunks that the GPU tests of direct launches and of
    whole-call replays run. Skips where nothing is launched directly: under the interpreter (``why_not_interpreted``)
    and on a Triton the direct path is not verified on."""
    import triton

    from kernels.direct_launch import VERIFIED

    if device != "cuda":
        pytest.skip(why_not_interpreted)
    if VERIFIED != triton.__version__:
        pytest.skip(f"Triton {triton.__version__}: the direct path is verified on {VERIFIED} only")
    one = make_case([(20, 40, 1, True, 2)], io="bfloat16", state="bfloat16", slots=5, **CHUNK16_SHAPE)
    batch = make_case([(20, 40, 1, True, 2), (0, 70, 3, False, 4)], io="bfloat16", state="bfloat16", slots=5,
                      **CHUNK16_SHAPE)
    return one, batch


# ---- paged caches and index views ----------------------------------------------------------------------------------

H, P, N = 3, 5, 16
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def paged_cache(slots, dtype, device, *, heads=H, headdim=P, dstate=N, row_pad=24, offset=7, fill=float("nan"),
                seed=0, blank_slots=()):
    """A (slots, H, P, N) cache view over a larger storage: ``offset`` elements before it, ``row_pad`` sentinel
    elements after every slot row, a sentinel tail. Slots hold finite random values except ``blank_slots`` (left at
    ``fill``). Returns (base, cache): ``base`` owns the storage, ``cache`` is the strided view kernels see."""
    row = heads * headdim * dstate
    stride0 = row + row_pad
    base = torch.full((offset + slots * stride0 + 11,), fill, dtype=dtype)
    cache = base.as_strided((slots, heads, headdim, dstate), (stride0, headdim * dstate, dstate, 1), offset)
    g = torch.Generator().manual_seed(seed)
    for s in range(slots):
        if s not in blank_slots:
            cache[s] = torch.randn(heads, headdim, dstate, generator=g).to(dtype)
    base = base.to(device)  # filled on the CPU (seeded), then the same layout re-viewed on the device
    return base, base.as_strided(cache.shape, cache.stride(), cache.storage_offset())


def index_view(values, dtype, layout, device, *, column=1, columns=5, rows_before=3, junk=-7):
    """``values`` as a (batch,) index tensor: ``contiguous``, or ``block_table``: one column of a
    (rows_before + batch, columns) table (stride = columns; the pointer is 16-byte aligned only for some columns)."""
    if layout == "contiguous":
        return torch.tensor(values, dtype=dtype, device=device)
    assert layout == "block_table", layout
    table = torch.full((rows_before + len(values), columns), junk, dtype=dtype)
    table[rows_before:, column] = torch.tensor(values, dtype=dtype)
    return table.to(device)[rows_before:, column]


# ---- the CLI -------------------------------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie (a killed orphan waits as a zombie until its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def harness(*args: str) -> subprocess.CompletedProcess:
    """``python -m harness ARGS``, run as ``cli.main(args)`` in this process: its exit status and output, shaped like
    a finished process. In-process, because a subprocess per call re-imports torch and re-initialises CUDA
    (seconds each on the GPU tier)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse errors and --help
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["python", "-m", "harness", *args], code, out.getvalue(), err.getvalue())


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def loaded_script(name: str):
    """A module fixture's body for ``scripts/<name>.py``: the script imported as module ``name`` (registered in
    ``sys.modules`` while in use: dataclasses and pickling look their module up there), removed afterwards."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
