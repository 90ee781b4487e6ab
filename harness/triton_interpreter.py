"""Triton's interpreter without the work it repeats or throws away: re-patching ``triton.language`` inside a kernel,
listing the language's members for each grid, rebuilding its dtype table for each operation, building each tuple's
type, each block type's shape and name and each tensor's shape, an emulated bfloat16 conversion where a shift gives
its bits, and integer overflow checks that nothing asserts.

Under ``TRITON_INTERPRET=1`` a launch runs ``GridExecutor.__call__``, which patches the ``triton.language`` modules
the kernel's globals name (``tl``, ``tl.core``: every builtin of the module, of ``tl.tensor`` and ``tl.math``,
found with ``inspect.getmembers``, rebound to interpreter semantics) for the whole grid and restores them when the
grid ends. Every call of a ``@triton.jit`` helper from inside the kernel then goes through
``InterpretedFunction.__call__``, which runs ``_patch_lang`` again on each call and drops the scope it returns:
the same modules get the same rebinding (over the one ``interpreter_builder``) once per helper call per program,
and the outer grid's ``restore`` undoes it all at the end. The kernels call their helpers in every program, so
that repeated patching is a large share of an interpreted launch.

``skip_nested_repatching`` replaces ``InterpretedFunction.__call__`` with the same body that skips ``_patch_lang``
where a running grid already patched every ``triton.language`` module the helper's globals name. A helper that
names one the grid did not patch (Triton's own ``tl.zeros`` and ``tl.cdiv`` name ``core`` as well as ``tl``) is
patched at its first call in the grid; the interpreter never restores a helper's patching, so the modules stay
patched for the rest of the grid and later calls skip it too. A jit function called outside any grid is patched
exactly as before. What each operation computes is unchanged: the patched attributes are the same functions over
the same builder.

``remember_builtins`` replaces ``_patch_builtin``, which each grid runs over every language module: it lists the
module's members with ``inspect.getmembers`` and rebinds those that are Triton builtins. The list is kept per module
(or class) with its namespace (the module's dict, the class's MRO's dicts: what ``getmembers`` reads), a few states
each, and reused while the namespace holds the same names bound to the same objects as a kept state, so the same
members are rebound as before; any other state is listed again, and a module whose members can come from elsewhere
(its own ``__getattr__``) is listed every time. A plain value (a function, a partial, a property: what access returns
as it is) that is no builtin is compared as "no builtin", not by identity: the interpreter rebinds names to new such
objects at every patching, and which one a name holds cannot change the listing. The rebinding of each kept listing
is built once per builder too: ``_patch_attr`` builds a lambda over a new ``TritonSemantic`` of the builder for every
member at every grid, and a ``TritonSemantic`` holds nothing but its builder.

``table_np_dtypes`` replaces ``_get_np_dtype``, which builds its dict of 19 dtypes at every call (several per
interpreted operation): the same mapping, built once from the function it replaces.

``lazy_tuple_types`` makes a ``tl.tuple``'s type (a ``tuple_type`` of one ``constexpr_type`` per value, with a name
string joined from their reprs) computed at its first read instead of at construction. Every interpreted tensor
holds its shape as a ``tl.tuple`` and every block type unwraps its shape through a new one, so that type is built
several times per operation and read almost never. A tuple's values are replaced only through ``_setitem``, which
reads the type before it sets the new one, so the type read is the one construction would have built.

``known_block_types`` builds each block type's shape, element count and name once per element type and shape.
Every interpreted operation makes new block types (its result's, each broadcast's and cast's), and each
construction unwraps the shape through a new ``tl.tuple``, checks every dimension, multiplies them out and formats a
name from the shape's and the element type's strings. All three depend only on the dimensions and the element type's
string, so a shape of plain ints (a list or a ``tl.tuple``) seen before takes them from the first construction; each
block type still gets its own element type object and its own shape tuple. Any other shape, and a first one (whose
errors, a 0-d or a non-power-of-two shape, are raised as before and never kept), runs Triton's constructor. The
kept entries are one per element type and shape the kernels use, so they stay few.

``known_tensor_shapes`` does the same for a tensor's element count and the ``tl.constexpr`` dimensions of its shape:
every interpreted operation's result is a new ``tl.tensor``, whose construction iterates its block type's shape
twice and wraps each dimension and the count in a new ``tl.constexpr``. A shape of plain ints seen before takes the
count and the dimension objects from the first construction (a ``tl.constexpr`` is never changed once built: the
language only reads ``value``), in a shape tuple of the tensor's own; the handle, type and dtype are set as
Triton's constructor sets them.

``direct_bf16_conversions`` converts between bfloat16 and float32 by shifting bits where that gives the bits
``_convert_float`` gives. The interpreter stores bfloat16 as uint16 and converts it to and from float32 (every
bfloat16 load the kernels widen, every bfloat16 store they narrow) through ``_convert_float``, a generic emulation
of about thirty numpy passes over the block. On an array with no subnormal it computes a bfloat16's float32 as
its bits shifted up 16 and a float32's bfloat16 as its high 16 bits (the float32 to bfloat16 casts it is called for
truncate; only its round-to-nearest-even mode rounds); on a subnormal its output differs from that, so any array
holding one, any other pair of types, the rounding mode and a 0-d array go to ``_convert_float``. Both give a
C-ordered array of the output type's width.

``skip_dead_overflow_checks`` turns off the interpreter's ``sanitize_overflow`` option (on in ``InterpreterOptions``)
where its ``debug`` option is off, as it is by default. The option makes every int32 add, sub and mul compute the
operation again in int64 and compare it with int32's range on every lane, seven more interpreted operations per
integer operation (about a third of an interpreted SSD call), and then hands the result to ``device_assert``, which
drops it without ``debug``: the checks assert nothing, and the operation's own result is computed apart from them.
With ``debug`` on, the checks assert, and they are left on. This one changes an option's value, not a function.

Each is installed only where the running Triton's function is the body this was written against (the source text
compared, ``KNOWN_CALL``, or its hash); any other Triton keeps its own interpreter untouched (``install`` says why).
``install`` installs all of them."""

