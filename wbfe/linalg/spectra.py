"""The only place eigenvalues are computed: smaller Gram matrix, float64, once per matrix (docs/math.md §1: the zero
rule, and where the spectrum comes from W's singular values instead).

The Gram matrix is accumulated block by block in float64, so a bfloat16 tensor never exists as a whole float64 copy.
BFE-W alone takes log det from a Cholesky (or, for a large square W, an LU) factor instead of an eigen-solve."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Optional, Sequence

import numpy as np

from wbfe._config import blas_threads
from wbfe._deps import loaded, require_torch, torch_installed
from wbfe.errors import InvalidOptionError, WbfeError
from wbfe.linalg import blas
from wbfe.linalg.arrays import dtype_name, is_torch, to_torch, torch_loaded

if TYPE_CHECKING:
    import torch

__all__ = ["Spectrum", "Form", "DegenerateMatrixError", "Device", "resolve_device", "gram", "eigenvalues",
           "w_eigenvalues", "live_part", "log_moments", "spectrum", "range_shift", "near_one", "max_abs", "shift_for",
           "work_bytes", "releases_gil", "uses_lu", "pin_threads", "multithreaded"]

# float64 bytes of one block of rows/columns: large enough for full GEMM speed in the rank-k updates,
# small beside the tensor itself (peak RSS: benchmarks/bench_memory.py).
_BLOCK_BYTES = 8 << 20
# On a GPU memory is plentiful and each block costs two kernel launches: most matrices are one block.
_DEVICE_BLOCK_BYTES = 256 << 20
_EPS = float(np.finfo(np.float64).eps)
# Below this p a second OpenBLAS thread costs more than it saves, the more so the busier the machine,
# so such matrices are scored on one (wbfe.linalg.blas.one_thread).
_SMALL_P = 256
# From here LAPACK's two-stage reduction beats dsyevr (benchmarks/bench_eigensolvers.py).
TWO_STAGE_P = 2560
# Matrices whose float64 copy fits in this are scored side by side on worker threads (their
# products and factorisations release the GIL); a larger one alone, on every BLAS thread.
_WORKER_BYTES = 32 << 20
# Largest entries of a float64 W outside these are scaled by a power of two before the Gram matrix
# (see range_shift): inside, Σw² and every eigenvalue above the noise floor p·eps·max stay normal.
_RANGE_LO = 2.0**-400
_RANGE_HI = 2.0**400
_NON_FINITE = "non-finite values (NaN or Inf)"
# Largest error bound eps·e_max·mean(1/e) on mean(log e) for which the Gram matrix's eigenvalues (or its Cholesky/LU
# factor's log det) are kept, about 100x the error measured (docs/math.md §1); above it W's singular values are used.
_LOG_DET_TOL = 1e-8
_pinned = threading.Event()  # set while every BLAS and OpenMP pool is held at one thread (pin_threads)
# Tests set this to run the torch code path that serves CUDA on the CPU (CI has no GPU).
_TORCH_ON_CPU = False
_DEVICE_NAME = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


Form = Literal["primal", "dual"]


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues of the smaller Gram matrix of one weight matrix (or of pooled conv slices).

    Attributes:
        eigs: float64 eigenvalues in ascending order, noise-level values clipped to exactly 0; None
            when only the moments were computed (every requested group has ``needs_eigenvalues=False``).
        rows, cols: the matrix's (one slice's) as stored, PyTorch's ``out`` and ``in`` (times the kernel
            size if flattened), of the live part the spectrum is of.
        n_slices: number of matrices whose spectra were pooled (1 unless conv ``slices``).
        moments: ``(mean(e), mean(log e), n, n_zero)`` when ``eigs`` is None.
        extra: what groups with a ``from_matrices`` hook computed from the matrices themselves,
            by group name (e.g. the ``rand`` group's shuffled spectrum).
        log_scale: natural log of the factor the true eigenvalues are of ``eigs`` (and of the
            moments): 0 unless the matrix was rescaled by a power of two because its Gram matrix
            would leave float64's range. Scale-invariant columns (BFE-W at λ*, α, κ, ranks) ignore it.
        dead_rows, dead_cols: exactly-zero rows and columns (in every slice) left out of the matrix.
    """

    eigs: Optional[np.ndarray]
    rows: int
    cols: int
    n_slices: int = 1
    moments: Optional[tuple[float, float, int, int]] = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    log_scale: float = 0.0
    dead_rows: int = 0
    dead_cols: int = 0

    def whole(self) -> "Spectrum":
        """This spectrum as WeightWatcher sees the whole matrix: with the zeros the dead rows and columns add."""
        if not (self.dead_rows or self.dead_cols) or self.eigs is None:
            return self
        rows, cols = self.rows + self.dead_rows, self.cols + self.dead_cols
        zeros = np.zeros((min(rows, cols) - self.p) * self.n_slices)
        return dataclasses.replace(self, eigs=np.concatenate([zeros, self.eigs]), rows=rows, cols=cols,
                                   dead_rows=0, dead_cols=0)

    @property
    def n_eigs(self) -> int:
        """Number of (pooled) eigenvalues."""
        return int(self.eigs.size) if self.eigs is not None else int(self.moments[2])  # type: ignore[index]

    def log_moments(self) -> tuple[float, float, int, int]:
        """``(mean(e), mean(log e), n, n_zero)`` of ``eigs`` as stored (see ``log_scale``); −inf for a zero."""
        if self.eigs is None:
            assert self.moments is not None
            return self.moments
        e = self.eigs
        mean_log = float(np.mean(np.log(e))) if np.all(e > 0.0) else -math.inf
        return float(np.mean(e)), mean_log, int(e.size), int(np.count_nonzero(e <= 0.0))

    @property
    def p(self) -> int:
        """Smaller side of one matrix: the number of eigenvalues per slice."""
        return min(self.rows, self.cols)

    @property
    def P(self) -> int:  # noqa: N802 - the docs/math.md name
        """Larger side of one matrix."""
        return max(self.rows, self.cols)

    @property
    def gamma(self) -> float:
        """Aspect ratio p / P in (0, 1]."""
        return self.p / self.P

    @property
    def form(self) -> Form:
        """``primal`` when out <= in (the paper's m <= d_L), else ``dual``."""
        return "primal" if self.rows <= self.cols else "dual"


