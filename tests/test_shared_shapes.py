"""The kernel tests' own cases use model shapes of the checked-in case files, so that on a GPU they launch binaries
the warmup of cases/ compiles anyway (docs/suite-speed.md): a case file edited away from a shape shows here, not as
a slower cold GPU run."""

from __future__ import annotations

from harness.cases.model import Shape
from tests.support import CHUNK, CHUNK16_SHAPE, DSTATE, NGROUPS, NHEADS, case_file_shapes, make_case


def test_the_kernel_tests_default_shapes_are_case_file_shapes():
    shapes = case_file_shapes()
    default = make_case([(0, 20, 1, False, 2)]).shape
    assert default == Shape(nheads=NHEADS, headdim=5, dstate=DSTATE, ngroups=NGROUPS, chunk_size=CHUNK)
    assert default in shapes, (default, sorted(map(str, shapes)))
    assert Shape(**CHUNK16_SHAPE) in shapes, (CHUNK16_SHAPE, sorted(map(str, shapes)))
