"""The LAPACK/BLAS calls the spectra spend their time in, called without holding the GIL.

scipy's wrappers (``scipy.linalg.blas.dsyrk``, ...) hold the GIL for the whole call; the same routines, exported
for Cython (``scipy.linalg.cython_blas``, ``cython_lapack``) as C function pointers and called through ctypes
(which releases the GIL), let workers factorise side by side
(benchmarks/results/blas_layer.json)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

__all__ = ["syrk_lower", "potrf_lower", "getrf", "eigvalsh_lower", "releases_gil", "eigvalsh_two_stage",
           "has_two_stage", "one_thread", "controls_threads"]

# The routines' arguments, all by reference: c a char, i an int, d a double, a an array's data.
_PROTOTYPES = {
    "dsyrk": "uplo:c trans:c n:i k:i alpha:d a:a lda:i beta:d c:a ldc:i",
    "dpotrf": "uplo:c n:i a:a lda:i info:i",
    "dgetrf": "m:i n:i a:a lda:i ipiv:a info:i",
    "dsyevr": "jobz:c range:c uplo:c n:i a:a lda:i vl:d vu:d il:i iu:i abstol:d m:i w:a z:a ldz:i isuppz:a work:a "
              "lwork:i iwork:a liwork:i info:i",
}
_C_TYPES: dict[str, Any] = {"c": ctypes.c_char_p, "i": ctypes.POINTER(ctypes.c_int),
                            "d": ctypes.POINTER(ctypes.c_double), "a": ctypes.c_void_p}


def _int(value: int) -> Any:
    return ctypes.byref(ctypes.c_int(value))


def _double(value: float) -> Any:
    return ctypes.byref(ctypes.c_double(value))


@functools.lru_cache(maxsize=1)
def _routines() -> dict[str, Callable[..., None]]:
    """dsyrk, dpotrf, dgetrf and dsyevr as GIL-free ctypes functions (scipy >= 1.0 exports them all)."""
    from scipy.linalg import cython_blas, cython_lapack

    # Prototypes of our own: setting restype/argtypes on ctypes.pythonapi's function objects would
    # change them for every other user of ctypes in the process.
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    out: dict[str, Callable[..., None]] = {}
    for name, args in _PROTOTYPES.items():
        capsule = (cython_blas if name == "dsyrk" else cython_lapack).__pyx_capi__[name]
        address = get_pointer(capsule, get_name(capsule))
        if not address:  # never called through: a null pointer would crash the process
            raise ImportError(f"scipy exports an empty {name}")
        out[name] = ctypes.CFUNCTYPE(None, *(_C_TYPES[arg[-1]] for arg in args.split()))(address)
    return out


def releases_gil() -> bool:
    """Whether :func:`syrk_lower`, :func:`potrf_lower`, :func:`getrf` and :func:`eigvalsh_lower` run
    without holding the GIL."""
    return bool(_routines())


def _check(what: str, a: np.ndarray, *, square: bool = True) -> None:
    """ValueError unless ``a`` is a Fortran-ordered float64 matrix (``square``: a square one), as LAPACK reads it."""
    if not (a.flags.f_contiguous and a.dtype == np.float64 and a.ndim == 2) or square and a.shape[0] != a.shape[1]:
        raise ValueError(f"{what} needs a {'square ' if square else ''}Fortran-ordered float64 matrix")


def syrk_lower(c: np.ndarray, a: np.ndarray, *, trans: bool) -> None:
    """``c += a·aᵀ`` (``trans``: ``c += aᵀ·a``) in the lower triangle of ``c``, in place; both float64 and
    Fortran-ordered, ``c`` n×n and ``a`` n×k (k×n with ``trans``)."""
    _check("syrk_lower", c)
    _check("syrk_lower", a, square=False)
    n = c.shape[0]
    k = a.shape[0] if trans else a.shape[1]
    if a.shape != ((k, n) if trans else (n, k)) or c.shape != (n, n):
        raise ValueError(f"syrk_lower: shapes {a.shape} and {c.shape} do not match")
    if k == 0 or n == 0:
        return
    _routines()["dsyrk"](b"L", b"T" if trans else b"N", _int(n), _int(k), _double(1.0), a.ctypes.data,
                         _int(max(1, a.shape[0])), _double(1.0), c.ctypes.data, _int(max(1, n)))


def potrf_lower(g: np.ndarray) -> int:
    """The Cholesky factor L (G = L·Lᵀ) of the lower triangle of ``g`` (square, Fortran-ordered float64), in place
    (the upper triangle is neither read nor written); returns LAPACK's ``info``: 0 on success, i > 0 when the leading
    minor of order i is not positive definite."""
    _check("potrf_lower", g)
    info = ctypes.c_int(0)
    _routines()["dpotrf"](b"L", _int(g.shape[0]), g.ctypes.data, _int(max(1, g.shape[0])), ctypes.byref(info))
    return int(info.value)


def getrf(a: np.ndarray) -> int:
    """The LU factors (A = P·L·U) of ``a`` (m×n, Fortran-ordered float64), in place: U on and above the diagonal;
    returns LAPACK's ``info``: 0 on success, i > 0 when u_ii is exactly zero (the factors are complete)."""
    _check("getrf", a, square=False)
    m, n = a.shape
    pivots = np.empty(max(1, min(m, n)), dtype=np.intc)
    info = ctypes.c_int(0)
    _routines()["dgetrf"](_int(m), _int(n), a.ctypes.data, _int(max(1, m)), pivots.ctypes.data, ctypes.byref(info))
    return int(info.value)