class DegenerateMatrixError(WbfeError, ValueError):
    """A matrix with no meaningful spectrum (non-finite or all-zero entries); recorded as a skip."""


class Device(str):
    """A device name (``cpu``, ``cuda``, ``cuda:1``) that torch takes wherever it takes a device,
    with torch.device's ``type``; a plain string, so that resolving ``cpu`` imports nothing."""

    @property
    def type(self) -> str:
        return self.split(":", 1)[0]


def resolve_device(device: str) -> Device:
    """``auto`` -> CUDA when available, else CPU.

    Raises:
        InvalidOptionError: unknown device (``tpu``, ``cuda:x``), or ``cuda`` / ``cuda:N`` without that CUDA device.
        MissingDependencyError: ``cuda`` where torch is not installed (``auto`` then means the CPU).
    """
    if not isinstance(device, str) or not _DEVICE_NAME.fullmatch(device):
        raise InvalidOptionError(f"device must be auto, cpu or cuda (cuda:N for the N-th GPU), not {device!r}")
    if device in ("auto", "cpu"):
        return Device("cuda" if device == "auto" and _cuda_available() else "cpu")
    require_torch(f"--device {device}")
    if not _cuda_available():
        raise InvalidOptionError(f"--device {device} was asked for but no CUDA device is available")
    # torch takes cuda:N past the last GPU and fails at the first tensor moved there, deep in a run.
    import torch

    if ":" in device and int(device[5:]) >= (count := torch.cuda.device_count()):
        raise InvalidOptionError(f"--device {device}: this machine has {count} CUDA device(s), "
                                 f"cuda:0 to cuda:{count - 1}")
    return Device(device)


