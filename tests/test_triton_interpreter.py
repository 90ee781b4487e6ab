"""The CPU tier's interpreter does not re-patch ``triton.language`` at each helper call inside a kernel
(``harness.triton_interpreter``): installed by ``backend.configure``, one patching per grid where the grid's covers
the helper, a helper naming a language module the grid did not patch patched at its first call in the grid, the
modules restored after the grid, and the bits those of Triton's own interpreter."""

from __future__ import annotations

import importlib
import textwrap
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from harness import triton_interpreter

pytestmark = pytest.mark.interpreter(reason="about Triton's interpreter, which the GPU does not run")

CALLS = 4  # helper calls per program
PROGRAMS = 3


@triton.jit
def _scale(x, k):
    return x * k + 1.0


CORE_HELPER = """
import triton
from triton.language import core


@triton.jit
def _core_scale(x, k):  # names only triton.language.core, which a kernel naming tl alone does not patch
    return core.where(x > 1.0, x * k, x) + 1.0
"""


def _kernel_source(helper: str) -> str:
    return textwrap.dedent(f"""
        import triton
        import triton.language as tl
        from tests.test_triton_interpreter import _scale
        from _interp_core_helper import _core_scale


        @triton.jit
        def kernel(x_ptr, y_ptr):
            offs = tl.program_id(0) * 8 + tl.arange(0, 8)
            x = tl.load(x_ptr + offs)
            for i in tl.static_range({CALLS}):
                x = {helper}(x, 0.5)
            tl.store(y_ptr + offs, x)
    """)


def _launch(tmp_path, monkeypatch, helper: str) -> tuple[torch.Tensor, int]:
    """Launch a kernel whose programs call ``helper`` CALLS times; returns its output and the ``_patch_lang`` calls."""
    from triton.runtime import interpreter

    name = f"_interp_{helper.strip('_')}"
    (tmp_path / "_interp_core_helper.py").write_text(CORE_HELPER)
    (tmp_path / f"{name}.py").write_text(_kernel_source(helper))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    patched = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched.append(fn.__name__) or real(fn))
    x = torch.arange(8.0 * PROGRAMS)
    y = torch.empty_like(x)
    module.kernel[(PROGRAMS,)](x, y)
    return y, len(patched)


def test_the_cpu_tier_installs_it():
    assert triton_interpreter.install_problem() is None and triton_interpreter._installed


def test_a_grid_patches_once_for_helpers_it_covers_and_restores_after(tmp_path, monkeypatch):
    load = tl.load
    y, patched = _launch(tmp_path, monkeypatch, "_scale")
    assert patched == 1, patched  # the grid's: none for the PROGRAMS x CALLS helper calls
    assert tl.load is load and not triton_interpreter._grids.langs  # restored; no grid running
    expected = torch.arange(8.0 * PROGRAMS)
    for _ in range(CALLS):
        expected = expected * 0.5 + 1.0
    assert torch.equal(y, expected)


def test_a_helper_naming_a_module_the_grid_did_not_patch_is_patched_once_per_grid(tmp_path, monkeypatch):
    """The grid patches ``tl`` (all its kernel names); the helper also names ``core``: patched at its first call,
    and in place for the grid's other programs and calls (the interpreter never restores a helper's patching)."""
    y, patched = _launch(tmp_path, monkeypatch, "_core_scale")
    assert patched == 2, patched  # the grid's, then the helper's first call
    expected = torch.arange(8.0 * PROGRAMS)
    for _ in range(CALLS):
        expected = torch.where(expected > 1.0, expected * 0.5, expected) + 1.0
    assert torch.equal(y, expected)


def test_the_bits_are_those_of_tritons_own_interpreter(tmp_path, monkeypatch):
    from triton.runtime import interpreter

    ours, _ = _launch(tmp_path, monkeypatch, "_scale")
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", triton_interpreter.upstream["GridExecutor"])
    monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", triton_interpreter.upstream["InterpretedFunction"])
    monkeypatch.setattr(tl.core.tuple, "__init__", triton_interpreter.upstream["tuple.__init__"])  # types eagerly
    monkeypatch.setattr(tl.core.block_type, "__init__", triton_interpreter.upstream["block_type.__init__"])
    monkeypatch.setattr(tl.core.tensor, "__init__", triton_interpreter.upstream["tensor.__init__"])
    theirs, patched = _launch(tmp_path, monkeypatch, "_scale")
    assert patched == 1 + PROGRAMS * CALLS  # Triton's own: every helper call patches again
    assert torch.equal(ours, theirs)