from __future__ import annotations

import functools
import hashlib
import inspect
import textwrap
import threading
import types
from typing import Any

KNOWN_CALL = '''
def __call__(self, *args, **kwargs):
    # This is a device function call
    _patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise InterpreterError(repr(e)) from e
'''
# What GridExecutor.__call__ must do for the grid's patching to cover the helpers: patch the kernel's languages
# before running its programs, and restore them only after the last one.
GRID_PATCHES = ("patch_scope = _patch_lang(self.fn)", "self.fn(**args)", "patch_scope.restore()")

# The sha256 of the functions' source text (dedented, stripped) this module replaces, as Triton 3.6.0 has them.
KNOWN_PATCH_BUILTIN = "50b034993150d256"
# What the kept listings' rebinding reproduces: ``_patch_attr``'s lambda, over a ``TritonSemantic`` that holds only
# its builder.
KNOWN_PATCH_ATTR = "357c3d607cf9364e"
KNOWN_SEMANTIC = "f5389d6ca3b8e75d"
KNOWN_NP_DTYPE = "cbce40fb1f530102"
KNOWN_TUPLE_INIT = "4a073518b7c5b4ef"
KNOWN_TYPE_FOR_TUPLE_VALUES = "9a0f4386213d7be2"
KNOWN_BLOCK_TYPE_INIT = "018eb793571aa3bb"
KNOWN_TENSOR_INIT = "9f03659493d56e19"
KNOWN_CONVERT_FLOAT = "c754ddb2f3ca0829"

