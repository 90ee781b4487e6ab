"""Hypothesis search for failing cases (``python -m harness fuzz --budget N --out cases/regressions``).

``cases()`` draws small, valid cases over the ``ssd-case/1`` schema (every combination the loader accepts is
reachable; none it rejects is drawn). ``fuzz`` runs the applicable checks against a provider, lets Hypothesis shrink
the first failure (keeping the check that failed fixed, so the shrunk case shows the same failure) and writes it as a
YAML case (``expect: pass``, ``checks: [<the failing check>]``, ``tiers: {cpu: true}``) through
``harness.cases.loader.dump_case``.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from harness.cases.model import (
    INDEX_DTYPES,
    IO_DTYPES,
    STATE_DTYPES,
    CacheSpec,
    CallSpec,
    Case,
    Dtypes,
    Expect,
    IndicesSpec,
    Options,
    SequenceSpec,
    Shape,
    Tiers,
    default_family,
)
from harness.varlen import build_varlen_metadata

FAMILY = "fuzz"
MAX_SEQUENCES = 3
MAX_TOKENS = 40  # per sequence: the interpreter is slow
# Chunks x heads of a drawn case: every check of it takes seconds at most in the interpreter. Drawn cases run on the
# CPU tier whatever its per-item estimate says (tiers.cpu: true), and so do the regressions written from them.
MAX_CHUNK_HEADS = 12


@st.composite
def cases(draw, max_sequences: int = MAX_SEQUENCES) -> Case:
    """A small valid case (within MAX_CHUNK_HEADS), run on the CPU tier. ``id`` is a placeholder until a failure is
    written."""
    ngroups = draw(st.sampled_from([1, 2]))
    shape = Shape(
        nheads=ngroups * draw(st.integers(1, 2)),
        headdim=draw(st.sampled_from([2, 4, 8])),
        dstate=16,
        ngroups=ngroups,
        chunk_size=draw(st.sampled_from([16, 32, 64])),
    )
    dtype = Dtypes(io=draw(st.sampled_from(IO_DTYPES)), state=draw(st.sampled_from(STATE_DTYPES)))
    options = Options(
        D=draw(st.sampled_from(["none", "per_head", "per_channel"])),
        z=draw(st.booleans()),
        dt_bias=draw(st.booleans()),
        dt_softplus=draw(st.booleans()),
        dt_limit=draw(st.sampled_from([(0.0, math.inf), (0.001, 0.1)])),
    )
    final_state = draw(st.sampled_from(["direct", "returned", "checkpoint"]))
    direct = final_state == "direct"
    lengths = _sequence_lengths(draw, shape, max_sequences)
    batch = len(lengths)
    slots = batch + draw(st.integers(0, 2))
    finals = draw(st.permutations(range(slots)))[:batch] if direct else [None] * batch
    sequences, slot_state = [], {}
    for b, (context, tokens) in enumerate(lengths):
        init = draw(st.integers(0, slots - 1))
        # A slot is either masked (NaN) or stateful for every sequence that reads it.
        has_state = slot_state.setdefault(init, draw(st.booleans()))
        final = finals[b]
        if direct and draw(st.integers(0, 5)) == 0:
            final = -1  # a padded sequence: nothing written
        sequences.append(SequenceSpec(context=context, tokens=tokens, init_slot=init, has_state=has_state,
                                      final_slot=final))
    sequences = tuple(sequences)
    cache = CacheSpec(
        slots=slots, row_pad=draw(st.integers(0, 5)), offset=draw(st.integers(0, 5)),
        fill=draw(st.sampled_from(["nan", 0.5])),
    )
    index_dtype = draw(st.sampled_from(INDEX_DTYPES))
    if draw(st.booleans()):
        columns = draw(st.integers(2, 5))
        init_column, final_column = draw(st.permutations(range(columns)))[:2]
        indices = IndicesSpec(layout="block_table", dtype=index_dtype, columns=columns, init_column=init_column,
                              final_column=final_column if direct else None, rows_before=draw(st.integers(0, 3)))
    else:
        indices = IndicesSpec(layout="contiguous", dtype=index_dtype)
    case = Case.create("fuzz-candidate", shape=shape, dtype=dtype, options=options, sequences=sequences, cache=cache,
                       indices=indices, call=CallSpec(final_state=final_state), tiers=Tiers(cpu=True))
    path = draw(st.sampled_from(["auto", "snapshot", "indexed"] if case.indexed_eligible() else ["auto", "snapshot"]))
    return replace(case, seed=draw(st.integers(0, 2**16)), call=CallSpec(final_state=final_state, path=path))


def _sequence_lengths(draw, shape: Shape, max_sequences: int) -> list[tuple[int, int]]:
    """(context, tokens) per sequence, within MAX_CHUNK_HEADS chunks x heads."""
    budget = MAX_CHUNK_HEADS // shape.nheads  # chunks left for the whole batch
    q = shape.chunk_size
    lengths = []
    for _ in range(draw(st.integers(1, max_sequences))):
        if budget < 1:
            break
        context = draw(st.integers(0, 150))
        room = q - context % q
        fits = room + (budget - 1) * q  # most tokens that stay within the remaining chunks
        tokens = min(draw(st.integers(1, MAX_TOKENS)), fits)
        budget -= len(build_varlen_metadata([context], [tokens], q).seq_idx)
        lengths.append((context, tokens))
    return lengths


@dataclass
class Finding:
    """A shrunk failure written to ``path``."""

    path: Path
    case_id: str
    check: str
    summary: str
    repro: str


@dataclass
class NoFailure:
    """The search ended without a failure, after this many drawn cases and checks that reached a verdict."""

    examples: int
    items: int


class NothingTried(Exception):
    """No drawn case ran a check to a verdict (every check was filtered out, skipped or unsupported): no failure
    found means nothing here."""


class _Search:
    """The predicate Hypothesis minimises: "some check fails", narrowed to the first failing check once seen."""

    def __init__(self, provider, device: str, provider_spec: str, checks: list[str] | None):
        self.provider, self.device, self.spec, self.only = provider, device, provider_spec, checks
        self.target: str | None = None
        self.last_summary = ""
        self.examples = 0
        self.items = 0  # checks run to a verdict (not skipped or unsupported)

    def fails(self, case: Case) -> bool:
        from harness.checks import CheckContext, Status, run_check, selected_checks

        self.examples += 1
        names = [n for n, _ in selected_checks(case) if not self.only or n in self.only]
        if self.target is not None:
            names = [n for n in names if n == self.target]
        ctx = CheckContext(case, self.provider, self.device, self.spec)
        for name in names:
            result = run_check(case, name, self.provider, device=self.device, provider_spec=self.spec, context=ctx)
            self.items += result.status not in (Status.SKIPPED, Status.UNSUPPORTED)
            if result.status.is_failure:
                self.target = name
                self.last_summary = result.summary
                return True
        return False


def _named(case: Case, check: str, provider_spec: str, device: str, summary: str) -> Case:
    body = f"{case.shape}{case.dtype}{case.options}{case.sequences}{case.cache}{case.indices}{case.call}{case.seed}"
    digest = hashlib.sha1(f"{check}|{body}".encode()).hexdigest()[:8]
    case_id = f"{FAMILY}-{check.replace('_', '-')}-{digest}"
    description = (f"found by python -m harness fuzz against {provider_spec} on {device}: {check} failed "
                   f"({summary.strip()[:200]})")
    return replace(case, id=case_id, family=default_family(case_id), description=description, checks=(check,),
                   expect=Expect("pass"))


def write_finding(case: Case, out_dir: Path) -> Path:
    """Write ``case`` as ``<out_dir>/<id>.yaml`` once it loads back to the same case.

    It is written under a name unique to this call first (a case file other runs and collectors skip: not .yaml),
    checked, then renamed into place; nothing is left behind when the check fails."""
    from harness.cases.loader import dump_case, load_case_file

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{case.id}.yaml"
    fd, name = tempfile.mkstemp(prefix=f".{case.id}.", suffix=".yaml.tmp", dir=out_dir)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the case file private to this user
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dump_case(case))
        if load_case_file(tmp) != [case]:  # equality ignores where a case was loaded from
            raise RuntimeError(f"{path}: the written case does not load back to the case that failed")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def fuzz(provider, *, budget: int, out_dir: Path, device: str, provider_spec: str,
         checks: list[str] | None = None, seed: int = 0) -> Finding | NoFailure:
    """Try ``budget`` cases; on a failure shrink it, write it to ``out_dir`` and return the finding. Raises
    ``NothingTried`` when no check reached a verdict."""
    from harness.checks import repro_line

    search = _Search(provider, device, provider_spec, checks)
    config = settings(max_examples=budget, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
    try:
        minimal = find(cases(), search.fails, settings=config, random=random.Random(seed))
    except NoSuchExample:
        if not search.items:
            only = f" (--check {', '.join(checks)})" if checks else ""
            raise NothingTried(f"no check{only} passed or failed on any of {search.examples} drawn cases: each was "
                               "filtered out, skipped or unsupported") from None
        return NoFailure(examples=search.examples, items=search.items)
    check = search.target
    search.fails(minimal)  # the summary of the minimal case itself (Hypothesis tried others after it)
    named = _named(minimal, check, provider_spec, device, search.last_summary)
    path = write_finding(named, Path(out_dir))
    named = replace(named, source=path)
    return Finding(path=path, case_id=named.id, check=check, summary=search.last_summary,
                   repro=repro_line(named, check, provider_spec, device))