def test_every_speedup_is_installed_on_the_pinned_triton():
    assert triton_interpreter.install() == {"skip_nested_repatching": None, "remember_builtins": None,
                                            "table_np_dtypes": None, "lazy_tuple_types": None,
                                            "known_block_types": None, "known_tensor_shapes": None,
                                            "direct_bf16_conversions": None, "skip_dead_overflow_checks": None}


@triton.jit
def _int32_square_kernel(x_ptr, y_ptr):
    offs = tl.arange(0, 4)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x * x)


def test_integer_overflow_checks_are_skipped_only_where_nothing_asserts_them(monkeypatch):
    """Without ``debug`` the checks' verdict is dropped: the int32 product wraps, with them or without (as a
    compiled kernel's does). With ``debug`` they assert, and the speed-up leaves them on."""
    import dataclasses

    from triton.runtime import interpreter

    x = torch.tensor([3, -7, 46341, 2**31 - 1], dtype=torch.int32)  # 46341**2 and (2**31 - 1)**2 overflow
    checked = triton_interpreter.upstream["interpreter_builder.options"]
    assert checked.sanitize_overflow and not checked.debug
    assert not interpreter.interpreter_builder.options.sanitize_overflow
    for options in (interpreter.interpreter_builder.options, checked):
        monkeypatch.setattr(interpreter.interpreter_builder, "options", options)
        y = torch.empty_like(x)
        _int32_square_kernel[(1,)](x, y)
        assert torch.equal(y, x * x)  # torch's int32 product wraps too
    monkeypatch.setattr(interpreter.interpreter_builder, "options", dataclasses.replace(checked, debug=True))
    assert triton_interpreter.skip_dead_overflow_checks() == ("the interpreter runs with debug on, where its "
                                                             "overflow checks assert")
    assert interpreter.interpreter_builder.options.sanitize_overflow
    with pytest.raises(Exception, match="int32 overflow detected for operation mul"):
        _int32_square_kernel[(1,)](x, torch.empty_like(x))


def _tuple_values() -> list:
    return [1, 2.5, tl.float32, tl.constexpr(3), tl.core.tensor(None, tl.block_type(tl.float16, [4, 8]))]


def _eager(values, type=None):  # noqa: A002 - Triton's parameter name
    """A ``tl.tuple`` built by Triton's own constructor, which computes its type at once."""
    built = tl.core.tuple.__new__(tl.core.tuple)
    triton_interpreter.upstream["tuple.__init__"](built, values, type)
    return built


def test_a_tuples_type_read_late_is_the_one_its_construction_would_have_built():
    values = _tuple_values()
    lazy, eager = tl.core.tuple(values), _eager(values)
    assert "_lazy_type" not in vars(lazy)  # not built until read
    assert lazy.type == eager.type and str(lazy.type) == str(eager.type) and lazy.type.fields == eager.type.fields
    assert lazy.type is lazy.type  # built once
    named = tl.core.tuple_type([tl.int32, tl.float32], ["a", "b"])
    given = tl.core.tuple([tl.core.tensor(None, tl.int32), tl.core.tensor(None, tl.float32)], named)
    assert given.type is named and given.b is given.values[1]  # a given type is kept, and its fields name values
    assert tl.core.tuple([1, 2], [tl.int32, tl.int32]).type == _eager([1, 2], [tl.int32, tl.int32]).type
    # _setitem replaces a value and sets the type from the new values, unread before or read before.
    for read_first in (False, True):
        lazy, eager = tl.core.tuple(_tuple_values()), _eager(_tuple_values())
        if read_first:
            assert lazy.type == eager.type
        lazy._setitem(1, tl.float64)
        eager._setitem(1, tl.float64)
        assert lazy.type == eager.type and str(lazy.type) == str(eager.type)


def _built_by_triton(element_ty, shape):
    built = tl.core.block_type.__new__(tl.core.block_type)
    triton_interpreter.upstream["block_type.__init__"](built, element_ty, shape)
    return built


