"""The bad-input campaign of issue #16, options half: options, outputs, the rank cache and zoo files.

Option and output cases are a table run through the library and through the CLI alike: a typed
``WbfeError`` with a given one-line message from the library; exit 2 and that one line on stderr
(no traceback) from the CLI; and nothing written, nothing scored. Cache and zoo cases check that
a corrupt file is cleared and recomputed, never served and never a crash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner
from wbfe_cli.main import app

import wbfe
from wbfe.errors import (
    InvalidOptionError,
    NothingRankedError,
    OutputError,
    UnknownNameError,
    WbfeError,
)
from wbfe.options import ScoreOptions, StatsOptions, compile_layers
from wbfe.ranking import rank
from wbfe.ranking.cache import ScoreCache, cache_key
from wbfe.render.files import write_atomic


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def assert_one_line(result: Any, text: str) -> None:
    """Exit 2, one ``wbfe: error:`` line holding ``text`` on stderr, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("wbfe: error: "), result.stderr
    assert text in result.stderr, result.stderr
    assert "Traceback" not in result.output + result.stderr


# ----------------------------------------------------------------------------- score options


@dataclass(frozen=True)
class OptionCase:
    name: str
    kwargs: dict[str, Any]  # wbfe.score keywords
    argv: tuple[str, ...]  # the same through `wbfe score`
    error: type[WbfeError]
    message: str
    cli_message: str = ""  # the command line's, where it names the option by its flag


OPTION_CASES = [
    OptionCase("lambda nan", {"lam": "nan"}, ("--lambda", "nan"), InvalidOptionError,
               "lambda must be 'opt' or a positive number, not 'nan'"),
    OptionCase("lambda -1", {"lam": "-1"}, ("--lambda", "-1"), InvalidOptionError,
               "lambda must be 'opt' or a positive number, not '-1'"),
    OptionCase("lambda inf", {"lam": "inf"}, ("--lambda", "inf"), InvalidOptionError,
               "lambda must be 'opt' or a positive number"),
    # The smallest subnormal: 2π/λ overflows, BFE-W was +inf and called "rank-deficient".
    OptionCase("lambda 5e-324", {"lam": "5e-324"}, ("--lambda", "5e-324"), InvalidOptionError,
               "lambda must lie in [1e-300, 1e+300], not '5e-324'"),
    OptionCase("lambda 1e301", {"lam": "1e301"}, ("--lambda", "1e301"), InvalidOptionError,
               "lambda must lie in [1e-300, 1e+300]"),
    OptionCase("device tpu", {"device": "tpu"}, ("--device", "tpu"), InvalidOptionError,
               "device must be auto, cpu or cuda (cuda:N for the N-th GPU), not 'tpu'"),
    OptionCase("seed -1", {"seed": -1}, ("--seed", "-1"), InvalidOptionError,
               "seed must be a non-negative integer below 2**32, not -1"),
    OptionCase("min_eigs 0", {"min_eigs": 0}, ("--min-eigs", "0"), InvalidOptionError,
               "min_eigs must be a positive integer, not 0", "--min-eigs must be a positive integer, not 0"),
    OptionCase("unknown metric", {"metrics": "bfe,nope"}, ("--metrics", "bfe,nope"), UnknownNameError,
               "unknown metric group 'nope'"),
    OptionCase("catastrophic regex", {"layers": "(a+)+$"}, ("--layers", "(a+)+$"), InvalidOptionError,
               "--layers '(a+)+$' is refused: a part of variable length can also match the start of what follows "
               "it inside a repeat, which can take exponential time to match"),
    OptionCase("ambiguous alternatives", {"layers": r"(ab|\wb)*weight$"}, ("--layers", r"(ab|\wb)*weight$"),
               InvalidOptionError, "is refused: two alternatives inside a repeat can start with the same character"),
    OptionCase("invalid regex", {"layers": "("}, ("--layers", "("), InvalidOptionError,
               "--layers is not a valid regular expression"),
]


