"""wbfe.ranking.cache_admin and ``wbfe cache``: sizes per kind, pruning by age and to a size bound (least recently
used first), and never touching what wbfe did not write or what lies behind a symbolic link."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from wbfe.errors import InvalidOptionError
from wbfe.ranking.cache import ScoreCache, cache_key
from wbfe.ranking.cache_admin import DEFAULT_MAX_SIZE, cache_info, format_size, parse_size, prune_cache

NOW = 2_000_000_000.0
DAY = 86400.0


def _age(path: Path, days: float, now: float = NOW) -> None:
    t = now - days * DAY
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(root, name), (t, t), follow_symlinks=False)
    os.utime(path, (t, t), follow_symlinks=False)


def _key(i: int) -> str:
    return cache_key(f"sha-{i}", {"metrics": ["bfe"]})


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """Three score entries (1, 5, 9 days unused), one hash index file, two object copies of 1000 and
    3000 bytes (2 and 20 days unused), a stale partial copy, a stale claim and files wbfe did not write."""
    root = tmp_path / "cache"
    store = ScoreCache(root)
    for i, days in enumerate((1, 5, 9)):
        _age(store.put(_key(i), {"bfe": float(i)}), days)
    store.content_hash(str(tmp_path), lambda _ref: "abc")  # a folder reference: one index file
    _age(next((root / "hashes").iterdir()), 3)
    for name, size, days in (("a" * 64, 1000, 2), ("b" * 64, 3000, 20)):
        copy = root / "objects" / name[:2] / name
        copy.mkdir(parents=True)
        (copy / "model.safetensors").write_bytes(b"x" * size)
        _age(copy, days)
    part = root / "objects" / "cc" / f".{'c' * 64}.0123456789ab.part"
    part.mkdir(parents=True)
    (part / "model.safetensors").write_bytes(b"y" * 10)
    _age(part, 2)
    dead = {"pid": 2**22 + 12345, "host": os.uname().nodename, "token": "t", "time": 0}  # no such pid
    claim = store.claim_path(_key(7))
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(json.dumps(dead))
    (root / "README.txt").write_text("mine")
    return root


def test_info_counts_and_sizes_every_kind(cache: Path) -> None:
    info = cache_info(cache).to_dict()
    kinds = info["kinds"]
    entry_bytes = sum(p.stat().st_size for p in (cache / "entries").rglob("*.json"))
    assert (kinds["entries"]["count"], kinds["entries"]["bytes"]) == (3, entry_bytes)
    assert (kinds["objects"]["count"], kinds["objects"]["bytes"]) == (2, 4000)
    assert (kinds["partial"]["count"], kinds["partial"]["bytes"]) == (1, 10)
    assert kinds["hashes"]["count"] == 1 and kinds["claims"]["count"] == 1
    assert info["other_bytes"] == 4 and info["default_max_bytes"] == DEFAULT_MAX_SIZE
    assert kinds["objects"]["oldest_use"] == pytest.approx(NOW - 20 * DAY)


def test_prune_older_than_removes_only_what_is_old(cache: Path) -> None:
    report = prune_cache(cache, max_size=None, older_than=4.0, now=NOW)
    removed = sorted((u.kind, u.path.name) for u in report.removed)
    assert removed == sorted([("entries", f"{_key(1)}.json"), ("entries", f"{_key(2)}.json"),
                              ("objects", "b" * 64), ("claims", f"{_key(7)}.claim"),
                              ("partial", f".{'c' * 64}.0123456789ab.part")])  # a partial copy goes after a day
    assert (cache / "entries" / _key(0)[:2] / f"{_key(0)}.json").is_file()
    assert (cache / "objects" / "aa" / ("a" * 64)).is_dir() and not (cache / "objects" / "bb" / ("b" * 64)).exists()
    assert (cache / "README.txt").read_text() == "mine"
    assert ScoreCache(cache).get(_key(0)) == {"bfe": 0.0}


def test_prune_to_a_size_bound_goes_least_recently_used_first(cache: Path) -> None:
    before = cache_info(cache)
    claim = ScoreCache(cache).claim_path(_key(7)).stat().st_size
    oldest_entry = (cache / "entries" / _key(2)[:2] / f"{_key(2)}.json").stat().st_size
    # the stale claim and the day-old partial copy go first; then the 3000-byte copy (20 days unused)
    # and the 9-day entry are the oldest, and removing both is just enough
    bound = before.total - claim - 10 - 3000 - oldest_entry
    report = prune_cache(cache, max_size=bound, now=NOW, dry_run=True)
    assert sorted(u.path.name for u in report.removed) == sorted(
        [f"{_key(7)}.claim", f".{'c' * 64}.0123456789ab.part", "b" * 64, f"{_key(2)}.json"])
    names = [u.path.name for u in report.removed]
    assert [u.path.name for u in prune_cache(cache, max_size=bound + 1, now=NOW, dry_run=True).removed] == names
    assert len(prune_cache(cache, max_size=bound - 1, now=NOW, dry_run=True).removed) == 5
    assert cache_info(cache).total == before.total  # dry run
    report = prune_cache(cache, max_size=bound, now=NOW)
    assert cache_info(cache).total <= bound and report.kept_bytes == cache_info(cache).total


def test_links_are_never_followed_or_removed(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"z" * 50)
    _age(outside, 100)
    (cache / "objects" / "dd").mkdir()
    (cache / "objects" / "dd" / ("d" * 64)).symlink_to(outside)  # a copy that is a link
    (cache / "objects" / "ee").symlink_to(outside)  # a shard folder that is a link
    info = cache_info(cache)
    assert info.links == 2 and all("precious" not in str(u.path) for u in info.units)
    prune_cache(cache, max_size=0, older_than=0, now=NOW)
    assert (outside / "model.safetensors").read_bytes() == b"z" * 50
    assert (cache / "objects" / "dd" / ("d" * 64)).is_symlink() and (cache / "objects" / "ee").is_symlink()
    assert cache_info(cache).total == 0 and (cache / "README.txt").is_file()


def test_live_claims_survive_and_hits_refresh_last_use(tmp_path: Path) -> None:
    store = ScoreCache(tmp_path)
    held = store.claim(_key(1))
    assert held is not None
    path = store.put(_key(2), {"x": 1})
    _age(path, 30, now=time.time())
    assert store.get(_key(2)) == {"x": 1}  # the hit marks it used now
    report = prune_cache(tmp_path, max_size=None, older_than=1.0)
    assert report.removed == [] and store.claim_path(_key(1)).is_file()
    held.release()


@pytest.mark.parametrize("text, value", [("0", 0), ("512", 512), ("1K", 1024), ("1.5G", 3 * 2**29),
                                         ("20GiB", 20 * 2**30), ("2 gb", 2 * 2**30), (7, 7)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "-1G", "lots", "1X", "inf"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(InvalidOptionError, match="not a size"):
        parse_size(bad)


def test_format_size() -> None:
    assert [format_size(n) for n in (12, 1536, 20 * 2**30)] == ["12 B", "1.5 KiB", "20.0 GiB"]


def test_rays_progress_prints_sizes_as_the_cache_does() -> None:
    # One size format for the cache's tables and Ray's progress lines: the latter printed decimal "1.6 MB of 3.1 MB".
    from wbfe.executors.ray_cluster import Progress

    line = Progress(total=2, what="parts", total_bytes=3 * 2**20).step("node n", 3 * 2**19)
    assert line.startswith(" on node n (1/2 parts by Ray, 1.5 MiB of 3.0 MiB, ETA ")


def _cli() -> typer.Typer:
    from wbfe_cli.cache import app

    return app


def test_cli_info_and_prune(cache: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(_cli(), ["info", "--cache-dir", str(cache), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["kinds"]["objects"]["bytes"] == 4000
    table = runner.invoke(_cli(), ["info", "--cache-dir", str(cache)])
    assert "\n  objects           2     3.9 KiB, last used " in table.stdout
    pruned = runner.invoke(_cli(), ["prune", "--cache-dir", str(cache), "--older-than", "10000"])
    assert pruned.exit_code == 0, pruned.output
    # ages are relative to the fixture's NOW (2033): nothing is 10000 days old; the dead claim goes
    assert pruned.stdout.startswith("removed 1 claims (") and (cache / "objects" / "bb").is_dir()
    gone = runner.invoke(_cli(), ["prune", "--cache-dir", str(cache), "--max-size", "0", "--format", "json"])
    data = json.loads(gone.stdout)
    # everything goes but the partial copy, which may still be being fetched (it is not a day old)
    assert data["kept_bytes"] == 10 and cache_info(cache).total == 10 and (cache / "README.txt").is_file()


def test_cli_bad_size_is_one_line(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wbfe_cli.main import app as main_app

    if "cache" not in {g.name for g in main_app.registered_groups}:  # until cli/main.py registers the group
        monkeypatch.setattr(main_app, "registered_groups", list(main_app.registered_groups))  # restored after
        main_app.add_typer(_cli(), name="cache")
    out = CliRunner().invoke(main_app, ["cache", "prune", "--cache-dir", str(cache), "--max-size", "lots"])
    assert out.exit_code == 2 and out.stderr.strip() == "wbfe: error: not a size: 'lots' (e.g. 500M, 20G, 1.5T)"


def test_a_cache_this_user_cannot_write_is_refused_in_one_line(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared cache owned by someone else: the first removal raised PermissionError (a traceback)."""
    def denied(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("wbfe.ranking.cache_admin.clear_path", denied)
    before = cache_info(cache).total
    with pytest.raises(InvalidOptionError, match=r"cannot remove .* \(Permission denied\): prune a cache folder"):
        prune_cache(cache, max_size=0, older_than=0, now=NOW)
    assert cache_info(cache).total == before


def test_a_missing_folder_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped --cache-dir showed an empty cache as if it existed, and prune 'removed nothing' from it."""
    runner = CliRunner()
    missing = tmp_path / "no" / "such"
    table = runner.invoke(_cli(), ["info", "--cache-dir", str(missing)])
    assert table.exit_code == 0 and table.stdout.splitlines()[1] == "  note: this folder does not exist"
    data = json.loads(runner.invoke(_cli(), ["info", "--cache-dir", str(missing), "--format", "json"]).stdout)
    assert data["exists"] is False and data["total_bytes"] == 0
    with pytest.raises(InvalidOptionError, match=r"^no such cache folder: .*such: give the folder"):
        prune_cache(missing)
    assert not missing.exists()
    monkeypatch.setenv("WBFE_CACHE_DIR", str(missing))  # wbfe's own folder before first use: not an error
    table = runner.invoke(_cli(), ["info"])
    assert table.exit_code == 0 and table.stdout.splitlines()[1] == "  not created yet (wbfe creates it on first use)"
    pruned = runner.invoke(_cli(), ["prune"])
    assert pruned.exit_code == 0
    assert pruned.stdout == f"nothing to prune: {missing} is not created yet (wbfe creates it on first use)\n"
    assert cache_info(tmp_path).exists is True and not missing.exists()


def test_a_cache_folder_named_with_an_escape_sequence_is_printed_escaped(tmp_path: Path) -> None:
    """``cache info`` and ``cache prune`` print the folder's name: its escape sequence is shown, not obeyed."""
    folder = tmp_path / "c\x1b[1m"
    folder.mkdir()
    runner = CliRunner()
    for argv in (["info"], ["prune", "--older-than", "1", "--dry-run"], ["prune", "--max-size", "0"]):
        out = runner.invoke(_cli(), [*argv, "--cache-dir", str(folder)])
        assert out.exit_code == 0, out.output
        assert "\x1b" not in out.stdout and "c\\x1b[1m" in out.stdout


def _main_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    from wbfe_cli.main import app as main_app

    if "cache" not in {g.name for g in main_app.registered_groups}:  # until cli/main.py registers the group
        monkeypatch.setattr(main_app, "registered_groups", list(main_app.registered_groups))  # restored after
        main_app.add_typer(_cli(), name="cache")
    return main_app


def test_max_size_none_alone_removes_what_every_prune_removes(cache: Path) -> None:
    """``--max-size none`` without ``--older-than`` was refused as "prunes nothing", but stale claims (and day-old
    partial copies) go in every prune: it is now no size bound and no age, as ``--older-than`` alone is no size
    bound."""
    out = CliRunner().invoke(_cli(), ["prune", "--cache-dir", str(cache), "--max-size", "none", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["max_bytes"], data["older_than_days"]) == (None, None)
    # the dead claim goes (the fixture's ages are relative to 2033: the partial copy is not a day old now)
    assert [(u["kind"], Path(u["path"]).name) for u in data["removed"]] == [("claims", f"{_key(7)}.claim")]
    assert len(list((cache / "entries").rglob("*.json"))) == 3 and (cache / "objects" / "bb" / ("b" * 64)).is_dir()


def test_a_negative_age_names_the_option(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = "--older-than must be a non-negative number of days, not -1"
    with pytest.raises(InvalidOptionError, match=f"^{line}$"):
        prune_cache(cache, older_than=-1, now=NOW)
    out = CliRunner().invoke(_main_app(monkeypatch), ["cache", "prune", "--cache-dir", str(cache), "--older-than", "-1"])
    assert out.exit_code == 2 and out.stderr == f"wbfe: error: {line}\n", out.output
    assert len(list((cache / "entries").rglob("*.json"))) == 3  # refused before anything went