@pytest.mark.parametrize("element_ty, shape", [
    (tl.float32, [4, 8]), (tl.float32, [8, 4]), (tl.float16, [4, 8]), (tl.int1, [16]),
    (tl.pointer_type(tl.bfloat16), [2, 16]), (tl.pointer_type(tl.bfloat16, const=True), [2, 16]),
    (tl.float32, "lang tuple"), (tl.float32, [tl.constexpr(4), 8]),
], ids=lambda v: str(v))
def test_a_known_block_type_is_the_one_tritons_constructor_builds(element_ty, shape):
    """The first construction and every later one of the same element type and shape: the same shape, element count
    and name as Triton's constructor gives, the element type passed, and a shape tuple of its own."""
    if shape == "lang tuple":
        shape = tl.core.tuple([4, 8])
    expected = _built_by_triton(element_ty, shape)
    first, again = (tl.core.block_type(element_ty, shape) for _ in range(2))
    for built in (first, again):
        assert built.element_ty is element_ty
        assert list(built.shape.values) == list(expected.shape.values) and type(built.shape) is tl.core.tuple
        assert (built.numel, built.name, str(built)) == (expected.numel, expected.name, str(expected))
        assert built == expected and built.mangle() == expected.mangle()
    assert first.shape is not again.shape
    again.shape._setitem(0, 64)  # a block type's own tuple: changing it leaves the next one as built
    assert list(tl.core.block_type(element_ty, shape).shape.values) == list(expected.shape.values)


@pytest.mark.parametrize("shape, error", [([], TypeError), ([3, 4], ValueError), ([4, 6], ValueError),
                                          ((4, 8), AssertionError)])
def test_a_block_type_triton_refuses_is_refused_every_time(shape, error):
    """Errors come from Triton's constructor and are never kept: the second try raises as the first did."""
    for _ in range(2):
        with pytest.raises(error):
            tl.core.block_type(tl.float32, shape)


def _tensor_by_triton(handle, ty):
    built = tl.core.tensor.__new__(tl.core.tensor)
    triton_interpreter.upstream["tensor.__init__"](built, handle, ty)
    return built


def _described(t) -> tuple:
    """What a tensor's construction sets, by value."""
    return (t.handle, t.type, t.dtype, t.numel.value, [d.value for d in t.shape.values], type(t.shape),
            [type(d) for d in t.shape.values], type(t.numel), sorted(vars(t)))


@pytest.mark.parametrize("ty", [tl.block_type(tl.float32, [4, 8]), tl.block_type(tl.float16, [4, 8]),
                                tl.block_type(tl.pointer_type(tl.int32), [16]), tl.int32, tl.float32],
                         ids=lambda v: str(v))
def test_a_known_tensor_shape_is_the_one_tritons_constructor_builds(ty):
    """The first tensor of a shape and every later one: the same handle, type, dtype, element count, dimensions
    (``tl.constexpr`` in a ``tl.tuple``) and attributes as Triton's constructor gives, in a shape tuple of its own."""
    handle = object()
    expected = _described(_tensor_by_triton(handle, ty))
    first, again = (tl.core.tensor(handle, ty) for _ in range(2))
    assert _described(first) == expected and _described(again) == expected
    assert first.type is ty and first.shape is not again.shape
    if again.shape.values:
        again.shape._setitem(0, tl.constexpr(64))
    assert _described(tl.core.tensor(handle, ty)) == expected  # a tensor's own tuple: the next one is as built


def test_a_tensor_of_a_shape_not_in_plain_ints_is_built_by_triton():
    """A block type whose shape was changed to hold a ``tl.constexpr`` (as no interpreted operation makes) goes
    through Triton's constructor, whatever was kept for its dimensions' values."""
    ty = tl.block_type(tl.float32, [4, 8])
    tl.core.tensor(None, ty)
    ty.shape._setitem(0, tl.constexpr(4))
    built, expected = tl.core.tensor(None, ty), _tensor_by_triton(None, ty)
    assert [type(d) for d in built.shape.values] == [type(d) for d in expected.shape.values]
    assert [str(d) for d in built.shape.values] == [str(d) for d in expected.shape.values]


