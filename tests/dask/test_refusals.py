"""Programs that cannot be chunked along an axis raise ShapeError, saying why and which axes can."""
import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import halide_ad as hd  # noqa: E402
import halide_ad.dask as hdd  # noqa: E402
from tests.dask import programs as P  # noqa: E402


def _rows(x):
    """Chunked along axis 0 only."""
    return da.from_array(x, chunks=(4, x.shape[1]))


@pytest.mark.parametrize("fn, why", [
    (P.flipped, r"reads x at `.*` along it, which is not s \* i \+ c with s >= 1"),
    (P.transposed, r"which moves the axis to f's index j \(a transpose\)"),
    (P.column_sums, r"a reduction over the axis"),
    (P.ramp, r"uses its index i as a value"),
    (P.upsampled, r"which is not s \* i \+ c with s >= 1"),
])
def test_an_axis_that_cannot_be_chunked(fn, why, rng):
    x = rng.standard_normal((8, 8))
    with pytest.raises(hd.ShapeError, match=r"cannot be chunked along axis 0: .*" + why) as e:
        hdd.function(fn)(_rows(x))
    able = "along no axis" if fn is P.transposed else "along axes (1,); give the other axes one chunk"
    assert f"It can be chunked {able}" in str(e.value)


def test_a_data_dependent_read_along_a_chunked_axis(rng):
    x, idx = rng.standard_normal((8, 6)), rng.integers(0, 8, (8, 6))
    with pytest.raises(hd.ShapeError, match=r"axis 0: .* an index that depends on data"):
        hdd.function(P.gathered)(_rows(x), _rows(idx))


def test_a_small_argument_read_by_position(rng):
    x, m = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    with pytest.raises(hd.ShapeError, match=r"axis 0: f reads m, which is not chunked along axis 0, at `i`"):
        hdd.function(P.masked)(_rows(x), m)
    np.testing.assert_array_equal(hdd.function(P.masked)(_rows(x), _rows(m)).compute(), P.masked(x, m))


def test_a_captured_array_read_by_position(rng):
    """An array read from a global goes whole to every task: read at a chunked index, it is refused."""
    x = rng.standard_normal((26, 6))
    with pytest.raises(hd.ShapeError, match=r"axis 0: .* reads .*, which is not chunked along axis 0"):
        hdd.function(P.row_gains)(_rows(x))
    cols = da.from_array(x, chunks=(26, 2))  # along the other axis it reads every row in each task
    np.testing.assert_array_equal(hdd.function(P.row_gains)(cols).compute(), P.row_gains(x))


def test_the_same_programs_chunk_along_the_other_axis(rng):
    x = rng.standard_normal((8, 8))
    cols = da.from_array(x, chunks=(8, 3))
    for fn in (P.flipped, P.column_sums, P.ramp, P.upsampled):
        np.testing.assert_array_equal(hdd.function(fn)(cols).compute(), fn(x))


def test_no_dask_argument(rng):
    with pytest.raises(hd.ShapeError, match="none of its arguments is one"):
        hdd.function(P.blur)(np.ones((4, 4)), "mirror")


def test_chunked_arguments_of_different_extents(rng):
    a, b = da.ones((8, 6), chunks=4), da.ones((6, 6), chunks=(6, 3))
    with pytest.raises(hd.ShapeError, match=r"differ in size there \(\[8, 6\]\)"):
        hdd.function(P.deconv_loss)(a, np.ones((3, 3)), b)


def test_a_scalar_output_and_a_keyword_dask_array(rng):
    x = da.from_array(rng.standard_normal((8, 6)), chunks=4)
    with pytest.raises(hd.ShapeError, match=r"has no dimension 0: it reduces or reshapes that axis away"):
        hdd.function(hd.sum)(x)
    with pytest.raises(hd.ShapeError, match="got the dask array m= as a keyword argument"):
        hdd.function(P.masked)(x, m=x)


def test_importing_halide_ad_does_not_import_dask():
    code = "import sys, halide_ad; assert not any(m == 'dask' or m.startswith('dask.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_program_with_an_update_definition(rng):
    x = rng.standard_normal((8, 8))
    with pytest.raises(hd.ShapeError, match="row_scans has an update definition .*does not chunk programs with "
                                            "update definitions yet"):
        hdd.function(P.row_scans)(_rows(x))