def eigvalsh_lower(g: np.ndarray) -> np.ndarray:
    """Eigenvalues, ascending, of the symmetric matrix in the lower triangle of ``g`` (destroyed), by
    the routine and workspace ``scipy.linalg.eigvalsh`` uses (``dsyevr``, all eigenvalues, no vectors),
    so bit for bit its values, but without the GIL.

    Raises:
        ValueError: ``g`` is not a square Fortran-ordered float64 array, or LAPACK reports an error.
    """
    _check("eigvalsh_lower", g)
    n = g.shape[0]
    w = np.empty(n, dtype=np.float64)
    found, info = ctypes.c_int(0), ctypes.c_int(0)
    z = np.empty(1, dtype=np.float64)  # not referenced without vectors
    support = np.empty(2 * n, dtype=np.intc)

    def call(work: np.ndarray, lwork: int, iwork: np.ndarray, liwork: int) -> None:
        _routines()["dsyevr"](b"N", b"A", b"L", _int(n), g.ctypes.data, _int(max(1, n)), _double(0.0), _double(0.0),
                              _int(0), _int(0), _double(0.0), ctypes.byref(found), w.ctypes.data, z.ctypes.data,
                              _int(1), support.ctypes.data, work.ctypes.data, _int(lwork), iwork.ctypes.data,
                              _int(liwork), ctypes.byref(info))

    # The optimal workspace, as scipy asks for: a smaller one makes dsytrd fall back to unblocked code.
    work, iwork = np.empty(1, dtype=np.float64), np.empty(1, dtype=np.intc)
    call(work, -1, iwork, -1)
    lwork, liwork = int(work[0]), int(iwork[0])
    call(np.empty(lwork, dtype=np.float64), lwork, np.empty(liwork, dtype=np.intc), liwork)
    if info.value != 0 or found.value != n:
        raise ValueError(f"dsyevr failed (info {info.value}, {found.value} of {n} eigenvalues)")
    return w


# int LAPACKE_dsyevd_2stage(int layout, char jobz, char uplo, int n, double *a, int lda, double *w)
_LAPACKE_EIG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char, ctypes.c_char, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_COL_MAJOR = 102


@functools.lru_cache(maxsize=1)
def _two_stage() -> Optional[Callable[..., int]]:
    """LAPACK's ``dsyevd_2stage`` through LAPACKE, from the OpenBLAS scipy loads (scipy's wrappers do not
    export the two-stage drivers); None where it is not found. Only a library with 32-bit LAPACK
    integers is used (scipy's; numpy's ``openblas64_`` has 64-bit ones)."""
    for path, library in _openblas_libraries():
        if "64" in path.rsplit("/", 1)[-1]:
            continue
        symbol = _symbol(library, ("scipy_LAPACKE_dsyevd_2stage", "LAPACKE_dsyevd_2stage"))
        address = ctypes.cast(symbol, ctypes.c_void_p).value if symbol is not None else None
        if address:
            return _LAPACKE_EIG(address)
    return None


