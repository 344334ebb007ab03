"""Simulation checks of the teacher–student theory: HMC posterior sampling and Adam students.

Small sizes (d = 30) so the suite stays fast on two cores; the full-size runs are the
``benchmarks/theory`` scripts. Everything runs on the CPU in float64 with one thread.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

from wbfe.errors import InvalidOptionError
from wbfe.theory.hermite import kernel
from wbfe.theory.hmc import hmc_check, make_teacher, run_hmc
from wbfe.theory.student import student_sweep, train_student
from wbfe.theory.teacher_student import readout


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_teacher_is_orthonormal_seeded_and_centred():
    v = readout("power", 5, beta=0.3)
    t = make_teacher(v, d=12, n=50, delta=0.0, n_test=10, seed=3)
    gram = (t.w0 @ t.w0.T / 12).numpy()
    np.testing.assert_allclose(gram, np.eye(5), atol=1e-12)
    again = make_teacher(v, d=12, n=50, delta=0.0, n_test=10, seed=3)
    assert torch.equal(t.x, again.x) and torch.equal(t.y, again.y)
    # Δ = 0: labels are the noiseless centred outputs vᵀσ̃(W⁰x/√d), σ̃ = tanh(2·) − μ₁·id.
    pre = t.x @ t.w0.T / math.sqrt(12)
    mu1 = kernel("tanh2").mu[1]
    expected = (torch.tanh(2 * pre) - mu1 * pre) @ t.v
    assert torch.allclose(t.y, expected, atol=1e-14)


def test_hmc_with_an_uninformative_likelihood_samples_the_prior():
    # Δ huge and one sample: the posterior is the prior, and a sample's Gibbs error/2 is
    # ½(E[σ̃(a·z)²] + g(1)) with a² = ‖w‖²/d ≈ 1, i.e. g(1) up to O(1/d).
    v = readout("dense", 4)
    t = make_teacher(v, d=40, n=1, delta=1e6, n_test=20000, seed=0)
    run = run_hmc(t, delta=1e6, informed_rows=0, warmup=100, samples=1000, leapfrog=10, step_size=0.3, seed=0)
    assert 0.6 < run.accept_rate < 0.9  # the adaptation aims at 0.75
    assert run.w2_mean == pytest.approx(1.0, abs=0.03)  # 100 samples x 160 entries of N(0, 1)
    assert run.gibbs_half == pytest.approx(kernel("tanh2").g1, rel=0.08)


def test_hmc_whose_chain_never_moves_is_refused_not_reported():
    # Δ = 1e-300: every proposal after warm-up was rejected, and the one point the chain sat on was reported as the
    # posterior's Gibbs error (0.0), accept 0.00
    t = make_teacher(readout("power", 5), d=10, n=50, delta=1e-300, n_test=20, seed=0)
    with pytest.raises(InvalidOptionError, match=r"^HMC accepted none of its 20 proposals after warm-up \(seed 0, "
                                                 r"Δ = 1e-300, .*the chain never moved"):
        run_hmc(t, delta=1e-300, informed_rows=0, warmup=20, samples=20, seed=0)


def test_hmc_rejects_bad_options():
    t = make_teacher(readout("power", 3), d=8, n=20, delta=0.04, n_test=10)
    with pytest.raises(InvalidOptionError, match="1 <= every <= samples"):
        run_hmc(t, delta=0.04, informed_rows=0, samples=5, every=10)
    with pytest.raises(InvalidOptionError, match=r"informed_rows must be in \[0, 3\], got 4"):
        run_hmc(t, delta=0.04, informed_rows=4)


def test_hmc_gibbs_error_matches_theory_on_both_sides_of_the_transitions():
    # r = 0.5: below the first transition (k_c = 0); r = 3 and 5: above the last (k_c = k).
    points = hmc_check(r_values=[0.5, 3.0, 5.0], d=30, k=15, delta=0.04, beta=0.3, seeds=(0, 1, 2), warmup=300,
                       samples=150, n_test=10000)
    assert [p.k_c for p in points] == [0, 15, 15]
    for p in points:
        assert 0.5 < p.accept_rate < 0.95
        assert abs(p.gibbs_half / p.eps_theory - 1) < 0.08, p.to_dict()
        if p.r != 0.5:  # r = 0.5 to 2 %: see the next test
            assert abs(p.gibbs_half - p.eps_theory) <= max(3 * p.sem, 0.02 * p.eps_theory), p.to_dict()


@pytest.mark.xfail(strict=False, reason="open: below the first transition HMC's Gibbs error/2 is 2.4-2.6 % under "
                   "the theory (0.1004-0.1006 against 0.1031 over 3 seeds; 2.5 % with chains twice as long), "
                   "outside the 2 % bound; with torch 2.13+cpu the seeds agree (sem 0.0003) and the test fails, "
                   "with 2.14.1+cu130 they spread (sem 0.0012) and 3 sem covers the gap, so it passes. A finite-d "
                   "correction (d = 30) or a bias of the sampler: to be decided")
def test_hmc_below_the_first_transition_to_two_percent():
    (p,) = hmc_check(r_values=[0.5], d=30, k=15, delta=0.04, beta=0.3, seeds=(0, 1, 2), warmup=300, samples=150,
                     n_test=10000)
    assert abs(p.gibbs_half - p.eps_theory) <= max(3 * p.sem, 0.02 * p.eps_theory), p.to_dict()


def test_adam_student_error_is_lowest_near_kc_and_rises_for_wider_students():
    res = student_sweep(widths=[1, 3, 6, 12, 48], d=30, k=30, n=2000, delta=0.05, beta=1.0, epochs=500, lr=0.01)
    assert res.k_c == 5
    errs = dict(zip(res.widths, res.test_error))
    assert res.k_c / 2 <= res.best_width <= 2 * res.k_c
    assert errs[48] > 2 * min(errs.values()) and errs[12] > min(errs.values())
    assert errs[1] > 2 * min(errs.values())
    # no student beats the Bayes-optimal error (which leaves out the learnable linear part)
    assert min(errs.values()) > res.eps_theory


@pytest.mark.parametrize("bad", [dict(delta=math.inf), dict(n=2.5), dict(d=math.inf), dict(v=[math.nan, 1.0])])
def test_make_teacher_refuses_what_would_give_inf_nan_data_or_a_torch_error(bad):
    # delta=inf and a NaN readout gave inf/NaN labels silently; n=2.5 and d=inf raised torch's TypeError
    # (seed=1.5 did too: tests/test_theory_seeds.py)
    options = {"v": readout("power", 3), "d": 8, "n": 20, "delta": 0.04, "n_test": 10, **bad}
    with pytest.raises(InvalidOptionError, match="need whole numbers 1 <= k <= d"):
        make_teacher(options.pop("v"), **options)


@pytest.mark.parametrize("bad", [dict(target_accept=math.nan), dict(target_accept=1.0), dict(step_size=math.inf),
                                 dict(samples=15.5), dict(leapfrog=2.5), dict(delta=math.inf)])
def test_hmc_refuses_options_that_freeze_the_chain_or_are_not_counts(bad):
    # target_accept=nan left a NaN step size and an acceptance of 0, step_size=inf a chain that never moves,
    # a fractional count a TypeError from range()
    t = make_teacher(readout("power", 3), d=8, n=20, delta=0.04, n_test=10)
    with pytest.raises(InvalidOptionError, match="0 < target_accept < 1"):
        run_hmc(t, **{"delta": 0.04, "informed_rows": 0, "warmup": 2, "samples": 20, **bad})
    with pytest.raises(InvalidOptionError, match=r"informed_rows must be in \[0, 3\], got 1.5"):
        run_hmc(t, delta=0.04, informed_rows=1.5)


def test_sweeps_refuse_a_repeated_seed_and_an_infinite_r():
    # a repeated seed averaged copies of one chain (sem 0.0); r=inf raised OverflowError
    # refused by check_each, as HmcSettings refuses it (check_runs' own words for it were a second rule)
    with pytest.raises(InvalidOptionError, match=r"^seeds must not repeat a value, got \[0, 0\]$"):
        hmc_check(r_values=[0.5], seeds=[0, 0])
    with pytest.raises(InvalidOptionError, match=r"r_values must be positive and finite, got \[inf\]"):
        hmc_check(r_values=[math.inf])
    with pytest.raises(InvalidOptionError, match=r"^seeds must not repeat a value, got \[0, 0\]$"):
        student_sweep(widths=[1, 2], seeds=[0, 0])


def test_sweeps_refuse_a_repeated_width_or_r_before_any_run():
    # widths=[2, 2] trained width 2 twice (two equal points), r_values=[0.5, 0.5] ran the same chains twice
    with pytest.raises(InvalidOptionError, match=r"^widths must not repeat a value, got \[2, 2\]$"):
        student_sweep(widths=[2, 2], d=5, k=3, n=20, epochs=1)
    with pytest.raises(InvalidOptionError, match=r"^r_values must not repeat a value, got \[0.5, 0.5\]$"):
        hmc_check(r_values=[0.5, 0.5], d=8, k=3, seeds=[0], warmup=2, samples=10, n_test=10)


def test_student_refuses_a_fractional_width_and_an_infinite_rate():
    # width 2.5 trained width 2 in student_sweep (and a TypeError in train_student); lr=inf returned NaN
    t = make_teacher(readout("power", 3), d=5, n=20, delta=0.05, centred=False, n_test=50)
    for bad in (dict(width=2.5), dict(width=2, lr=math.inf), dict(width=2, epochs=2.5)):
        with pytest.raises(InvalidOptionError, match=r"\(whole numbers, a finite lr\)"):
            train_student(t, **bad)
    with pytest.raises(InvalidOptionError, match=r"^width must be a positive integer, not 3.0$"):
        train_student(t, 3.0)  # trained width 3 (the settings and the sweep refuse it)
    # the sweep refuses its widths before any run, as StudentSettings does (one rule, wbfe.theory.checks.WIDTH)
    with pytest.raises(InvalidOptionError, match=r"^widths must be a positive integer, not 2.5$"):
        student_sweep(widths=[2.5], d=5, k=3, n=20, epochs=2)


@pytest.mark.parametrize(("widths", "seeds", "message"), [
    ([2, 3.0], [0], "widths must be a positive integer, not 3.0"),  # trained width 3 (StudentSettings refused it)
    ([2, 0], [0], "widths must be a positive integer, not 0"),
    ((2, 2), [0], "widths must not repeat a value, got (2, 2)"),
    ([2], [0, 3.0], "seeds must be an integer in [0, 2**32) (the seeds every random generator in wbfe takes), "
                    "not 3.0"),
    ([2], (0, 0), "seeds must not repeat a value, got (0, 0)"),  # the sweep's own words differed
    ([2], [{}], "seeds must be an integer in [0, 2**32) (the seeds every random generator in wbfe takes), "
                "not {}"),  # the sweep's own check raised TypeError (unhashable type: 'dict')
])
def test_student_sweep_refuses_widths_and_seeds_as_its_settings_do(widths, seeds, message):
    from wbfe.theory.settings import StudentSettings

    for build in (lambda: student_sweep(widths=widths, d=5, k=3, n=20, epochs=1, seeds=seeds),
                  lambda: StudentSettings(widths=widths, seeds=seeds)):
        with pytest.raises(InvalidOptionError) as caught:
            build()
        assert str(caught.value) == message


def test_hmc_check_refuses_a_repeated_r_as_its_settings_do():
    from wbfe.theory.settings import HmcSettings

    for build in (lambda: hmc_check(r_values=(0.5, 0.5), seeds=[0]), lambda: HmcSettings(r_values=(0.5, 0.5))):
        with pytest.raises(InvalidOptionError) as caught:
            build()
        assert str(caught.value) == "r_values must not repeat a value, got (0.5, 0.5)"


@pytest.mark.parametrize("bad", [None, "3", [1]])
def test_simulations_refuse_a_non_number(bad):
    # each raised Python's TypeError ("'<' not supported between ...", "unsupported operand type(s)") before
    t = make_teacher(readout("power", 3), d=5, n=20, delta=0.05, n_test=10)
    with pytest.raises(InvalidOptionError, match=rf"need whole numbers 1 <= k <= d.*delta={re.escape(repr(bad))}\)$"):
        make_teacher(readout("power", 3), d=5, n=20, delta=bad, n_test=10)
    for option in ("delta", "step_size", "target_accept"):
        with pytest.raises(InvalidOptionError, match="finite step_size > 0 and delta > 0, and 0 < target_accept < 1$"):
            run_hmc(t, **{"delta": 0.04, "informed_rows": 0, "warmup": 2, "samples": 2, "every": 1, option: bad})
    with pytest.raises(InvalidOptionError, match=r"\(whole numbers, a finite lr\)$"):
        train_student(t, 2, lr=bad)
    with pytest.raises(InvalidOptionError, match=rf"^d and k must be integers >= 1, got d={re.escape(repr(bad))}, k=20$"):
        hmc_check(r_values=[1.0], d=bad)
    for sweep in (lambda: student_sweep(widths=3), lambda: student_sweep(widths=[2], seeds=0),
                  lambda: hmc_check(r_values=1.0), lambda: hmc_check(r_values=[1.0], seeds=0)):
        with pytest.raises(InvalidOptionError, match="must be non-empty lists$"):
            sweep()


def test_sizes_past_memory_are_refused_before_allocating():
    # `wbfe theory hmc --d 1000000000 --k 2` ran past two minutes; `student --widths 1e20` ended in torch's
    # RuntimeError with a C++ backtrace
    with pytest.raises(InvalidOptionError, match=r"1000 training and 20000 test samples of dimension 100000 need 15.6 "
                                                 r"GiB \(limit 4 GiB\); lower n \(r\), n_test or d"):
        make_teacher(readout("power", 2), d=100_000, n=1000, delta=0.04)
    t = make_teacher(readout("power", 3), d=5, n=20, delta=0.05, centred=False, n_test=80)
    with pytest.raises(InvalidOptionError, match=r"the activations of width 10000000 on 100 samples need 7.5 GiB"):
        train_student(t, 10**7)


def test_student_training_is_seeded():
    t = make_teacher(readout("power", 6, beta=1.0), d=10, n=200, delta=0.05, centred=False, n_test=500, seed=1)
    a = train_student(t, 3, epochs=30, seed=2)
    b = train_student(t, 3, epochs=30, seed=2)
    assert a == b and math.isfinite(a)
    with pytest.raises(InvalidOptionError, match="width, epochs and batches must be >= 1"):
        train_student(t, 0)


def test_student_batches_partition_the_samples_with_none_empty():
    # ceil(n / batches)-sized slices left the last batches empty (200 samples in 90 batches: 23 empty), and
    # each still took an Adam step, moving the weights by momentum alone.
    t = make_teacher(readout("power", 6, beta=1.0), d=10, n=200, delta=0.05, centred=False, n_test=500, seed=1)
    rows: list[int] = []

    def act(z):
        rows.append(int(z.shape[0]))
        return t.act(z)

    train_student(dataclasses.replace(t, act=act), 3, epochs=2, batches=90, seed=2)
    expected = [len(part) for part in np.array_split(np.arange(200), 90)]
    assert rows == expected * 2 + [500]  # two epochs of 90 batches, then the test error on x_test
    with pytest.raises(InvalidOptionError, match="batches must be at most the 200 training samples, not 201"):
        train_student(t, 3, batches=201)


@pytest.mark.slow
def test_hmc_full_size_both_sides_and_inside_the_staircase():
    # d = 60 with the parameters of benchmarks/theory/hmc_check.py. Below the first transition
    # (r = 0.5) and above the last (r = 5) the Gibbs error/2 agrees with ε^BO within the sampling
    # error; inside the staircase (r = 2, k_c = 8 of 30) it sits 5-11 % below at this size
    # (measured: −10.7 %), which this test pins so that a change is noticed.
    points = hmc_check(r_values=[0.5, 2.0, 5.0], d=60, k=30, delta=0.04, beta=0.3, seeds=(0, 1), warmup=1500,
                       samples=500)
    outside, inside = [points[0], points[2]], points[1]
    for p in outside:
        assert abs(p.z) < 3 and abs(p.gibbs_half / p.eps_theory - 1) < 0.03, p.to_dict()
    assert -0.15 < inside.gibbs_half / inside.eps_theory - 1 < 0.0, inside.to_dict()


@pytest.mark.slow
def test_student_full_size_sweep():
    # as benchmarks/theory/student_widths.py at n = 2000
    res = student_sweep(widths=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48], d=30, k=30, n=2000, delta=0.05, beta=1.0,
                        seeds=(0, 1), epochs=2000)
    assert res.k_c / 2 <= res.best_width <= 2 * res.k_c
    assert res.test_error[-1] > 3 * min(res.test_error)


def test_make_teacher_refuses_an_activation_without_a_torch_form():
    # a numpy callable has no torch form: the simulations draw in torch
    with pytest.raises(InvalidOptionError, match="^activation 'custom' has no torch form; use a named one$"):
        make_teacher(readout("power", 3), d=8, n=20, delta=0.04, activation=lambda x: np.tanh(x))


@pytest.mark.parametrize("sweep", [lambda: hmc_check(r_values=[1.0], seeds=[0, [1]]),
                                   lambda: hmc_check(r_values=[1.0, [2.0]]),
                                   lambda: student_sweep(widths=[2], seeds=[0, [1]]),
                                   lambda: student_sweep(widths=[2, [3]])])
def test_sweeps_refuse_a_ragged_list_in_one_line(sweep):
    # numpy's "inhomogeneous shape" ValueError escaped before (np.ndim of a ragged list)
    with pytest.raises(InvalidOptionError, match="^(r_values|widths) and seeds must be non-empty lists$"):
        sweep()


def test_a_student_whose_training_diverges_is_refused_not_ranked() -> None:
    # lr 1e300 (finite, accepted) drove the weights to inf and the test error to NaN: the sweep printed "nan" for every
    # width and named the first one best_width (argmin of NaNs), exit 0
    t = make_teacher(readout("power", 3), d=5, n=20, delta=0.05, centred=False, n_test=50)
    with pytest.raises(InvalidOptionError, match=r"^the student of width 2 \(seed 0\) diverged: its test error is nan "
                                                 r"after 5 epochs at lr 1e\+300; lower the learning rate$"):
        train_student(t, 2, epochs=5, lr=1e300)
    assert math.isfinite(train_student(t, 2, epochs=5, lr=0.01))


def test_hmc_names_an_r_that_gives_no_sample_and_words_a_huge_n_short():
    # r = 1e-300 rounds to n = 0: "n must be a positive finite number, got 0" named an n nobody gave; r = 1e300 printed
    # its n and the GiB it needs (8e300 x 4 x 8 bytes / 2**30 = 2.38e293) as 300-digit integers
    with pytest.raises(InvalidOptionError, match=r"^r = 1e-300 gives n = round\(r\*k\*d\) = 0 samples \(k=2, d=4\): "
                                                 r"raise r$"):
        hmc_check(r_values=[1e-300], d=4, k=2, seeds=[0])
    with pytest.raises(InvalidOptionError, match=r"^8e\+300 training and 20000 test samples of dimension 4 need "
                                                 r"2\.38e\+293 GiB \(limit 4 GiB\); lower n \(r\), n_test or d$"):
        hmc_check(r_values=[1e300], d=4, k=2, seeds=[0])