def test_the_dtype_table_answers_as_the_function_it_replaces():
    from triton.runtime import interpreter

    original = triton_interpreter.upstream["_get_np_dtype"]
    assert interpreter._get_np_dtype is not original
    scalars = [tl.int1, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16,
               tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float8e5, tl.float8e5b16, tl.float8e4nv, tl.float8e4b8,
               tl.float8e4b15]
    kinds = scalars + [tl.pointer_type(tl.float16), tl.block_type(tl.pointer_type(tl.int32), [4])]
    kinds += [tl.block_type(dtype, [2, 8]) for dtype in scalars]
    for dtype in kinds:
        assert interpreter._get_np_dtype(dtype) == original(dtype), dtype
    for unknown in (tl.void, tl.block_type(tl.void, [2])):
        with pytest.raises(KeyError):
            original(unknown)
        with pytest.raises(KeyError):
            interpreter._get_np_dtype(unknown)


def _stable_members(pkg) -> dict:
    """name -> member, for the members that are the same object at each access (a class's bound class methods are
    new objects each time; no builtin is one)."""
    return {name: getattr(pkg, name) for name in dir(pkg) if getattr(pkg, name) is getattr(pkg, name)}


def _rebound(pkg) -> dict:
    """name -> the member rebound, by one call of the installed ``_patch_builtin`` (restored after)."""
    from triton.runtime import interpreter

    scope = interpreter._LangPatchScope()
    before = _stable_members(pkg)
    interpreter._patch_builtin(pkg, interpreter.interpreter_builder, scope)
    changed = {name: before[name] for name in before if getattr(pkg, name) is not before[name]}
    scope.restore()
    assert all(getattr(pkg, name) is before[name] for name in before)
    return changed


def test_kept_member_lists_rebind_what_getmembers_finds_and_follow_every_change():
    """The kept list is the one ``inspect.getmembers`` gives, and is listed again when a member is added, removed
    or replaced (a builtin by a plain function, a plain function by a builtin)."""
    import inspect

    builtin_a, builtin_b = tl.core.builtin(lambda x, _semantic=None: x), tl.core.builtin(lambda x, _semantic=None: x)
    pkg = types.ModuleType("stand_in_language")
    pkg.a, pkg.plain = builtin_a, (lambda x: x)

    def expected():
        return {name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)}

    assert set(_rebound(pkg)) == expected() == {"a"}
    assert set(_rebound(pkg)) == {"a"}  # from the kept list
    pkg.b = builtin_b  # added
    assert set(_rebound(pkg)) == expected() == {"a", "b"}
    pkg.plain = builtin_a  # a plain member replaced by a builtin
    assert set(_rebound(pkg)) == expected() == {"a", "b", "plain"}
    pkg.a = lambda x: x  # a builtin replaced by a plain function
    assert set(_rebound(pkg)) == expected() == {"b", "plain"}
    del pkg.b
    assert set(_rebound(pkg)) == expected() == {"plain"}


def test_the_language_modules_rebind_what_tritons_own_listing_rebinds():
    from triton.runtime import interpreter

    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        ours = set(_rebound(pkg))
        scope = interpreter._LangPatchScope()
        before = _stable_members(pkg)
        triton_interpreter.upstream["_patch_builtin"](pkg, interpreter.interpreter_builder, scope)
        theirs = {name for name in before if getattr(pkg, name) is not before[name]}
        scope.restore()
        assert ours == theirs and ours, pkg


def test_a_module_listed_in_two_states_in_turn_is_listed_once_per_state(monkeypatch):
    """A grid can list ``tl.tensor`` twice in one patching, the second time with the first's rebinding in place: both
    states are kept, so later grids list neither again."""
    import inspect

    pkg = types.ModuleType("stand_in_language")
    first, second = (tl.core.builtin(lambda x, _semantic=None: x) for _ in range(2))
    listings = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda obj, *args: listings.append(obj) or real(obj, *args))
    for _ in range(3):
        for state in (first, second):
            pkg.a = state
            assert set(_rebound(pkg)) == {"a"}
    assert len([p for p in listings if p is pkg]) == 2


def test_a_plain_value_swapped_for_another_is_not_listed_again_but_one_turned_builtin_is(monkeypatch):
    """The interpreter rebinds names to new lambdas at every patching: which plain, non-builtin object a name holds
    cannot change the listing, so it is not listed again; a function whose builtin flag is set since is."""
    import inspect

    pkg = types.ModuleType("stand_in_language")
    pkg.a = tl.core.builtin(lambda x, _semantic=None: x)
    listings = []
    real = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda obj, *args: listings.append(obj) or real(obj, *args))
    for _ in range(3):
        pkg.plain = lambda x: x  # a new object each time
        assert set(_rebound(pkg)) == {"a"}
    assert len([p for p in listings if p is pkg]) == 1
    turned = pkg.plain
    setattr(turned, tl.core.TRITON_BUILTIN, True)
    assert set(_rebound(pkg)) == {"a", "plain"}
    assert len([p for p in listings if p is pkg]) == 2