_grids = threading.local()  # .langs: a stack of the module sets patched by the grids running in this thread
_installed = False
upstream: dict[str, object] = {}  # what was replaced, by name ("GridExecutor", "InterpretedFunction", ...)
_installed_speedups: dict[str, bool] = {}


def _source(fn) -> str:
    return textwrap.dedent(inspect.getsource(fn)).strip()


def _source_hash(fn) -> str:
    return hashlib.sha256(_source(fn).encode()).hexdigest()[:16]


def _langs(fn, interpreter) -> frozenset[int]:
    """The ``triton.language`` modules ``_patch_lang`` would patch for ``fn`` (by id)."""
    tl = interpreter.tl
    return frozenset(id(value) for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (tl, tl.core))


def install_problem() -> str | None:
    """Why ``skip_nested_repatching`` would leave this Triton's interpreter alone; None when it applies."""
    from triton.runtime import interpreter

    call = vars(interpreter.InterpretedFunction).get("__call__")
    grid = vars(getattr(interpreter, "GridExecutor", object)).get("__call__")
    if call is None or grid is None or not hasattr(interpreter, "_patch_lang"):
        return "triton.runtime.interpreter lacks InterpretedFunction.__call__, GridExecutor.__call__ or _patch_lang"
    if _installed:
        return None
    if _source(call) != KNOWN_CALL.strip():
        return "InterpretedFunction.__call__ is not the body this was written against"
    grid_source = _source(grid)
    positions = [grid_source.find(part) for part in GRID_PATCHES]
    if -1 in positions or positions != sorted(positions):
        return "GridExecutor.__call__ does not patch for the whole grid as expected"
    return None


def skip_nested_repatching() -> bool:
    """Install the interpreter's helper call without repeated patching (module docstring); idempotent. Returns
    whether it is installed."""
    global _installed
    if _installed:
        return True
    if install_problem() is not None:
        return False
    from triton.runtime import interpreter

    grid_call = interpreter.GridExecutor.__call__

    def run_grid(self, *args, **kwargs):
        stack = _grids.__dict__.setdefault("langs", [])
        stack.append(_langs(self.fn, interpreter))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            stack.pop()

    def call_helper(self, *args, **kwargs):
        # This is a device function call: patched already where the running grid, or an earlier helper call in it,
        # patched its languages (a helper's patching is never restored while the grid runs).
        stack = getattr(_grids, "langs", None)
        langs = _langs(self.fn, interpreter)
        if not stack or not langs <= stack[-1]:
            interpreter._patch_lang(self.fn)
            if stack:
                stack[-1] = stack[-1] | langs
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    upstream.update(GridExecutor=grid_call, InterpretedFunction=interpreter.InterpretedFunction.__call__)
    interpreter.GridExecutor.__call__ = run_grid
    interpreter.InterpretedFunction.__call__ = call_helper
    _installed = True
    return True


def _replace(owner, attr: str, speedup: str, known_hash: str, make) -> str | None:
    """Replace ``owner.<attr>`` (a function of a module, or a method of a class) by ``make(original)`` where its
    source hashes to ``known_hash``, keeping the original in ``upstream`` (by name: ``attr`` for a module's,
    ``Class.attr`` for a class's); None when installed (now or before), else why not."""
    if _installed_speedups.get(speedup):
        return None
    is_module = inspect.ismodule(owner)
    where = f"{owner.__name__}.{attr}" if is_module else f"{owner.__module__}.{owner.__qualname__}.{attr}"
    original = getattr(owner, attr, None)
    if original is None:
        return f"{where} does not exist"
    if _source_hash(original) != known_hash:
        return f"{where} is not the body this was written against"
    upstream[attr if is_module else f"{owner.__qualname__}.{attr}"] = original
    setattr(owner, attr, make(original))
    _installed_speedups[speedup] = True
    return None


def _replace_function(name: str, known_hash: str, make) -> str | None:
    """``_replace`` for a function of ``triton.runtime.interpreter``."""
    from triton.runtime import interpreter

    return _replace(interpreter, name, name, known_hash, make)


