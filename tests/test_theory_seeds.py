"""Every theory entry point that draws random numbers takes the same seeds, [0, 2**32), and refuses any other
with the same typed line, before any work (wbfe.theory.checks.check_seed)."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from wbfe.errors import WbfeError
from wbfe.theory import hierarchical as hier
from wbfe.theory.hmc import hmc_check, make_teacher, run_hmc
from wbfe.theory.settings import HmcSettings, StudentSettings
from wbfe.theory.student import student_sweep, train_student
from wbfe.theory.teacher_student import readout
from wbfe_cli.main import app

pytestmark = pytest.mark.usefixtures("one_torch_thread", "one_blas_thread")

WORDS = "must be an integer in [0, 2**32) (the seeds every random generator in wbfe takes), not "


def _teacher():
    return make_teacher(readout("power", 3), d=5, n=20, delta=0.05, n_test=10)


def _data():
    return hier.sample_data(hier.make_teacher(6, p=3), 50, seed=0)


# Each draws with `seed` (or a list holding it after a good one), at sizes that run in well under a second.
ENTRY_POINTS = {
    "hmc.make_teacher": lambda s: make_teacher(readout("power", 3), d=8, n=20, delta=0.04, n_test=10, seed=s),
    "hmc.run_hmc": lambda s: run_hmc(_teacher(), delta=0.05, informed_rows=0, warmup=2, samples=2, every=1, seed=s),
    "hmc.hmc_check": lambda s: hmc_check(r_values=[0.5], d=8, k=3, seeds=[0, s], warmup=2, samples=10, n_test=10),
    "HmcSettings": lambda s: HmcSettings(seeds=(0, s)),
    "student.train_student": lambda s: train_student(_teacher(), 2, epochs=1, seed=s),
    "student.student_sweep": lambda s: student_sweep(widths=[2], d=5, k=3, n=20, epochs=1, seeds=[0, s]),
    "StudentSettings": lambda s: StudentSettings(seeds=(s,)),
    "hierarchical.make_teacher": lambda s: hier.make_teacher(6, seed=s),
    "hierarchical.sample_data": lambda s: hier.sample_data(hier.make_teacher(6), 10, seed=s),
    "hierarchical.top_eigenpairs": lambda s: hier.top_eigenpairs(*_data(), 3, solver="eigsh", seed=s),
    "hierarchical.fit_spectral": lambda s: hier.fit_spectral(*_data(), 3, solver="dense", seed=s),
    "HierarchicalSettings": lambda s: hier.HierarchicalSettings(d=6, seed=s),
    "simulate_hierarchical": lambda s: hier.simulate_hierarchical(d=6, p=2, alpha_min=1.5, alpha_max=2.0, points=2,
                                                                  seeds=1, kernel_max_n=0, n_test=20, seed=s),
}


@pytest.mark.parametrize("seed", [2**64, 2**32, -1, 1.5, math.nan, None, "3", True])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_refuses_the_same_bad_seed(entry, seed) -> None:
    # make_teacher(seed=2**64) ended in torch's ValueError (2**32..2**64: accepted here, refused by `wbfe score`);
    # top_eigenpairs, the hierarchical draws and their settings took any seed >= 0, the sweeps' settings < 2**63
    name = "seeds" if entry in ("hmc.hmc_check", "student.student_sweep", "HmcSettings", "StudentSettings") else "seed"
    with pytest.raises(WbfeError) as caught:
        ENTRY_POINTS[entry](seed)
    assert str(caught.value) == f"{name} {WORDS}{seed!r}"


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_every_entry_point_takes_the_largest_seed(entry) -> None:
    # 2**32 - 1 is the largest seed of `wbfe score --seed`: every theory draw takes it too. Every one follows
    # wbfe.options' Integer rule, as `wbfe score --seed` does: a float is refused, even a whole one (the library's
    # draws took 3.0 as 3, where their settings refused it)
    ENTRY_POINTS[entry](2**32 - 1)
    name = "seeds" if entry in ("hmc.hmc_check", "student.student_sweep", "HmcSettings", "StudentSettings") else "seed"
    with pytest.raises(WbfeError) as caught:
        ENTRY_POINTS[entry](3.0)
    assert str(caught.value) == f"{name} {WORDS}3.0"


@pytest.mark.parametrize("args", [["hmc", "--seeds", "0,4294967296"], ["student", "--seeds", "4294967296"],
                                  ["hierarchical", "--d", "6", "--seed", "4294967296"]])
def test_cli_refuses_a_seed_past_32_bits_with_one_line(args, tmp_path) -> None:
    res = CliRunner().invoke(app, ["theory", *args, "--output", str(tmp_path / "out")])
    assert res.exit_code == 2
    name = "seeds" if "--seeds" in args else "seed"
    assert res.stderr.strip().splitlines() == [f"wbfe: error: {name} {WORDS}4294967296"]
    assert not (tmp_path / "out").exists()
