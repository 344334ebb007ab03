"""An Adam-trained student of width k_s against the teacher–student theory (docs/math.md §6 checks).

A student wider than the Bayes-optimal effective width k_c spends its extra neurons fitting noise, so its
test error at fixed n is expected to be lowest near k_s ≈ k_c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from wbfe._deps import require_torch
from wbfe.theory.hmc import Teacher, make_teacher
from wbfe.theory.checks import WIDTH, check_bytes, check_runs, check_seed, finite_number, is_whole, refuse_unless
from wbfe.theory.teacher_student import ActivationLike, readout, solve

__all__ = ["train_student", "StudentSweep", "student_sweep"]


def train_student(teacher: Teacher, width: int, *, epochs: int = 1500, batches: int = 1, lr: float = 0.01,
                  seed: int = 0) -> float:
    """Train one student f(x) = aᵀσ(Wx) of ``width`` unit rows (renormalised after every epoch; a starts at
    0) with Adam on the squared error, and return its test error E_x[(f(x) − f⁰(x))²] against the
    noiseless teacher (from :func:`~wbfe.theory.hmc.make_teacher` with ``centred=False``).

    Raises:
        InvalidOptionError: a width that is not a positive integer (3.0 included); non-positive epochs, batches or
            learning rate; more batches than samples; a seed outside [0, 2**32); a training that diverged to a
            NaN or infinite test error (a learning rate too large).
        MissingDependencyError: torch is not installed.
    """
    require_torch("training the student networks")
    import torch

    refuse_unless(all(is_whole(x) and x >= 1 for x in (width, epochs, batches)) and finite_number(lr) and lr > 0,
                  "width, epochs and batches must be >= 1 and lr > 0 (whole numbers, a finite lr)")
    seed = check_seed(seed)
    width, epochs, batches = WIDTH("width", width), int(epochs), int(batches)  # 3.0 refused, as by the sweep
    n, d = teacher.x.shape
    refuse_unless(batches <= n, f"batches must be at most the {n} training samples, not {batches}")
    n_all = n + teacher.x_test.shape[0]
    check_bytes(width * n_all, f"the activations of width {width} on {n_all} samples", "lower the width")
    dev = teacher.x.device
    gen = torch.Generator(device="cpu").manual_seed(seed + 104729)
    w = torch.randn(width, d, generator=gen, dtype=torch.float64)
    w = (w / w.norm(dim=1, keepdim=True)).to(dev).requires_grad_(True)
    a = torch.zeros(width, dtype=torch.float64, device=dev, requires_grad=True)
    opt = torch.optim.Adam([w, a], lr=lr)
    # The teacher's rows have norm √d against x/√d; the student's unit rows act on x directly.
    # Exactly `batches` contiguous batches, none empty (sizes differ by at most one): an empty batch
    # would still take an Adam step, moving the weights by momentum alone.
    parts = list(zip(teacher.x.tensor_split(batches), teacher.y.tensor_split(batches)))
    for _ in range(epochs):
        for xb, yb in parts:
            loss = ((teacher.act(xb @ w.T) @ a - yb) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            w.div_(w.norm(dim=1, keepdim=True))
    with torch.no_grad():
        diff = teacher.act(teacher.x_test @ w.T) @ a - teacher.f_test
        error = float((diff * diff).mean())
    # A NaN made the sweep's best width its first (argmin of NaNs), reported as an answer
    refuse_unless(math.isfinite(error), f"the student of width {width} (seed {seed}) diverged: its test error is "
                  f"{error} after {epochs} epochs at lr {lr:g}; lower the learning rate")
    return error


@dataclass(frozen=True)
class StudentSweep:
    """Test error against student width at one sample size, with the theory's k_c and ε."""

    widths: tuple[int, ...]
    test_error: tuple[float, ...]
    sem: tuple[float, ...]
    k_c: int
    eps_theory: float
    n: int
    d: int
    k: int
    delta: float

    @property
    def best_width(self) -> int:
        """The width with the lowest mean test error."""
        return self.widths[int(np.argmin(self.test_error))]

    def to_dict(self) -> dict[str, Any]:
        return {"widths": list(self.widths), "test_error": list(self.test_error), "sem": list(self.sem),
                "k_c": self.k_c, "eps_theory": self.eps_theory, "best_width": self.best_width, "n": self.n,
                "d": self.d, "k": self.k, "delta": self.delta}


def student_sweep(*, widths: Sequence[int], d: int = 30, k: int = 30, n: int = 3000, delta: float = 0.05,
                  kind: str = "power", beta: float = 1.0, activation: ActivationLike = "tanh2",
                  seeds: Sequence[int] = (0,), epochs: int = 1500, batches: int = 1, lr: float = 0.01,
                  device: str = "cpu") -> StudentSweep:
    """Train students of each width on the same teacher and data (per seed) and compare with the k_c and ε
    of :func:`~wbfe.theory.teacher_student.solve` for the same readout, d, n and Δ.

    Raises:
        InvalidOptionError: empty ``widths`` or ``seeds``, a repeated width or seed, a width that is not a positive
            integer, a bad seed (and the errors of the parts).
    """
    check_runs("widths", widths, seeds, WIDTH)
    v = readout(kind, k, beta=beta)
    sol = solve(v, delta=delta, d=d, n=n, activation=activation)
    errs = np.empty((len(seeds), len(widths)))
    for i, seed in enumerate(seeds):
        t = make_teacher(v, d=d, n=n, delta=delta, activation=activation, centred=False, seed=seed, device=device)
        for j, width in enumerate(widths):
            errs[i, j] = train_student(t, width, epochs=epochs, batches=batches, lr=lr, seed=seed)
    mean = errs.mean(axis=0)
    sem = errs.std(axis=0, ddof=1) / math.sqrt(len(seeds)) if len(seeds) > 1 else np.full(len(widths), math.nan)
    return StudentSweep(tuple(int(w) for w in widths), tuple(float(x) for x in mean), tuple(float(x) for x in sem),
                        sol.k_c, sol.eps, n, d, k, delta)