@pytest.mark.parametrize("case", OPTION_CASES, ids=lambda c: c.name)
def test_score_option_is_refused_before_reading(case: OptionCase, tmp_path: Path) -> None:
    """Refused up front: the checkpoint named does not even exist, and the output is not created."""
    missing = str(tmp_path / "not-there.safetensors")
    with pytest.raises(case.error) as caught:
        wbfe.score(missing, **case.kwargs)
    assert case.message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(case.error):
        ScoreOptions(**{k: v for k, v in case.kwargs.items()})
    out = tmp_path / "out.json"
    assert_one_line(cli("score", missing, *case.argv, "--output", str(out)), case.cli_message or case.message)
    assert not out.exists()


@pytest.mark.parametrize("pattern", [r"layers\.\d+\.mlp", r"(q|k|v)_proj", r"^(?:encoder|decoder)\.",
                                     r"blocks\.(\d{1,3}\.)+weight", r"(a++)+x", r"fc\d*$", r"(?>a+)+b"])
def test_ordinary_layer_patterns_are_accepted(pattern: str) -> None:
    assert compile_layers(pattern) is not None


def test_score_options_object_is_the_keyword_path(st_file: Path) -> None:
    options = ScoreOptions(metrics="bfe", lam="0.5", ww_compatible=True)
    assert options.metrics == ("bfe",) and options.lam == 0.5 and options.conv == "slices"
    by_object = wbfe.score(st_file, options=options).to_dict()
    by_keywords = wbfe.score(st_file, metrics="bfe", lam=0.5, ww_compatible=True).to_dict()
    assert by_object["layers"] == by_keywords["layers"]
    assert by_object["model"]["options"] == options.to_dict()
    with pytest.raises(InvalidOptionError, match="either as options=ScoreOptions"):
        wbfe.score(st_file, options=options, lam=0.25)