def _namespace(pkg) -> list[dict] | None:
    """The dicts that ``inspect.getmembers(pkg)`` reads for a module or a plain class (its own, or its MRO's), or
    None where members can come from elsewhere (a module's ``__getattr__``/``__dir__``, a metaclass of its own)."""
    if isinstance(pkg, type):
        return None if type(pkg) is not type else [vars(k) for k in pkg.__mro__]
    names = getattr(pkg, "__dict__", None)
    if not inspect.ismodule(pkg) or names is None or "__getattr__" in names or "__dir__" in names:
        return None
    return [names]


# Namespace states kept per module: a few, for modules met in more than one state.
STATES_KEPT = 4
# Values that class or module access returns as they are: which such object a name holds matters to the listing only
# if it is a builtin. Triton's interpreter rebinds names to new ones of these at every patching (lambdas, nested
# functions, partials, properties, ``print``), some never restored (a helper's own patching).
_PLAIN = (types.FunctionType, types.BuiltinFunctionType, functools.partial, property)
_NOT_BUILTIN = object()  # in a kept state: a plain value that is no builtin


def _remembering_patch_builtin(original):
    from triton.runtime import interpreter

    is_builtin = interpreter.tl.core.is_builtin
    # id(module) -> [(the module, its namespace's keys, their values, the builtins as getmembers listed them), ...],
    # the latest first
    listed: dict[int, list[tuple]] = {}

    def patch_builtin(pkg, builder, scope):
        dicts = _namespace(pkg)
        if dicts is None:
            return original(pkg, builder, scope)
        keys = [key for names in dicts for key in names]
        values = [_NOT_BUILTIN if isinstance(value, _PLAIN) and not is_builtin(value) else value
                  for names in dicts for value in names.values()]
        states = listed.setdefault(id(pkg), [])
        for known in states:
            if (known[0] is pkg and known[1] == keys
                    and all(a is b for a, b in zip(known[2], values, strict=True))):
                break
        else:
            builtins = [(name, member) for name, member in inspect.getmembers(pkg) if is_builtin(member)]
            known = (pkg, keys, values, builtins, {})
            states.insert(0, known)
            del states[STATES_KEPT:]
        rebindings = known[4].get(id(builder))
        if rebindings is None or rebindings[0] is not builder:
            rebindings = known[4][id(builder)] = (builder, _rebindings(known[3], builder))
        for name, new_member in rebindings[1]:
            scope.set_attr(pkg, name, new_member)

    return patch_builtin


def _rebindings(builtins: list[tuple[str, Any]], builder) -> list[tuple[str, Any]]:
    """What ``_patch_attr`` binds each builtin's name to: the member called with a ``TritonSemantic`` over
    ``builder`` (which holds nothing else, so one serves every grid) in place of any ``_semantic`` given."""
    from triton.runtime import interpreter

    semantic = interpreter.TritonSemantic(builder)

    def rebound(member):
        def call(*args, member=member, **kwargs):  # Triton's lambda's signature; kwargs is this call's own dict
            kwargs["_semantic"] = semantic
            return member(*args, **kwargs)
        return call

    return [(name, rebound(member)) for name, member in builtins]


def _tabled_np_dtype(original):
    from triton.runtime import interpreter

    tl = interpreter.tl
    scalars = (tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32,
               tl.uint32, tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16, tl.float8e4nv, tl.float8e4b8,
               tl.float8e4b15)
    table = {dtype: original(dtype) for dtype in scalars}
    pointer_dtype = original(tl.pointer_type(tl.int8))
    pointer_type, block_type = tl.pointer_type, tl.block_type

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, pointer_type):
            return pointer_dtype
        if isinstance(tt_dtype, block_type):
            element = tt_dtype.element_ty
            return pointer_dtype if isinstance(element, pointer_type) else table[element]
        return table[tt_dtype]  # a KeyError for any other, as the original's dict lookup

    return get_np_dtype


