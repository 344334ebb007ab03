"""Posterior sampling of the teacher–student model by Hamiltonian Monte Carlo (docs/math.md §6 checks).

The Gibbs error of a posterior sample is twice the Bayes-optimal error, so its half is compared with the
fixed point's ε. As in the authors' checks the chain starts informed: the rows the theory says are
learned (qᵢ > 0) start at the teacher's, the others at random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from wbfe._deps import require_torch
from wbfe.linalg.spectra import resolve_device
from wbfe.theory.hermite import kernel
from wbfe.theory.checks import check_bytes, check_runs, check_seed, finite_number, is_number, is_whole, refuse_unless
from wbfe.theory.teacher_student import ActivationLike, readout, solve

__all__ = ["Teacher", "make_teacher", "HMCRun", "run_hmc", "HMCPoint", "hmc_check"]


@dataclass
class Teacher:
    """A teacher network and its data, as torch tensors on one device.

    Attributes:
        w0: k×d teacher weights, rows of norm √d (pre-activations w·x/√d ~ N(0, 1)).
        x_test, f_test: test inputs and the noiseless teacher output on them.
        mu: (μ₀, μ₁) removed from the activation when ``centred``.
    """

    w0: Any
    v: Any
    x: Any
    y: Any
    x_test: Any
    f_test: Any
    act: Any
    mu: tuple[float, float]
    centred: bool

    def output(self, w: Any, x: Any) -> Any:
        """vᵀσ(Wx/√d) (with σ̃ in place of σ when ``centred``), batched over the rows of x."""
        pre = x @ w.T / math.sqrt(x.shape[1])
        h = self.act(pre)
        if self.centred:
            h = h - self.mu[0] - self.mu[1] * pre
        return h @ self.v


def make_teacher(v: np.ndarray, *, d: int, n: int, delta: float, activation: ActivationLike = "tanh2",
                 n_test: int = 20000, centred: bool = True, seed: int = 0, device: str = "cpu") -> Teacher:
    """Draw an orthonormal-row teacher of readout ``v`` (length k ≤ d) and its data, every draw from ``seed``.

    ``centred`` removes the activation's degree-0 and degree-1 Hermite parts (σ̃), as ε^BO does.

    Raises:
        InvalidOptionError: k > d, non-positive sizes, a seed outside [0, 2**32), or an activation without a
            torch form.
        MissingDependencyError: torch is not installed.
    """
    require_torch("drawing the HMC check's teacher and data")
    import torch

    kern = kernel(activation)
    refuse_unless(kern.activation.torch is not None,
                  f"activation {kern.activation.name!r} has no torch form; use a named one")
    k = len(v)
    refuse_unless(all(is_whole(x) for x in (d, n, n_test)) and 1 <= k <= d and n >= 1 and n_test >= 1 and
                  finite_number(delta) and delta >= 0 and np.all(np.isfinite(v)), "need whole numbers 1 <= k <= d, "
                  f"n >= 1, n_test >= 1, a finite v and 0 <= delta < inf (k={k}, d={d!r}, n={n!r}, delta={delta!r})")
    seed = check_seed(seed)
    dev = resolve_device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    d, n, n_test = int(d), int(n), int(n_test)
    check_bytes((n + n_test + k) * d, f"{n:.6g} training and {n_test} test samples of dimension {d}",
                "lower n (r), n_test or d")
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    w0 = (math.sqrt(d) * q.T).to(dev)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64).to(dev)
    z = torch.randn(n, generator=gen, dtype=torch.float64).to(dev)
    x_test = torch.randn(n_test, d, generator=gen, dtype=torch.float64).to(dev)
    vt = torch.as_tensor(np.asarray(v, dtype=np.float64), device=dev)
    t = Teacher(w0, vt, x, None, x_test, None, kern.activation.torch, (kern.mu[0], kern.mu[1]), centred)
    t.y = t.output(w0, x) + math.sqrt(delta) * z
    t.f_test = t.output(w0, x_test)
    return t


@dataclass(frozen=True)
class HMCRun:
    """One HMC chain: the Gibbs error/2 of its kept samples and the sampler's statistics (``w2_mean``: the mean
    squared entry of W over the kept samples, 1 under the prior)."""

    gibbs_half: float
    trace: np.ndarray
    w2_mean: float
    accept_rate: float
    step_size: float
    informed_rows: int
    n: int
    d: int
    k: int


def run_hmc(teacher: Teacher, *, delta: float, informed_rows: int, warmup: int = 1000, samples: int = 400,
            leapfrog: int = 10, step_size: float = 0.01, target_accept: float = 0.75, every: int = 10, seed: int = 0
            ) -> HMCRun:
    """Sample the posterior over W by HMC and measure the Gibbs error/2 of the samples.

    The step size adapts during ``warmup`` towards ``target_accept``, then is frozen; one sample in ``every`` of
    the ``samples`` after warm-up is kept. The likelihood assumes noise ``delta`` (the teacher's, for
    Bayes-optimality); ``informed_rows`` rows start at the teacher's, the rest from the prior.

    Raises:
        InvalidOptionError: non-positive counts, fewer ``samples`` than ``every``, Δ ≤ 0, or
            ``informed_rows`` outside [0, k]; a chain that accepted no proposal after warm-up.
        MissingDependencyError: torch is not installed.
    """
    require_torch("the HMC sampler")
    import torch

    k, d = teacher.w0.shape
    refuse_unless(all(is_whole(x) for x in (warmup, leapfrog, every, samples)) and warmup >= 0 and leapfrog >= 1
                  and 1 <= every <= samples and finite_number(step_size) and step_size > 0 and finite_number(delta)
                  and delta > 0 and is_number(target_accept) and 0 < target_accept < 1,
                  "need whole numbers warmup >= 0, leapfrog >= 1, 1 <= every <= samples, finite step_size > 0 and "
                  "delta > 0, and 0 < target_accept < 1")
    seed = check_seed(seed)
    refuse_unless(is_whole(informed_rows) and 0 <= informed_rows <= k,
                  f"informed_rows must be in [0, {k}], got {informed_rows}")
    dev = teacher.w0.device
    warmup, leapfrog, every, samples, informed_rows = map(int, (warmup, leapfrog, every, samples, informed_rows))
    gen = torch.Generator(device="cpu").manual_seed(seed + 7919)
    w = torch.randn(k, d, generator=gen, dtype=torch.float64).to(dev)
    w[:informed_rows] = teacher.w0[:informed_rows]

    def energy_grad(w_: Any) -> tuple[Any, Any]:
        w_ = w_.detach().requires_grad_(True)
        res = teacher.output(w_, teacher.x) - teacher.y
        u = 0.5 * (w_ * w_).sum() + (res * res).sum() / (2.0 * delta)
        (grad,) = torch.autograd.grad(u, w_)
        return u.detach(), grad

    u_cur, g_cur = energy_grad(w)
    trace, w2, accepted, eps = [], [], 0, step_size
    for it in range(warmup + samples):
        p = torch.randn(k, d, generator=gen, dtype=torch.float64).to(dev)
        h0 = u_cur + 0.5 * (p * p).sum()
        w_new, p = w, p - 0.5 * eps * g_cur
        for step in range(leapfrog):
            w_new = w_new + eps * p
            u_new, g_new = energy_grad(w_new)
            p = p - (eps if step < leapfrog - 1 else 0.5 * eps) * g_new
        h1 = u_new + 0.5 * (p * p).sum()
        log_ratio = float(h0 - h1)
        accept_prob = math.exp(min(0.0, log_ratio)) if math.isfinite(log_ratio) else 0.0
        if float(torch.rand(1, generator=gen)) < accept_prob:
            w, u_cur, g_cur = w_new, u_new, g_new
            if it >= warmup:
                accepted += 1
        if it < warmup:
            eps *= math.exp(0.05 * (accept_prob - target_accept))
        elif (it - warmup) % every == every - 1:
            with torch.no_grad():
                diff = teacher.output(w, teacher.x_test) - teacher.f_test
                trace.append(0.5 * float((diff * diff).mean()))
                w2.append(float((w * w).mean()))
    # Every kept sample the same point: its error is one draw's, not the posterior's (a tiny Δ freezes the chain)
    refuse_unless(accepted > 0, f"HMC accepted none of its {samples} proposals after warm-up (seed {seed}, Δ = "
                  f"{delta:g}, step {eps:.3g}): the chain never moved, so its samples say nothing of the posterior; "
                  "raise delta or warmup")
    arr = np.asarray(trace)
    return HMCRun(float(arr.mean()), arr, float(np.mean(w2)), accepted / samples, eps, informed_rows,
                  int(teacher.x.shape[0]), d, k)


@dataclass(frozen=True)
class HMCPoint:
    """Theory against HMC at one sample size: ε^BO and the mean Gibbs error/2 over seeds."""

    r: float
    n: int
    eps_theory: float
    k_c: int
    gibbs_half: float
    sem: float
    per_seed: tuple[float, ...]
    accept_rate: float
    extra: dict = field(default_factory=dict)

    @property
    def z(self) -> float:
        """(Gibbs error/2 − ε)/sem: the disagreement in units of the sampling error."""
        return (self.gibbs_half - self.eps_theory) / self.sem if self.sem > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"r": self.r, "n": self.n, "eps_theory": self.eps_theory, "k_c": self.k_c,
                "gibbs_half": self.gibbs_half, "sem": self.sem, "z": self.z, "per_seed": list(self.per_seed),
                "accept_rate": self.accept_rate, **self.extra}


def hmc_check(*, r_values: Sequence[float], d: int = 40, k: int = 20, delta: float = 0.04,
              kind: str = "power", beta: float = 0.3, activation: ActivationLike = "tanh2",
              seeds: Sequence[int] = (0, 1, 2), warmup: int = 600, samples: int = 300, leapfrog: int = 10,
              n_test: int = 20000, device: str = "cpu", informed_rows: Optional[int] = None) -> list[HMCPoint]:
    """One :class:`HMCPoint` per r = n/(kd): the HMC Gibbs error/2 against the fixed point's ε.

    Each seed draws a new teacher and data set; the standard error is over seeds (each seed's value
    is already an average over its chain). ``informed_rows`` overrides the theory's k_c.

    Raises:
        InvalidOptionError: empty ``r_values`` or ``seeds``, a repeated r or seed, a bad seed (and the errors of the
            parts).
    """
    check_runs("r_values", r_values, seeds, lambda name, r: r)  # r's range is checked below, over the list
    # n = r·k·d is computed before solve checks d
    refuse_unless(is_whole(d) and d >= 1 and is_whole(k) and k >= 1,
                  f"d and k must be integers >= 1, got d={d!r}, k={k!r}")
    refuse_unless(all(finite_number(r) and r > 0 for r in r_values),
                  f"r_values must be positive and finite, got {list(r_values)!r}")
    v = readout(kind, k, beta=beta)
    points = []
    for r in r_values:
        n = int(round(r * k * d))
        refuse_unless(n >= 1, f"r = {r:g} gives n = round(r*k*d) = 0 samples (k={k}, d={d}): raise r")
        sol = solve(v, delta=delta, d=d, n=n, activation=activation)
        rows = sol.k_c if informed_rows is None else informed_rows
        teachers = (make_teacher(v, d=d, n=n, delta=delta, activation=activation, n_test=n_test, seed=seed,
                                 device=device) for seed in seeds)
        runs = [run_hmc(t, delta=delta, informed_rows=rows, warmup=warmup, samples=samples, leapfrog=leapfrog,
                        seed=seed) for t, seed in zip(teachers, seeds)]
        arr = np.asarray([run.gibbs_half for run in runs])
        sem = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else math.nan
        points.append(HMCPoint(float(r), n, sol.eps, sol.k_c, float(arr.mean()), sem, tuple(arr.tolist()),
                               float(np.mean([run.accept_rate for run in runs])), {"informed_rows": rows}))
    return points