def has_two_stage() -> bool:
    """Whether :func:`eigvalsh_two_stage` can run here."""
    return _two_stage() is not None


def eigvalsh_two_stage(g: np.ndarray) -> np.ndarray:
    """:func:`eigvalsh_lower` by LAPACK's two-stage tridiagonal reduction (dense → band by BLAS-3 → tridiagonal),
    which on a matrix too large for the caches beats the one-stage, memory-bound ``dsytrd``
    (benchmarks/bench_eigensolvers.py). ValueError also where the routine is missing (:func:`has_two_stage`)."""
    _check("eigvalsh_two_stage", g)
    routine = _two_stage()
    if routine is None:
        raise ValueError("LAPACKE_dsyevd_2stage is not available")
    n = g.shape[0]
    w = np.empty(n, dtype=np.float64)
    info = routine(_COL_MAJOR, b"N", b"L", n, g.ctypes.data, max(1, n), w.ctypes.data)
    if info != 0:
        raise ValueError(f"dsyevd_2stage failed (info {info})")
    return w


_OPENBLAS_FILE = re.compile(r"(/\S*openblas\S*\.(?:so|dylib)\S*)\s*$", re.IGNORECASE)
# scipy's OpenBLAS prefixes its symbols, a build with 64-bit integers suffixes them
_THREAD_CALLS = [f"{prefix}openblas_{{}}_num_threads{suffix}" for prefix in ("scipy_", "") for suffix in ("64_", "")]


def _symbol(library: ctypes.CDLL, names: Iterable[str]) -> Any:
    return next((getattr(library, name) for name in names if hasattr(library, name)), None)


@functools.lru_cache(maxsize=1)
def _openblas_libraries() -> tuple[tuple[str, ctypes.CDLL], ...]:
    """Each OpenBLAS loaded into this process (numpy's and scipy's), found beside their wheels or in
    ``/proc/self/maps``, far faster than threadpoolctl's search of every loaded library."""
    _routines()  # loads scipy's OpenBLAS
    found = []
    for path in _wheel_openblas() or _mapped_openblas():
        try:
            found.append((path, ctypes.CDLL(path)))  # the copy already loaded: dlopen hands back its handle
        except OSError:
            continue
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _thread_calls() -> tuple[tuple[Callable[[], int], Callable[[int], None]], ...]:
    """(get, set) of the thread count of each OpenBLAS loaded into this process; empty where none is found."""
    calls = []
    for _, library in _openblas_libraries():
        get, set_ = (_symbol(library, (name.format(verb) for name in _THREAD_CALLS)) for verb in ("get", "set"))
        if get is not None and set_ is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            calls.append((get, set_))
    return tuple(calls)


def _wheel_openblas() -> dict[str, None]:
    """The OpenBLAS files numpy's and scipy's wheels ship beside them (``numpy.libs``, ``scipy.libs``),
    both loaded once numpy and scipy.linalg are."""
    from pathlib import Path

    import scipy

    found: dict[str, None] = {}
    for package in (np, scipy):
        folder = Path(package.__path__[0]).parent / f"{package.__name__}.libs"
        found.update(dict.fromkeys(str(path) for path in sorted(folder.glob("*openblas*.so*"))))
    return found


def _mapped_openblas() -> dict[str, None]:
    """Every OpenBLAS file mapped into this process, from ``/proc/self/maps`` (Linux only)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            # The substring test first: a regex over each of the many lines torch maps is slow.
            found = (_OPENBLAS_FILE.search(line) for line in fh.read().splitlines() if "openblas" in line.lower())
            return dict.fromkeys(m.group(1) for m in found if m)
    except OSError:
        return {}


def controls_threads() -> bool:
    """Whether :func:`one_thread` can hold this process's OpenBLAS libraries at one thread."""
    return bool(_thread_calls())


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Every OpenBLAS of the process at one thread meanwhile, then as before. As threadpoolctl's limit, the count is the
    library's, not the calling thread's: use it only where no other thread is running BLAS calls. Small products and
    solves need it: split over two threads on a busy machine they run many times slower."""
    calls = _thread_calls()
    before = [get() for get, _ in calls]
    for _, set_ in calls:
        set_(1)
    try:
        yield
    finally:
        for (_, set_), count in zip(calls, before):
            set_(count)