def test_a_kept_rebinding_calls_the_member_as_tritons_own_does():
    """The rebound name calls the builtin with a TritonSemantic over the patching's builder in place of any
    ``_semantic`` given, as ``_patch_attr``'s lambda does; one built once serves later grids."""
    from triton.runtime import interpreter

    pkg = types.ModuleType("stand_in_language")
    pkg.a = tl.core.builtin(lambda x, _semantic=None: (x, _semantic))
    results = []
    theirs, ours = triton_interpreter.upstream["_patch_builtin"], interpreter._patch_builtin
    for patch in (theirs, ours, ours):
        scope = interpreter._LangPatchScope()
        patch(pkg, interpreter.interpreter_builder, scope)
        value, semantic = pkg.a(2, _semantic="dropped")
        scope.restore()
        results.append((value, type(semantic), semantic.builder))
    assert results == [(2, interpreter.TritonSemantic, interpreter.interpreter_builder)] * 3


def _spied_conversion():
    """The installed conversion over a spy of ``_convert_float``: returns it and the list of the spy's calls."""
    original = triton_interpreter.upstream["_convert_float"]
    calls = []

    def spy(*args):
        calls.append(args[1:])
        return original(*args)

    return triton_interpreter._direct_bf16_conversions(spy), calls


def _same_output(ours, theirs) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and ours.flags.c_contiguous
    assert np.array_equal(ours, theirs)


def _bf16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint32).astype(np.uint16)


def _fp32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_every_bfloat16_widens_to_the_bits_convert_float_gives():
    """Every bfloat16 bit pattern: those without a subnormal by the shift, each subnormal (whose emulated output is
    not the shift's) through ``_convert_float``, in an array with normal values, as the kernels' blocks hold them."""
    convert, calls = _spied_conversion()
    original = triton_interpreter.upstream["_convert_float"]
    bits = _bf16_bits(np.arange(1 << 16))
    subnormal = ((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)
    plain = bits[~subnormal].reshape(-1, 2)
    _same_output(convert(plain, tl.bfloat16, tl.float32, None), original(plain, tl.bfloat16, tl.float32, None))
    assert calls == []
    for value in bits[subnormal]:
        block = _bf16_bits([0x3F80, value, 0xFF80])
        _same_output(convert(block, tl.bfloat16, tl.float32, None), original(block, tl.bfloat16, tl.float32, None))
    assert len(calls) == int(subnormal.sum())


def _fp32_patterns() -> np.ndarray:
    """Every float32 high half with the low halves where truncation and rounding part (at and around the half)."""
    high = np.arange(1 << 16, dtype=np.uint64) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xC0DE, 0xFFFF], dtype=np.uint64)
    return (high[:, None] | lows[None, :]).reshape(-1)


