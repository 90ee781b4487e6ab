"""A case that can never run is refused before anything is allocated: inputs whose draws overflow their dtype at
validation, tensors larger than the device's memory at run time (``harness.cases.limits``)."""

from __future__ import annotations

import pytest

from harness.cases.loader import CaseError, load_case_file
from harness.checks import Status, load_provider, run_check

CASE = """\
schema: ssd-case/1
id: too-big
seed: 1
shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
dtype: {io: float16, state: float32}
sequences:
  - {context: 0, tokens: 9, init_slot: 0, has_state: true, final_slot: 1}
cache: {slots: SLOTS}
tiers: {cpu: true}
INPUTS
"""


def _case(tmp_path, slots=2, inputs=""):
    path = tmp_path / "case.yaml"
    path.write_text(CASE.replace("SLOTS", str(slots)).replace("INPUTS", inputs))
    return path


def test_a_cache_larger_than_the_device_is_refused_before_allocating(tmp_path, device, monkeypatch):
    from harness.cases import builder
    from harness.cases.limits import device_memory

    path = _case(tmp_path, slots=600_000_000)  # 600e6 slots x 2 x 4 x 16 float32: 286 GiB, under the schema's limit
    (case,) = load_case_file(path)
    has, what = device_memory(device)
    if has >= 600_000_000 * 2 * 4 * 16 * 4:
        pytest.skip(f"this device holds the case ({what}: {has} bytes)")

    def allocate(*args, **kwargs):
        raise AssertionError("the inputs were being allocated")

    monkeypatch.setattr(builder, "build_inputs", allocate)
    result = run_check(case, "returned_shapes", load_provider("reference:provider"), device=device)
    assert result.status is Status.ERROR, result.message
    assert result.summary.startswith(f"{path}: case too-big: cache.slots: expected tensors that fit this device's "
                                     f"memory ({what}: "), result.summary
    assert "found 286.1 GiB in all; state_cache (" in result.summary and result.summary.endswith(
        "refused before allocating"), result.summary


@pytest.mark.parametrize(("inputs", "key", "found"), [
    ("inputs: {x_scale: 1.0e+300}", "inputs.x_scale", "1e+300"),
    ("inputs: {bc_scale: 10000.0}", "inputs.bc_scale", "10000.0"),  # float16 tops out at 65504
    ("inputs: {state_scale: 1.0e+38}", "inputs.state_scale", "1e+38"),
    ("inputs: {dt_offset: 80, dt_scale: 2}\noptions: {dt_softplus: false}", "inputs.dt_offset", "dt_offset 80"),
])
def test_input_scales_that_overflow_their_dtype_are_refused_at_validation(tmp_path, inputs, key, found):
    path = _case(tmp_path, inputs=inputs)
    with pytest.raises(CaseError) as err:
        load_case_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {key}: expected "), message
    assert f"found {found}" in message, message


def test_scales_within_their_dtype_still_load(tmp_path):
    (case,) = load_case_file(_case(tmp_path, inputs="inputs: {x_scale: 1000, bc_scale: 8000}"))
    assert case.inputs.x_scale == 1000