def _direct_bf16_conversions(original):
    import numpy as np
    from triton.runtime import interpreter

    bf16, fp32, rtne = interpreter.tl.bfloat16, interpreter.tl.float32, interpreter._ir.ROUNDING_MODE.RTNE

    def has_subnormal(bits, exponent, mantissa) -> bool:
        return bool((((bits & exponent) == 0) & ((bits & mantissa) != 0)).any())

    def convert_float(input, input_dtype, output_dtype, rounding_mode):  # noqa: A002 - Triton's signature
        if type(input) is np.ndarray and input.ndim:
            if input_dtype == bf16 and output_dtype == fp32 and input.dtype == np.uint16:
                bits = np.ascontiguousarray(input)
                if not has_subnormal(bits, 0x7F80, 0x7F):
                    return bits.astype(np.uint32) << 16
            elif (input_dtype == fp32 and output_dtype == bf16 and input.dtype == np.float32
                    and not rounding_mode == rtne):
                bits = np.ascontiguousarray(input).view(np.uint32)
                if not has_subnormal(bits, 0x7F800000, 0x7FFFFF):
                    return (bits >> 16).astype(np.uint16)
        return original(input, input_dtype, output_dtype, rounding_mode)

    return convert_float


def remember_builtins() -> str | None:
    """Install the kept member lists (module docstring); None when installed, else why not."""
    from triton.runtime import interpreter

    if not _installed_speedups.get("_patch_builtin"):
        for name, known in (("_patch_attr", KNOWN_PATCH_ATTR), ("TritonSemantic", KNOWN_SEMANTIC)):
            found = getattr(interpreter, name, None)
            if found is None or _source_hash(found) != known:
                return f"triton.runtime.interpreter.{name} is not the one this was written against"
    return _replace_function("_patch_builtin", KNOWN_PATCH_BUILTIN, _remembering_patch_builtin)


def table_np_dtypes() -> str | None:
    """Install the dtype table built once (module docstring); None when installed, else why not."""
    return _replace_function("_get_np_dtype", KNOWN_NP_DTYPE, _tabled_np_dtype)


def direct_bf16_conversions() -> str | None:
    """Install the bfloat16 and float32 conversions by shifts where they give ``_convert_float``'s bits (module
    docstring); None when installed, else why not."""
    return _replace_function("_convert_float", KNOWN_CONVERT_FLOAT, _direct_bf16_conversions)


def lazy_tuple_types() -> str | None:
    """Install the ``tl.tuple`` type computed at its first read (module docstring); None when installed, else why
    not."""
    from triton.language import core

    if _installed_speedups.get("lazy_tuple_types"):
        return None
    for fn, known in ((core.tuple.__init__, KNOWN_TUPLE_INIT),
                      (core._type_for_tuple_values, KNOWN_TYPE_FOR_TUPLE_VALUES)):
        if _source_hash(fn) != known:
            return f"triton.language.core.{fn.__qualname__} is not the one this was written against"
    tuple_type, type_for = core.tuple_type, core._type_for_tuple_values

    def __init__(self, args, type=None):  # noqa: A002 - Triton's signature
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self.type = type
        elif type is not None:  # make_template in ASTFunction.deserialize may pass a list or a tuple
            self.type = tuple_type(type)

    def get_type(self):
        known = self.__dict__.get("_lazy_type")
        if known is None:
            known = self.__dict__["_lazy_type"] = type_for(self.__dict__["values"])
        return known

    def set_type(self, value) -> None:
        self.__dict__["_lazy_type"] = value

    upstream["tuple.__init__"] = core.tuple.__init__
    core.tuple.__init__ = __init__
    core.tuple.type = property(get_type, set_type)
    _installed_speedups["lazy_tuple_types"] = True
    return None