@pytest.mark.parametrize("rounding", ["default", "rtz"])
def test_every_float32_exponent_narrows_to_the_bits_convert_float_gives(rounding):
    """Normal values, zeros, Inf and NaN (a NaN whose payload is in its low half comes out Inf in both) by the high
    half; each subnormal (whose emulated output is not the high half) through ``_convert_float``; the cast's
    truncating modes both."""
    from triton.runtime import interpreter

    mode = None if rounding == "default" else interpreter._ir.ROUNDING_MODE.RTZ
    convert, calls = _spied_conversion()
    original = triton_interpreter.upstream["_convert_float"]
    bits = _fp32_patterns()
    special = ((bits & 0x7F800000) == 0) & ((bits & 0x7FFFFF) != 0)
    plain = _fp32(bits[~special]).reshape(-1, 2)
    _same_output(convert(plain, tl.float32, tl.bfloat16, mode), original(plain, tl.float32, tl.bfloat16, mode))
    assert calls == []
    odd = bits[special]
    for value in odd[:: max(1, len(odd) // 4000)]:
        block = _fp32([0x3F800000, value, 0])
        _same_output(convert(block, tl.float32, tl.bfloat16, mode), original(block, tl.float32, tl.bfloat16, mode))
    assert calls and all(call[2] is mode for call in calls)


def test_the_other_conversions_are_convert_floats_own():
    """Round-to-nearest-even, another pair of types, a 0-d array, an array of another width, and a strided array
    (converted, C-ordered as ``_convert_float`` gives it)."""
    from triton.runtime import interpreter

    convert, calls = _spied_conversion()
    original = triton_interpreter.upstream["_convert_float"]
    rtne = interpreter._ir.ROUNDING_MODE.RTNE
    x = _fp32([0x3F808000, 0x3F818000, 0xBF80C000, 0x40490FDB])
    cases = [(x, tl.float32, tl.bfloat16, rtne), (x.astype(np.float16), tl.float16, tl.float8e5, None),
             (np.array(x[0]), tl.float32, tl.bfloat16, None)]
    for args in cases:
        _same_output(convert(*args), original(*args))
    assert len(calls) == len(cases)
    halves = x.view(np.uint16)  # not float32's width: the emulation's own error
    for conversion in (convert, original):
        with pytest.raises(ValueError, match="reshape"):
            conversion(halves, tl.float32, tl.bfloat16, None)
    assert len(calls) == len(cases) + 1
    strided = np.tile(x, (4, 1)).T  # a transposed block, as tl.trans leaves it
    _same_output(convert(strided, tl.float32, tl.bfloat16, None), original(strided, tl.float32, tl.bfloat16, None))
    assert len(calls) == len(cases) + 1


@triton.jit
def _bf16_round_trip_kernel(x_ptr, y_ptr):
    offs = tl.arange(0, 16)
    x = tl.load(x_ptr + offs).to(tl.float32)
    tl.store(y_ptr + offs, (x * 3.0 + 0.1).to(tl.bfloat16))


def test_a_bfloat16_kernel_has_the_bits_of_tritons_own_conversion(monkeypatch):
    from triton.runtime import interpreter

    x = torch.randn(16).to(torch.bfloat16)
    x[:3] = torch.tensor([0.0, -0.0, 1e-40]).to(torch.bfloat16)  # zeros, and a subnormal that goes to the emulation
    ours = torch.empty_like(x)
    _bf16_round_trip_kernel[(1,)](x, ours)
    monkeypatch.setattr(interpreter, "_convert_float", triton_interpreter.upstream["_convert_float"])
    theirs = torch.empty_like(x)
    _bf16_round_trip_kernel[(1,)](x, theirs)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


def test_a_speedup_replaces_only_the_body_it_was_written_against(tmp_path, monkeypatch):
    """The gate every speed-up installs through: a function or method whose source is not the known one is left as
    it is, with the reason; the known one is replaced once, its original kept in ``upstream`` by name."""
    monkeypatch.setattr(triton_interpreter, "upstream", {})
    monkeypatch.setattr(triton_interpreter, "_installed_speedups", {})
    (tmp_path / "stand_in_interpreter.py").write_text(textwrap.dedent("""
        def convert(x):
            return x


        class Kind:
            def __init__(self, x):
                self.x = x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("stand_in_interpreter")
    original_convert, original_init = module.convert, module.Kind.__init__
    known = triton_interpreter._source_hash(module.convert), triton_interpreter._source_hash(module.Kind.__init__)
    faster = lambda original: lambda *args: ("faster", original(*args))  # noqa: E731
    for owner, attr, where in ((module, "convert", "stand_in_interpreter.convert"),
                               (module.Kind, "__init__", "stand_in_interpreter.Kind.__init__")):
        assert triton_interpreter._replace(owner, attr, f"{attr}-x", "0" * 16, faster) == (
            f"{where} is not the body this was written against")
    assert triton_interpreter._replace(module, "absent", "absent-x", known[0], faster) == (
        "stand_in_interpreter.absent does not exist")
    assert module.convert is original_convert and module.Kind.__init__ is original_init
    assert triton_interpreter.upstream == {} and triton_interpreter._installed_speedups == {}

    assert triton_interpreter._replace(module, "convert", "convert-x", known[0], faster) is None
    assert triton_interpreter._replace(module.Kind, "__init__", "init-x", known[1], faster) is None
    assert module.convert(3) == ("faster", 3)
    assert triton_interpreter.upstream == {"convert": original_convert, "Kind.__init__": original_init}
    replaced = module.convert
    assert triton_interpreter._replace(module, "convert", "convert-x", known[0], faster) is None  # once only
    assert module.convert is replaced