def _cuda_available() -> bool:
    """torch's answer, asked only where NVIDIA's driver is: importing torch to hear no slows every CPU-only run."""
    if not torch_loaded() and not (_nvidia_driver() and torch_installed()):
        return False
    import torch

    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=1)
def _nvidia_driver() -> bool:
    import ctypes.util
    import os

    return os.path.exists("/proc/driver/nvidia/version") or ctypes.util.find_library("cuda") is not None


def gram(matrix: "torch.Tensor", device: "Device") -> Any:
    """The smaller Gram matrix (WWᵀ if rows <= cols else WᵀW) in float64: on the CPU a Fortran-ordered numpy array
    whose lower triangle holds it (the upper may be zero), on CUDA the full symmetric torch tensor.
    DegenerateMatrixError for non-finite entries."""
    rows, cols = matrix.shape
    wide = rows <= cols
    p, long = (rows, cols) if wide else (cols, rows)
    numpy_path = device.type == "cpu" and not _TORCH_ON_CPU
    if numpy_path and _pinned.is_set() and releases_gil(rows, cols, device):
        # On a worker (pin_threads) one numpy product is faster than the blocked update below, which
        # wins only alone (its float64 block stays in cache).
        a = _float64_block(matrix, np.empty(rows * cols, dtype=np.float64))
        # numpy turns a·aᵀ into one symmetric rank-k update and fills both triangles; the
        # transpose of the C-ordered result is the same matrix in Fortran order.
        out = (a @ a.T if wide else a.T @ a).T
    elif numpy_path:
        step = max(1, _BLOCK_BYTES // (8 * p))
        out = np.zeros((p, p), dtype=np.float64, order="F")
        # One buffer for every block: a fresh 8 MiB array per block is fresh pages the kernel zeroes.
        storage = np.empty(min(step, long) * p, dtype=np.float64)
        for start in range(0, long, step):
            block = matrix[:, start : start + step] if wide else matrix[start : start + step, :]
            a = _float64_block(block, storage)
            # a is C-ordered; a.T is the same memory in Fortran order, so BLAS reads it without a copy.
            blas.syrk_lower(out, a.T, trans=wide)
    else:
        # The tensor crosses to the device once, in its stored dtype (a bfloat16 tensor is a
        # quarter of its float64 copy); each block is widened there, not on the host.
        import torch

        source = to_torch(matrix).detach().to(device)
        step = max(1, _DEVICE_BLOCK_BYTES // (8 * p))
        out = torch.zeros((p, p), dtype=torch.float64, device=device)
        for start in range(0, long, step):
            block = source[:, start : start + step] if wide else source[start : start + step, :].T
            block = block.to(dtype=torch.float64)
            out.addmm_(block, block.T)
        del source
    # A NaN or ±Inf entry of W is in some diagonal entry Σ w², and |G_ij| <= √(G_ii·G_jj): the
    # diagonal is finite exactly when the whole Gram matrix is.
    if not bool(np.isfinite(np.diagonal(out)).all() if numpy_path else out.diagonal().isfinite().all()):
        raise DegenerateMatrixError(_NON_FINITE)
    return out


def work_bytes(rows: int, cols: int, device: "Device") -> int:
    """Memory one matrix's spectrum takes beyond the tensor itself, at most."""
    p = min(rows, cols)
    if uses_lu(rows, cols, device):
        return 8 * p * p
    whole = 8 * rows * cols
    return 8 * p * p + (whole if whole <= _WORKER_BYTES else _BLOCK_BYTES)


def uses_lu(rows: int, cols: int, device: "Device") -> bool:
    """Whether BFE-W alone takes log det from the LU factors of W itself (a large square W on the CPU)."""
    return device.type == "cpu" and not _TORCH_ON_CPU and rows == cols and rows >= _SMALL_P


def multithreaded(rows: int, cols: int) -> bool:
    """Whether BLAS may run this matrix's products on more than one thread (below p = 256 every call is
    held at one, so such a matrix may be scored while workers are pinned)."""
    return min(rows, cols) >= _SMALL_P


def releases_gil(rows: int, cols: int, device: "Device") -> bool:
    """Whether this matrix's spectrum is computed without holding the GIL for long and is small enough to
    be scored on a worker, one of several side by side under :func:`pin_threads`."""
    return device.type == "cpu" and 8 * rows * cols <= _WORKER_BYTES and blas.releases_gil()


@contextlib.contextmanager
def pin_threads() -> Iterator[None]:
    """Every BLAS and OpenMP pool at one thread, for scoring matrices on several workers at once.

    Without it each worker's calls start pools of threads, and one library's threads, spinning while they wait for
    work, slow the other's. Per-matrix thread limits are off meanwhile: they would race across workers."""
    limit = None if _pinned.is_set() else _one_thread_limit(user_api=None)
    if limit is None:
        yield
        return
    # torch's too, where it is loaded (a torch tensor's widening runs on torch's threads): threadpoolctl's OpenMP limit
    # holds only for the thread that sets it, and MKL, linked into torch, is out of its sight.
    torch = loaded("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    with limit:
        if torch is not None:
            torch.set_num_threads(1)
        _pinned.set()
        try:
            yield
        finally:
            _pinned.clear()
            if torch is not None:
                torch.set_num_threads(torch_threads)


def _float64_block(block: "torch.Tensor", storage: np.ndarray) -> np.ndarray:
    """``block`` in float64, C-ordered, in the first elements of ``storage``."""
    a = storage[: math.prod(block.shape)].reshape(block.shape)
    if not is_torch(block):
        np.copyto(a, block)
    else:
        to_torch(a).copy_(block.detach())
    return a


@functools.lru_cache(maxsize=1)
def _thread_controller() -> Any:
    import scipy.linalg.blas  # noqa: F401 - load OpenBLAS first so the controller sees it
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _threads_for(matrix: "torch.Tensor", device: "Device") -> Any:
    """One BLAS thread for a matrix with p < 256 on the CPU, unless it is already (workers pinned, or one
    thread allowed); the default otherwise."""
    if device.type != "cpu" or min(matrix.shape) >= _SMALL_P or _pinned.is_set() or blas_threads() == 1:
        return contextlib.nullcontext()
    return _one_thread_limit(user_api="blas")


def _eigvalsh(g: Any) -> np.ndarray:
    if isinstance(g, np.ndarray):
        if g.shape[0] >= TWO_STAGE_P and blas.has_two_stage():
            return blas.eigvalsh_two_stage(g)
        return blas.eigvalsh_lower(g)  # scipy's default driver, dsyevr (bench_eigensolvers.py)
    import torch

    return torch.linalg.eigvalsh(g).cpu().numpy()


def eigenvalues(matrices: Sequence["torch.Tensor"], device: "Device") -> np.ndarray:
    """Pooled eigenvalues of the smaller Gram matrices, ascending, each matrix's zeros exactly 0.
    DegenerateMatrixError for non-finite entries, or all entries zero."""
    parts = []
    for matrix in matrices:
        with _threads_for(matrix, device):
            e = np.sort(_eigvalsh(gram(matrix, device)))
        parts.append(_resolved(e, matrix, device))
    pooled = np.sort(np.concatenate(parts))
    if not (pooled.size and pooled[-1] > 0.0):
        raise DegenerateMatrixError("all-zero matrix")
    return pooled


def _resolved(e: np.ndarray, matrix: "torch.Tensor", device: "Device") -> np.ndarray:
    """``e`` where the Gram matrix resolves them all, else W's squared singular values."""
    top = float(e[-1]) if e.size else 0.0
    if not top > 0.0:
        return np.zeros(e.size)
    if float(e[0]) > 0.0 and _EPS * top * float(np.mean(1.0 / e)) <= _LOG_DET_TOL:
        return e
    return w_eigenvalues(matrix, device)


def w_eigenvalues(matrix: "torch.Tensor", device: "Device") -> np.ndarray:
    """Ascending squared singular values of W itself (no squared condition number), those the zero rule
    calls zero (σ <= σ_max·P·eps) exactly 0; DegenerateMatrixError for non-finite entries."""
    rows, cols = (int(n) for n in matrix.shape)
    if device.type == "cpu" and not _TORCH_ON_CPU:
        w = _float64_block(matrix, np.empty(rows * cols, dtype=np.float64))
        if not np.isfinite(w).all():
            raise DegenerateMatrixError(_NON_FINITE)
        sv = np.linalg.svd(w, compute_uv=False)
    else:
        import torch

        w64 = to_torch(matrix).detach().to(device=device, dtype=torch.float64)
        if not bool(w64.isfinite().all()):
            raise DegenerateMatrixError(_NON_FINITE)
        sv = torch.linalg.svdvals(w64).cpu().numpy()
    sv = np.sort(np.asarray(sv, dtype=np.float64))
    top = float(sv[-1]) if sv.size else 0.0
    sv[sv <= top * max(rows, cols) * _EPS] = 0.0
    return sv * sv


def live_part(matrices: Sequence["torch.Tensor"]) -> tuple[list["torch.Tensor"], int, int]:
    """``(matrices without their dead rows and columns, dead rows, dead cols)``: a row (column) is dead
    when it is exactly zero in every matrix (every slice of a conv kernel). DegenerateMatrixError if all are."""
    lines = [_nonzero_lines(m) for m in matrices]
    live_rows, live_cols = (np.logical_or.reduce([line[i] for line in lines]) for i in (0, 1))
    n_rows, n_cols = int(live_rows.sum()), int(live_cols.sum())
    if n_rows == 0 or n_cols == 0:
        raise DegenerateMatrixError("all-zero matrix")
    dead_rows, dead_cols = live_rows.size - n_rows, live_cols.size - n_cols
    if not (dead_rows or dead_cols):
        return list(matrices), 0, 0
    rows_at, cols_at = np.flatnonzero(live_rows), np.flatnonzero(live_cols)
    out: list[Any] = []
    for m in matrices:
        if is_torch(m):
            import torch

            live = m.index_select(0, torch.as_tensor(rows_at, device=m.device))
            out.append(live.index_select(1, torch.as_tensor(cols_at, device=m.device)))
        else:
            out.append(np.asarray(m)[np.ix_(rows_at, cols_at)])
    return out, dead_rows, dead_cols


def _nonzero_lines(m: Any) -> tuple[np.ndarray, np.ndarray]:
    """Which rows and which columns of ``m`` hold a non-zero entry (NaN counts as non-zero)."""
    if is_torch(m):
        nz = m.detach() != 0
        return nz.any(dim=1).cpu().numpy(), nz.any(dim=0).cpu().numpy()
    a = np.asarray(m)
    return np.any(a, axis=1), np.any(a, axis=0)


def log_moments(matrices: Sequence["torch.Tensor"], device: "Device") -> tuple[float, float, int, int]:
    """``(mean(e), mean(log e), n, number of zero eigenvalues)`` of the pooled spectrum, log det from a
    Cholesky (or LU) factor where it is trusted, else from W's singular values with the zero rule of
    :func:`eigenvalues` (a zero makes mean(log e) = −inf). DegenerateMatrixError as :func:`eigenvalues`."""
    trace = log_det = 0.0
    n = n_zero = 0
    for matrix in matrices:
        rows, cols = matrix.shape
        if uses_lu(rows, cols, device):
            # On every BLAS thread: a matrix this size is on a worker, pinned to one thread
            # (pin_threads), unless it is too large for one and alone, when all of them help.
            tr, diag = _lu_diagonal(matrix)
        else:
            with _threads_for(matrix, device):
                g = gram(matrix, device)
                tr = float(np.trace(g)) if isinstance(g, np.ndarray) else float(g.trace())
                diag = _cholesky_diagonal(g)
                del g
        n += min(rows, cols)
        trace += tr
        ld, zeros = _log_det(matrix, device, tr, diag)
        log_det += ld
        n_zero += zeros
    if not trace > 0.0:
        raise DegenerateMatrixError("all-zero matrix")
    return trace / n, log_det / n, n, n_zero


def _log_det(matrix: "torch.Tensor", device: "Device", tr: float, diag: Optional[np.ndarray]) -> tuple[float, int]:
    """``(log det, number of zero eigenvalues)`` of one Gram matrix of trace ``tr``, from its factor's
    diagonal, or from W's singular values where the factorisation failed or is not trusted."""
    if tr <= 0.0:
        return -math.inf, min(matrix.shape)
    if diag is None or not float(np.min(diag)) > 0.0:
        e = w_eigenvalues(matrix, device)
        return (float(np.sum(np.log(e))) if np.all(e > 0) else -math.inf), int(np.count_nonzero(e <= 0.0))
    return 2.0 * float(np.sum(np.log(diag))), 0


def _cholesky_diagonal(g: Any) -> np.ndarray | None:
    """Diagonal of the Cholesky factor (overwriting ``g``), or None when it is not numerically positive
    definite or the bound eps·e_max·mean(1/e) exceeds ``_LOG_DET_TOL``: e_max <= ‖G‖₁, and
    Σ1/e = ‖L⁻¹‖²_F is estimated from below by Σ1/l_ii² and by LAPACK's estimate of 1/e_min."""
    if isinstance(g, np.ndarray):
        # ‖G‖₁ from the lower triangle (all LAPACK reads; the upper one may be zero), before potrf overwrites it.
        low = np.abs(np.tril(g))
        anorm = float(np.max(low.sum(axis=0) + low.sum(axis=1) - np.diagonal(low)))
        del low
        if blas.potrf_lower(g) != 0:
            return None
        from scipy.linalg.lapack import dpocon

        rcond, info = dpocon(g, anorm, uplo="L")
        diag = np.diag(g).copy()
        if info != 0 or not rcond > 0.0:
            return None
        bound = _EPS * (anorm * float(np.sum(1.0 / (diag * diag))) + 1.0 / rcond) / diag.size
        return diag if bound <= _LOG_DET_TOL else None
    import torch

    factor, info = torch.linalg.cholesky_ex(g)
    if int(info) != 0:
        return None
    # No condition estimator in torch: Σ1/e = ‖L⁻¹‖²_F exactly, e_max <= ‖G‖_F.
    eye = torch.eye(g.shape[0], dtype=g.dtype, device=g.device)
    inv = torch.linalg.solve_triangular(factor, eye, upper=False)
    bound = _EPS * float(torch.linalg.matrix_norm(g) * torch.linalg.matrix_norm(inv) ** 2) / g.shape[0]
    return torch.diagonal(factor).cpu().numpy() if bound <= _LOG_DET_TOL else None


def _lu_diagonal(matrix: Any) -> tuple[float, Optional[np.ndarray]]:
    """``(‖W‖_F², |diag U|)`` of a square W = PLU (|det W| = ∏|u_ii|); None in place of the diagonal where W is
    singular or the bound 2·eps·cond₁(W)/p on log|det W| exceeds ``_LOG_DET_TOL``. DegenerateMatrixError for
    non-finite entries."""
    w = _float64_block(matrix, np.empty(math.prod(matrix.shape), dtype=np.float64))
    flat = w.reshape(-1)
    tr = float(np.dot(flat, flat))
    if not math.isfinite(tr):
        raise DegenerateMatrixError(_NON_FINITE)
    # w is C-ordered, so w.T is Fortran-ordered, as LAPACK wants, without a copy: the LU of Wᵀ,
    # whose |det| is |det W|. ‖Wᵀ‖₁ is the largest row sum of |W|.
    anorm = float(np.max(np.abs(w).sum(axis=1)))
    lu = w.T
    if blas.getrf(lu) != 0:
        return tr, None
    from scipy.linalg.lapack import dgecon

    rcond, info = dgecon(lu, anorm, norm="1")
    if info != 0 or not 2.0 * _EPS <= _LOG_DET_TOL * rcond * lu.shape[0]:
        return tr, None
    return tr, np.abs(np.diagonal(lu)).copy()


def spectrum(matrices: Sequence["torch.Tensor"], device: "Device", *, need_eigs: bool = True) -> Spectrum:
    """The :class:`Spectrum` of one matrix or of pooled slices of equal shape; ``need_eigs`` False when
    only mean(e) and mean(log e) are needed (BFE-W alone). InvalidOptionError for anything but 2-D matrices of
    one shape."""
    if not matrices or len(matrices[0].shape) != 2 or any(m.shape != matrices[0].shape for m in matrices):
        raise InvalidOptionError("a spectrum is of one or more 2-D matrices of one shape, not of shapes "
                                 f"{[tuple(m.shape) for m in matrices]}")
    matrices, dead_rows, dead_cols = live_part(matrices)
    rows, cols = (int(n) for n in matrices[0].shape)
    shift = range_shift(matrices)
    log_scale = 0.0
    if shift:
        # W·2^k exactly: the eigenvalues are 4^k times W's, which ``log_scale`` undoes.
        matrices = [m * math.ldexp(1.0, shift) for m in matrices]
        log_scale = -2.0 * shift * math.log(2.0)
    return Spectrum(eigs=eigenvalues(matrices, device) if need_eigs else None, rows=rows, cols=cols,
                    n_slices=len(matrices), moments=None if need_eigs else log_moments(matrices, device),
                    log_scale=log_scale, dead_rows=dead_rows, dead_cols=dead_cols)


def _one_thread_limit(*, user_api: Optional[str]) -> Any:
    """A context holding the BLAS pools (and, through threadpoolctl, ``user_api``'s others) at one
    thread: OpenBLAS's own calls where they are found (far cheaper), else threadpoolctl's controller."""
    return blas.one_thread() if blas.controls_threads() else _thread_controller().limit(limits=1, user_api=user_api)


def range_shift(matrices: Sequence[Any]) -> int:
    """k such that W·2^k has its largest entry in [½, 1) (at most k = 1023, 2^k's own limit: a subnormal W's
    is then at least 2^-51), when W's Gram matrix would leave float64's range; 0 otherwise, and for non-finite
    or all-zero W (refused later with that reason). Only float64 matrices can get there: any narrower dtype's
    entry squared stays in range."""
    if dtype_name(matrices[0]) != "float64":
        return 0
    return shift_for(max(max_abs(m) for m in matrices))


def max_abs(x: Any) -> float:
    """The largest |entry| of a numpy array or torch tensor (NaN where it holds one), without the copy abs(x) makes."""
    return max(float(x.max()), -float(x.min()))


def shift_for(top: float) -> int:
    """:func:`range_shift` of float64 matrices whose largest |entry| is ``top``."""
    if not (math.isfinite(top) and top > 0.0) or _RANGE_LO <= top <= _RANGE_HI:
        return 0
    return min(-math.frexp(top)[1], 1023)


def near_one(x: np.ndarray, top: Optional[float] = None) -> tuple[np.ndarray, float]:
    """``x`` times ``f`` = 2^:func:`range_shift` (exact; 1 where its Gram matrix and sums of squares stay inside
    float64's range), and ``f``: for what the spectrum's own rule must also hold (editing, compare's norms).
    ``top``: a float64 x's :func:`max_abs`, where the caller has it (no pass over x here)."""
    shift = (range_shift([x]) if x.size else 0) if top is None else shift_for(top)
    f = math.ldexp(1.0, shift)
    return (x * f if shift else x), f