def test_overflowing_bfe_is_not_called_rank_deficient() -> None:
    """λ = 1e300 on a spectrum of mean ~1e10: λ/2·mean(e) overflows with no zero eigenvalue."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2e4
    row = wbfe.score({"fc.weight": w}, metrics="bfe", lam=1e300).layers[0]
    assert math.isinf(row["bfe"])
    assert row["reasons"]["bfe"].startswith("BFE-W overflows at lambda = 1e+300"), row["reasons"]


# ----------------------------------------------------------------------------- outputs


def _chattr(path: Path, flag: str) -> bool:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True)
    return done.returncode == 0


@dataclass(frozen=True)
class OutputCase:
    name: str
    build: Callable[[Path], str]  # returns the --output value
    message: str


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "out.fifo")
    return str(tmp / "out.fifo")


def _folder(tmp: Path) -> str:
    (tmp / "folder").mkdir()
    return str(tmp / "folder")


def _proc(tmp: Path) -> str:
    return "/proc/version"  # a regular file of a file system nobody can create files in


OUTPUT_CASES = [
    OutputCase("empty path", lambda tmp: "", "the output path is empty"),
    OutputCase("folder", _folder, "it is a folder, not a regular file"),
    OutputCase("fifo", _fifo, "it is a FIFO, not a regular file"),
    OutputCase("char device", lambda tmp: "/dev/zero", "it is a character device, not a regular file"),  # /dev/null is a legitimate sink (issue 35 §8)
    OutputCase("link to a char device", lambda tmp: (os.symlink("/dev/zero", tmp / "l"), str(tmp / "l"))[1],
               "it is a character device"),
    OutputCase("unwritable file system", _proc, "cannot write /proc/version"),
]


@pytest.mark.parametrize("case", OUTPUT_CASES, ids=lambda c: c.name)
def test_output_that_cannot_be_replaced_is_refused_before_scoring(case: OutputCase, tmp_path: Path) -> None:
    target = case.build(tmp_path)
    before = os.stat(target).st_mode if target and os.path.exists(target) else None
    with pytest.raises(OutputError) as caught:
        write_atomic(target, "x")
    assert case.message in str(caught.value)
    # The CLI refuses before scoring: the checkpoint named does not exist, yet the error is the output's.
    assert_one_line(cli("score", str(tmp_path / "missing.safetensors"), "--output", target), case.message)
    if before is not None:
        assert os.stat(target).st_mode == before  # still a device / FIFO / folder
    assert not list(tmp_path.glob(".*.tmp"))


def test_rank_output_that_is_a_file_is_refused_before_scoring(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("keep")
    result = cli("rank", str(tmp_path / "missing-zoo.csv"), "--output", str(tmp_path / "plain"))
    assert_one_line(result, f"cannot write into {tmp_path / 'plain'}: it is a file, not a folder")
    assert (tmp_path / "plain").read_text() == "keep"


def test_esd_output_to_stdout_is_refused(st_file: Path) -> None:
    assert_one_line(cli("esd", str(st_file), "--layer", "embed.weight", "--output", "-"),
                    "wbfe esd writes a PNG file")


def test_immutable_file_and_folder_are_typed_errors(tmp_path: Path) -> None:
    target = tmp_path / "locked.json"
    target.write_text("old")
    if not _chattr(target, "+i"):
        pytest.skip("chattr +i is not supported on this file system")
    try:
        with pytest.raises(OutputError, match="permission denied"):
            write_atomic(target, "new")
        assert_one_line(cli("score", str(tmp_path / "missing.safetensors"), "--output", str(target)),
                        "permission denied")
        assert target.read_text() == "old"
    finally:
        _chattr(target, "-i")
    folder = tmp_path / "locked"
    folder.mkdir()
    _chattr(folder, "+i")
    try:
        with pytest.raises(OutputError, match="cannot write"):
            write_atomic(folder / "x.json", "new")
    finally:
        _chattr(folder, "-i")


def test_output_writes_through_a_symlink_and_keeps_the_mode(tmp_path: Path, st_file: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    result = cli("score", str(st_file), "--metrics", "bfe", "--format", "json", "--output", str(link))
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["summary"]["bfe_n"] > 0
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert result.stdout == "" and result.stderr.strip() == f"wrote {link}"  # 'wrote' on stderr
    new = tmp_path / "new.json"
    write_atomic(new, "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # as open() would create it, not 0600
    dash = cli("score", str(st_file), "--metrics", "bfe", "--format", "json", "--output", "-")
    assert dash.exit_code == 0 and json.loads(dash.stdout)["summary"]["bfe_n"] > 0


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    target.write_text("old")

    def full_disk(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OutputError, match="cannot write .*No space left on device"):
        write_atomic(target, "new" * 1000)
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


# ----------------------------------------------------------------------------- rank options


def fake_scorer(ref: str, options: Any) -> dict[str, Any]:
    value = float(Path(ref).read_text(encoding="utf-8"))
    return {"summary": {"bfe_head": value}, "model": {"sha256": hashlib.sha256(Path(ref).read_bytes()).hexdigest()}}


class Counting:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, ref: str, options: Any) -> dict[str, Any]:
        self.calls.append(Path(ref).name)
        return fake_scorer(ref, options)


def fake_hash(ref: str) -> str:
    return hashlib.sha256(Path(ref).read_bytes()).hexdigest()


def make_zoo(folder: Path, metric: tuple[float, ...] = (1.2, 1.5, 1.3, 1.9, 1.1)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["model,acc"]
    for i, m in enumerate(metric):
        (folder / f"m{i}.txt").write_text(repr(m), encoding="utf-8")
        lines.append(f"m{i}.txt,{0.9 - 0.1 * i}")
    (folder / "zoo.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "zoo.csv"


RANK_CASES = [
    ("lambda nan", {"lam": "nan"}, ("--lambda", "nan"), "lambda must be 'opt' or a positive number, not 'nan'"),
    ("lambda -1", {"lam": -1.0}, ("--lambda", "-1"), "lambda must be 'opt' or a positive number"),
    ("device tpu", {"device": "tpu"}, ("--device", "tpu"),
     "device must be auto, cpu or cuda (cuda:N for the N-th GPU), not 'tpu'"),
    ("stats seed -1", {"stats_seed": -1}, ("--stats-seed", "-1"), "seed must be a non-negative integer, not -1"),
    ("score seed -1", {"score_seed": -1}, ("--seed", "-1"), "seed must be a non-negative integer below 2**32, not -1"),
    ("n_boot 0", {"n_boot": 0}, ("--n-boot", "0"),
     "n_boot must be a positive integer of at most 10,000,000 (each draw's ρ is kept), not 0"),
    ("unknown metric", {"metrics": "nope"}, ("--metrics", "nope"), "unknown metric group 'nope'"),
]
if not torch.cuda.is_available():
    RANK_CASES.append(("device cuda without one", {"device": "cuda"}, ("--device", "cuda"),
                       "--device cuda was asked for but no CUDA device is available"))
# The command line's line where it names the option by its flag, not the library's keyword.
RANK_CLI = {"n_boot 0": "--n-boot must be a positive integer of at most 10,000,000 (each draw's ρ is kept), not 0",
            "stats seed -1": "--stats-seed must be a non-negative integer, not -1"}


@pytest.mark.parametrize("name,kwargs,argv,message", RANK_CASES, ids=[c[0] for c in RANK_CASES])
def test_rank_options_are_checked_before_any_model_is_scored(
    name: str, kwargs: dict[str, Any], argv: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    spec = make_zoo(tmp_path / "zoo")
    scorer = Counting()
    with pytest.raises(WbfeError) as caught:
        rank(spec, "acc", scorer=scorer, hasher=fake_hash, cache_dir=tmp_path / "cache", **kwargs)
    assert message in str(caught.value) and scorer.calls == []
    assert not (tmp_path / "cache").exists()
    out = tmp_path / "out"
    result = cli("rank", str(spec), "--quiet", "--cache-dir", str(tmp_path / "cache"), "--output", str(out), *argv)
    assert_one_line(result, RANK_CLI.get(name, message))
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_unwritable_cache_folder_is_an_error_before_scoring(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    scorer = Counting()
    with pytest.raises(InvalidOptionError, match="the score cache .* is not writable"):
        rank(spec, "acc", scorer=scorer, hasher=fake_hash, cache_dir=tmp_path / "cache")
    assert scorer.calls == []
    assert_one_line(cli("rank", str(spec), "--quiet", "--cache-dir", str(tmp_path / "cache")),
                    "is not writable")


def test_a_ranking_with_no_metric_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "zoo"
    folder.mkdir()
    # Three models (a ranking needs three quality values before any is scored), none of which can be read.
    (folder / "zoo.csv").write_text("model,acc\nmissing-a.safetensors,0.5\nmissing-b.safetensors,0.7\n"
                                    "missing-c.safetensors,0.6\n")
    with pytest.raises(NothingRankedError, match="no metric could be ranked: 3 of 3 models failed") as caught:
        rank(folder / "zoo.csv", "acc", cache_dir=False, metrics="bfe")
    assert len(caught.value.result.failed) == 3  # type: ignore[attr-defined]
    assert_one_line(cli("rank", str(folder / "zoo.csv"), "--no-cache", "--quiet", "--metrics", "bfe"),
                    "no metric could be ranked")


def test_rank_takes_options_objects(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    a = rank(spec, "acc", score=ScoreOptions(metrics="bfe"), stats=StatsOptions(n_boot=300, seed=4),
             scorer=fake_scorer, hasher=fake_hash, cache_dir=False)
    b = rank(spec, "acc", metrics="bfe", n_boot=300, stats_seed=4, scorer=fake_scorer, hasher=fake_hash, cache_dir=False)
    assert a.to_dict() == b.to_dict()
    assert a.stats == {"n_boot": 300, "level": 0.95, "n_perm": 10_000, "exact_max_n": 8, "seed": 4}
    assert a.options["metrics"] == ["bfe"] and "lambda" in a.options
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        rank(spec, "acc", bogus=1, scorer=fake_scorer, cache_dir=False)


# ----------------------------------------------------------------------------- the rank cache


def _entry_files(cache: Path) -> list[Path]:
    return sorted((cache / "entries").rglob("*.json"))


CACHE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "non-UTF-8 byte": lambda p: p.write_bytes(p.read_bytes().replace(b'"format"', b'"\xff\xfeormat"', 1)),
    "100,000-deep array": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
    "folder in place": lambda p: (p.unlink(), p.mkdir(), (p / "x").write_text("1")),
    "link in place": lambda p: (p.unlink(), p.symlink_to("/etc/hostname")),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("damage", CACHE_DAMAGE, ids=list(CACHE_DAMAGE))
def test_corrupt_cache_entry_is_cleared_and_recomputed(damage: str, tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    first = rank(spec, "acc", metrics="bfe", scorer=Counting(), hasher=fake_hash, cache_dir=tmp_path / "cache")
    entries = _entry_files(tmp_path / "cache")
    assert len(entries) == 5
    CACHE_DAMAGE[damage](entries[0])
    scorer = Counting()
    for _ in range(2):  # every later run works, not only the first after the damage
        again = rank(spec, "acc", metrics="bfe", scorer=scorer, hasher=fake_hash, cache_dir=tmp_path / "cache")
        assert again.to_dict()["metrics"] == first.to_dict()["metrics"]
    assert len(scorer.calls) == 1  # the damaged entry, once
    assert all(p.is_file() and not p.is_symlink() for p in _entry_files(tmp_path / "cache"))
    assert Path("/etc/hostname").exists()  # the link was removed, never its target


def test_edited_hash_index_never_serves_another_models_scores(tmp_path: Path) -> None:
    """The index said m0's content hash is m1's: a checksum mismatch, so m0 is hashed again."""
    spec = make_zoo(tmp_path / "zoo")
    cache = tmp_path / "cache"
    rank(spec, "acc", metrics="bfe", scorer=Counting(), hasher=fake_hash, cache_dir=cache)
    m0, m1 = str(tmp_path / "zoo" / "m0.txt"), str(tmp_path / "zoo" / "m1.txt")
    index = {json.loads(p.read_text())["payload"]["ref"]: p for p in (cache / "hashes").glob("*.json")}
    entry = json.loads(index[m0].read_text())
    entry["payload"]["sha256"] = fake_hash(m1)
    index[m0].write_text(json.dumps(entry))
    result = rank(spec, "acc", metrics="bfe", scorer=Counting(), hasher=fake_hash, cache_dir=cache)
    scores = {m.model: m.scores["bfe_head"] for m in result.models}
    assert scores["m0.txt"] == 1.2 and scores["m1.txt"] == 1.5


def test_same_size_replacement_with_mtime_restored_is_rescored(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    cache = tmp_path / "cache"
    rank(spec, "acc", metrics="bfe", scorer=Counting(), hasher=fake_hash, cache_dir=cache)
    model = tmp_path / "zoo" / "m0.txt"
    st = model.stat()
    model.write_text("9.9")  # same size as "1.2"
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (model.stat().st_size, model.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    scorer = Counting()
    result = rank(spec, "acc", metrics="bfe", scorer=scorer, hasher=fake_hash, cache_dir=cache)
    assert scorer.calls == ["m0.txt"]
    assert {m.model: m.scores["bfe_head"] for m in result.models}["m0.txt"] == 9.9


def test_cache_files_hold_standard_json(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path)
    path = cache.put(cache_key("c", {}), {"summary": {"bfe_head": math.nan, "alpha_head": math.inf}})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert cache.get(cache_key("c", {})) == {"summary": {"bfe_head": None, "alpha_head": None}}


# ----------------------------------------------------------------------------- zoo files


ZOO_FILES: dict[str, tuple[bytes, str]] = {
    "latin-1 byte": (b"model,acc\ncaf\xe9.pt,0.5\n", "is not UTF-8 text (byte 0xe9 at offset 13)"),
    "binary file": (bytes(range(256)) * 4, "is a binary file, not a CSV or YAML table"),
    "more cells than header": (b"model,acc\na.pt,0.5,7\n", "line 2 has more cells than the header"),
}


@pytest.mark.parametrize("case", ZOO_FILES, ids=list(ZOO_FILES))
def test_bad_zoo_file_is_a_typed_error(case: str, tmp_path: Path) -> None:
    data, message = ZOO_FILES[case]
    (tmp_path / "zoo.csv").write_bytes(data)
    with pytest.raises(InvalidOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rank(tmp_path / "zoo.csv", cache_dir=False)
    assert_one_line(cli("rank", str(tmp_path / "zoo.csv"), "--no-cache"), message)


def test_zoo_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "zoo.csv")
    assert_one_line(cli("rank", str(tmp_path / "zoo.csv"), "--no-cache"), "is a FIFO, not a file")


def test_bom_csv_finds_its_model_column(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo")
    spec.write_bytes(b"\xef\xbb\xbf" + spec.read_bytes())  # as Excel saves "CSV UTF-8"
    result = rank(spec, "acc", metrics="bfe", scorer=fake_scorer, hasher=fake_hash, cache_dir=False, n_boot=200)
    assert [m.model for m in result.models] == [f"m{i}.txt" for i in range(5)]


# ----------------------------------------------------------------------------- terminal output


ESC_NAME = "evil\x1b[2J\x1b]0;pwned\x07.weight"


def test_escape_sequences_in_tensor_names_never_reach_the_terminal(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "model.safetensors"
    save_file({ESC_NAME: torch.randn(16, 32, generator=g), "fc.weight": torch.randn(10, 16, generator=g)}, path)
    for fmt in ("table", "csv"):
        result = cli("score", str(path), "--metrics", "bfe", "--format", fmt)
        assert result.exit_code == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout
        assert "evil\\x1b[2J\\x1b]0;pwned\\x07.weight" in result.stdout
    bad = cli("score", str(path), "--metrics", "bfe", "--head", "evil\x1b[31m")
    assert_one_line(bad, "--head 'evil\\x1b[31m'")
    assert "\x1b" not in bad.stderr
    # JSON escapes control characters itself, and keeps the name exact for programs.
    data = json.loads(cli("score", str(path), "--metrics", "bfe", "--format", "json").stdout)
    assert ESC_NAME in {row["name"] for row in data["layers"]}


def test_unknown_name_lists_a_few_names_only() -> None:
    from wbfe.errors import unknown_name

    error = unknown_name("model", "resnet5O", [f"vit_{i:04d}" for i in range(3000)] + ["resnet50"])
    assert len(str(error)) < 200 and "did you mean 'resnet50'" in str(error)
    assert "3001 known names, not listed" in str(error) and len(error.known) == 3001  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- esd


def test_esd_draws_a_truncated_power_law_with_lambda_zero(tmp_path: Path) -> None:
    from wbfe.reporting.plots.esd import fit_esd, plot_esd

    rng = np.random.default_rng(2)
    eigs = np.sort((1.0 - rng.random(400)) ** (-1 / 1.5))  # Pareto tail: the TPL's best Λ is 0
    fits = fit_esd(eigs, 0.5)
    assert fits.truncated.lam == 0.0 and fits.truncated.alpha == pytest.approx(fits.power_law.alpha, rel=1e-12)
    out = plot_esd(eigs, fits, tmp_path / "esd.png")
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank_table_escapes_model_labels_and_reasons(tmp_path: Path) -> None:
    from wbfe_cli.rank import rank_table

    from wbfe.ranking import Failure

    result = rank(make_zoo(tmp_path / "zoo"), "acc", metrics="bfe", scorer=fake_scorer, hasher=fake_hash,
                  cache_dir=False, n_boot=200)
    result.failed.append(Failure("evil\x1b[2Jname", "ValueError: bad \x1b]0;title\x07"))
    shown = rank_table(result)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "evil\\x1b[2Jname: ValueError: bad \\x1b]0;title\\x07" in shown
