"""The kernel tests' own cases use model shapes of the checked-in case files, so that on a GPU they launch binaries
the warmup of cases/ compiles anyway (docs/suite-speed.md): a case file edited away from a shape shows here, not as
a slower cold GPU run."""

from __future__ import annotations

from harness.cases.model import Shape
from tests.support import CHUNK16_SHAPE, case_file_shapes, make_case


def test_the_kernel_tests_default_shapes_are_case_file_shapes():
    shapes = case_file_shapes()
    for shape in (make_case([(0, 20, 1, False, 2)]).shape, Shape(**CHUNK16_SHAPE)):
        assert shape in shapes, (shape, sorted(map(str, shapes)))


def test_a_shape_no_case_file_has_is_told_apart():
    """Negative control: the tests' former default shape (one group for three heads) is in no case file."""
    assert make_case([(0, 20, 1, False, 2)], ngroups=1).shape not in case_file_shapes()
