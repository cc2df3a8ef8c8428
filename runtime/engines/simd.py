"""32-byte SIMD vectors in numba kernels: 8 float32 or 4 float64 lanes held in one register.

numba has no vector type, and LLVM does not turn a register-blocked loop nest written with scalars
into one: the accumulators stay scalar (a direct convolution written so ran 6 GFLOP/s). These
intrinsics let a generated kernel say what it keeps in registers, as oneDNN's and BLAS's kernels
do: `load` a row of lanes, `splat` one element to every lane, `fma` into an accumulator, `store`
the accumulator once. On a machine without 256-bit registers LLVM splits each vector in two.

Indices are flat element offsets into the array's data, with no wraparound and no bounds check:
the kernel that uses them must keep every lane in bounds (see `runtime/engines/direct_conv.py`).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

VECTOR_BYTES = 32


def lanes(itemsize: int) -> int:
    return VECTOR_BYTES // itemsize


class Vector(types.Type):
    def __init__(self, dtype: types.Float):
        self.dtype = dtype
        self.lanes = lanes(dtype.bitwidth // 8)
        super().__init__(name=f"{dtype}x{self.lanes}")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(element, fe_type.lanes))


def _vector_of(arr) -> Vector | None:
    if isinstance(arr, types.Array) and arr.dtype in (types.float32, types.float64):
        return Vector(arr.dtype)
    return None


def _pointer(context, builder, sig, args, to):
    """A pointer of type `to` at element args[1] of the array args[0]."""
    data = context.make_array(sig.args[0])(context, builder, args[0]).data
    idx = context.cast(builder, args[1], sig.args[1], types.intp)
    return builder.bitcast(builder.gep(data, [idx]), to.as_pointer())


def _llvm(context, vec: Vector) -> ir.VectorType:
    return context.get_value_type(vec)


def _splat(builder, value, vtype: ir.VectorType):
    v = builder.insert_element(vtype(ir.Undefined), value, ir.IntType(32)(0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vtype.count), [0] * vtype.count)
    return builder.shuffle_vector(v, v, zeros)


def _intrinsic_name(name: str, vtype: ir.VectorType) -> str:
    return f"llvm.{name}.v{vtype.count}f{'32' if isinstance(vtype.element, ir.FloatType) else '64'}"


@intrinsic
def load(typingctx, arr, idx):
    """arr's elements [idx, idx + lanes) (unaligned)."""
    vec = _vector_of(arr)
    if vec is None or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        at = _pointer(context, builder, sig, args, _llvm(context, vec))
        return builder.load(at, align=vec.dtype.bitwidth // 8)
    return vec(arr, idx), codegen


@intrinsic
def store(typingctx, arr, idx, v):
    """arr[idx:idx + lanes] = v."""
    vec = _vector_of(arr)
    if vec is None or v != vec or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        at = _pointer(context, builder, sig, args, _llvm(context, vec))
        builder.store(args[2], at, align=vec.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def splat(typingctx, arr, idx):
    """arr[idx] in every lane."""
    vec = _vector_of(arr)
    if vec is None or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        vtype = _llvm(context, vec)
        return _splat(builder, builder.load(_pointer(context, builder, sig, args, vtype.element)), vtype)
    return vec(arr, idx), codegen


@intrinsic
def zero(typingctx, arr):
    """A vector of zeros of arr's element type."""
    vec = _vector_of(arr)
    if vec is None:
        return None

    def codegen(context, builder, sig, args):
        vtype = _llvm(context, vec)
        return ir.Constant(vtype, [vtype.element(0)] * vtype.count)
    return vec(arr), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c, each lane rounded once."""
    if not (isinstance(a, Vector) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        vtype = _llvm(context, a)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vtype, [vtype] * 3),
                                            _intrinsic_name("fma", vtype))
        return builder.call(fn, list(args))
    return a(a, b, c), codegen


@intrinsic
def add(typingctx, a, b):
    if not (isinstance(a, Vector) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(*args)
    return a(a, b), codegen


@intrinsic
def keep_from(typingctx, v, first):
    """v's lanes from `first` on, zeros below it (a select: no 0 * inf)."""
    if not (isinstance(v, Vector) and isinstance(first, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        vtype = _llvm(context, v)
        index = ir.VectorType(ir.IntType(64), vtype.count)
        first = _splat(builder, context.cast(builder, args[1], sig.args[1], types.int64), index)
        keep = builder.icmp_signed(">=", ir.Constant(index, list(range(vtype.count))), first)
        return builder.select(keep, args[0], ir.Constant(vtype, [vtype.element(0)] * vtype.count))
    return v(v, first), codegen


@intrinsic
def total(typingctx, v):
    """The sum of v's lanes, in any order."""
    if not isinstance(v, Vector):
        return None

    def codegen(context, builder, sig, args):
        vtype = _llvm(context, v)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vtype.element, [vtype.element, vtype]),
            _intrinsic_name("vector.reduce.fadd", vtype))
        return builder.call(fn, [vtype.element(0), args[0]], fastmath=("reassoc",))
    return v.dtype(v), codegen