def _built_once(build, key_of, kept_of, reuse):
    """A constructor that runs ``build`` (Triton's) at the first construction of each key and answers the later ones
    from what it built. ``key_of(*args)``: the key, or None where Triton's constructor must run (nothing is kept
    then, so its errors are raised every time); ``kept_of(built)``: what to keep from a first construction;
    ``reuse(self, kept, *args)``: a later object's attributes from it."""
    known: dict = {}  # one entry per key the kernels construct: a few shapes and element types

    def __init__(self, *args, **kwargs):
        key = None if kwargs else key_of(*args)
        if key is None:
            return build(self, *args, **kwargs)
        kept = known.get(key)
        if kept is None:
            build(self, *args)
            known[key] = kept_of(self)
        else:
            reuse(self, kept, *args)
        return None

    return __init__


def known_block_types() -> str | None:
    """Install block types whose shape, element count and name are built once per element type and shape (module
    docstring); None when installed, else why not."""
    from triton.language import core

    lang_tuple = core.tuple

    def key_of(element_ty, shape):
        dims = shape.values if type(shape) is lang_tuple else shape if type(shape) is list else None
        return None if dims is None or not all(type(d) is int for d in dims) else (str(element_ty), *dims)

    def kept_of(built):
        return list(built.shape.values), built.numel, built.name

    def reuse(self, kept, element_ty, shape):
        values, self.numel, self.name = kept
        self.element_ty = element_ty
        self.shape = lang_tuple(values)  # its own list: the constructor copies the values

    return _replace(core.block_type, "__init__", "known_block_types", KNOWN_BLOCK_TYPE_INIT,
                    lambda build: _built_once(build, key_of, kept_of, reuse))


def known_tensor_shapes() -> str | None:
    """Install tensors whose element count and shape dimensions are built once per shape (module docstring); None
    when installed, else why not."""
    from triton.language import core

    lang_tuple = core.tuple

    def key_of(handle, ty):
        if not ty.is_block():
            return ()
        dims = ty.shape
        return tuple(dims.values) if type(dims) is lang_tuple and all(type(d) is int for d in dims.values) else None

    def kept_of(built):
        return built.numel, list(built.shape.values)

    def reuse(self, kept, handle, ty):
        self.handle = handle
        self.numel, elements = kept
        self.type = ty
        self.dtype = ty.scalar
        self.shape = lang_tuple(elements)  # its own list: the constructor copies the values

    return _replace(core.tensor, "__init__", "known_tensor_shapes", KNOWN_TENSOR_INIT,
                    lambda build: _built_once(build, key_of, kept_of, reuse))


def skip_dead_overflow_checks() -> str | None:
    """Turn off the interpreter's integer overflow checks where nothing asserts them (module docstring); None when
    they are off, else why they stay."""
    import dataclasses

    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    fields = {f.name for f in dataclasses.fields(options)} if dataclasses.is_dataclass(options) else set()
    if not {"sanitize_overflow", "debug"} <= fields:
        return ("triton.runtime.interpreter.interpreter_builder has no options dataclass with sanitize_overflow and "
                "debug")
    if options.debug:
        return "the interpreter runs with debug on, where its overflow checks assert"
    if options.sanitize_overflow:
        upstream.setdefault("interpreter_builder.options", options)
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return None


def install() -> dict[str, str | None]:
    """Every speed-up of this module where it applies: name -> None (installed) or why it was left out."""
    return {
        "skip_nested_repatching": None if skip_nested_repatching() else install_problem(),
        "remember_builtins": remember_builtins(),
        "table_np_dtypes": table_np_dtypes(),
        "lazy_tuple_types": lazy_tuple_types(),
        "known_block_types": known_block_types(),
        "known_tensor_shapes": known_tensor_shapes(),
        "direct_bf16_conversions": direct_bf16_conversions(),
        "skip_dead_overflow_checks": skip_dead_overflow_checks(),
    }
