"""Find the checkpoints of one training run and the step each one was saved at (docs/watch.md, "How a run is
read")."""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Optional, Union

from wbfe._config import user_path
from wbfe.errors import InvalidOptionError, SourceNotFoundError
from wbfe.sources import CHECKPOINT_SUFFIXES
from wbfe.sources.tables import read_csv_table

__all__ = ["CheckpointRef", "Run", "parse_step", "discover_run", "run_from_rows", "WEIGHT_SUFFIXES",
           "trainer_state_metrics", "STEP_ROUTES"]

WEIGHT_SUFFIXES = CHECKPOINT_SUFFIXES  # the readers' one list (no .json: a config is no checkpoint)
_KEYWORD = re.compile(r"(?:global_step|checkpoint|iteration|epoch|step|ckpt|iter)s?[-_.=@ ]?0*(\d+)", re.I)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")  # a decimal (a metric in the name) is one token, not two numbers


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint of a run: its step, anything :func:`wbfe.score` accepts, and its test metrics (NaN: unknown)."""

    step: int
    ref: object
    test_loss: float = math.nan
    test_accuracy: float = math.nan


@dataclass(frozen=True)
class Run:
    """The checkpoints of one run, in increasing step order."""

    name: str
    checkpoints: tuple[CheckpointRef, ...]

    @property
    def has_test_loss(self) -> bool:
        """Whether every checkpoint has a finite test loss."""
        return all(math.isfinite(c.test_loss) for c in self.checkpoints)


def _name_stem(name: str) -> str:
    name = name.rstrip("/")
    name = (Path(name).name if "/" in name else name).removesuffix(".index.json")
    suffix = next((s for s in WEIGHT_SUFFIXES if name.lower().endswith(s)), "")
    return name[: len(name) - len(suffix)]


def _numbers(stem: str) -> tuple[list[int], bool]:
    """The whole numbers of a name, and whether it also holds a decimal number (a metric)."""
    tokens = _NUMBER.findall(stem)
    return [int(t) for t in tokens if "." not in t], any("." in t for t in tokens)


def parse_step(name: str, pattern: Optional[re.Pattern[str]] = None) -> Optional[int]:
    """The step in a checkpoint's file, folder or revision name (the rule: docs/watch.md), or None; ``pattern``:
    a compiled ``--step-pattern``, whose first group or whole match holds it."""
    stem = _name_stem(name)
    if pattern is not None:
        match = pattern.search(stem)
        if match is None:
            return None
        text = next((g for g in match.groups() if g is not None), match.group(0))
        digits = re.search(r"\d+", text)
        return int(digits.group(0)) if digits else None
    keyed = _KEYWORD.findall(stem)
    if keyed:
        return int(keyed[-1])
    whole, metric = _numbers(stem)
    return (whole[0] if metric else whole[-1]) if whole else None


STEP_ROUTES = ("pass --step-pattern REGEX (its first group is the step, e.g. 'epoch(\\d+)'), or list the "
               "checkpoints in a run CSV with step and checkpoint columns")


def _folder_steps(folder: Path, paths: list[Path]) -> dict[Path, int]:
    """Per name, the step: by keyword or Keras rule, else the one whole-number position that varies."""
    steps: dict[Path, int] = {}
    plain: dict[int, list[tuple[Path, list[int]]]] = {}
    for path in paths:
        stem = _name_stem(path.name)
        whole, metric = _numbers(stem)
        if _KEYWORD.search(stem) or metric or len(whole) <= 1:
            step = parse_step(path.name)
            if step is not None:
                steps[path] = step
        else:
            plain.setdefault(len(whole), []).append((path, whole))
    for count, group in plain.items():
        varying = [i for i in range(count) if len({w[i] for _, w in group}) > 1]
        if len(varying) > 1:
            examples = ", ".join(p.name for p, _ in group[:2])
            raise InvalidOptionError(f"{folder}: ambiguous checkpoint names ({examples}: more than one number "
                                     f"changes between names); {STEP_ROUTES}")
        position = varying[0] if varying else count - 1
        steps.update({p: w[position] for p, w in group})
    return steps


def _is_checkpoint(path: Path) -> bool:
    if path.is_dir():
        return any(p.is_file() and p.name.endswith(WEIGHT_SUFFIXES + (".index.json",)) for p in path.iterdir())
    return path.is_file() and path.name.lower().endswith(WEIGHT_SUFFIXES)


def _float(value: Optional[str]) -> float:
    try:
        number = float(value) if value and value.strip() else math.nan
    except ValueError:
        raise InvalidOptionError(f"not a number in a run CSV: {value!r}") from None
    if math.isinf(number):  # a test loss of -inf was the run's best checkpoint
        raise InvalidOptionError(f"not a finite number in a run CSV: {value!r} (leave the cell empty when unknown)")
    return number


def _int_step(value: object, where: str) -> int:
    """A whole-number step from CSV text (``12``, ``12.0``) or a JSON number, exactly (no detour through a float)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        with contextlib.suppress(ValueError):  # past Python's 4,300-digit limit: refused below, as not finite
            return int(value)
    step = value if isinstance(value, float) else math.nan
    with contextlib.suppress(ValueError):
        step = float(value) if isinstance(value, str) else step
    if not (math.isfinite(step) and step == int(step)):
        raise InvalidOptionError(f"{where}: step {value!r} is not an integer")
    return int(step)


def _ordered(name: str, found: dict[int, CheckpointRef]) -> Run:
    if not found:
        raise SourceNotFoundError(f"{name}: no checkpoints found", path=name)
    steps: dict[str, int] = {}
    for step in sorted(found):  # a copied CSV row, or a link to another step's file: one model seen as two steps
        ref = found[step].ref
        real = os.path.realpath(ref) if isinstance(ref, str) and os.path.exists(ref) else None
        if real in steps:
            raise InvalidOptionError(f"{name}: steps {steps[real]} and {step} are the same checkpoint ({real}); "
                                     "each step needs its own")
        if real is not None:
            steps[real] = step
    return Run(name=name, checkpoints=tuple(found[s] for s in sorted(found)))


def _add(found: dict[int, CheckpointRef], item: CheckpointRef, where: str) -> None:
    if item.step in found:
        raise InvalidOptionError(f"{where}: two checkpoints have step {item.step} ({found[item.step].ref} and "
                                 f"{item.ref})")
    found[item.step] = item


def _folder_checkpoints(folder: Path, pattern: Optional[re.Pattern[str]] = None) -> dict[int, Path]:
    entries = sorted(folder.iterdir())
    broken = [p.name for p in entries if p.name.lower().endswith(WEIGHT_SUFFIXES) and not p.exists()]
    if broken:  # a checkpoint whose link points nowhere was left out of the run without a word
        raise InvalidOptionError(f"{folder / broken[0]} is a broken link: a checkpoint of the run cannot be read; "
                                 "restore its target or remove the link", path=str(folder / broken[0]))
    paths = [p for p in entries if _is_checkpoint(p)]
    parsed: dict[Path, Optional[int]] = ({p: parse_step(p.name, pattern) for p in paths} if pattern is not None
                                         else dict(_folder_steps(folder, paths)))
    by_step: dict[int, Path] = {}
    for path in paths:
        step = parsed.get(path)
        if step in by_step:
            raise InvalidOptionError(f"{folder}: two checkpoints have step {step} ({by_step[step].name} and "
                                     f"{path.name}); {STEP_ROUTES}")
        if step is not None:
            by_step[step] = path
    unparsed = [p.name for p in paths if parsed.get(p) is None]
    if unparsed:
        how = f" with --step-pattern {pattern.pattern!r}" if pattern is not None else ""
        raise InvalidOptionError(f"{folder}: cannot parse a step from {', '.join(unparsed[:3])}"
                                 f"{' ...' if len(unparsed) > 3 else ''}{how} (put the step in the name, e.g. "
                                 "epoch_3.pt, or list the checkpoints in a CSV with a step column)")
    return by_step


def read_csv(path: Union[str, Path], *, required: str, kind: str) -> list[dict[str, str]]:
    """The rows of a CSV (read as :func:`wbfe.sources.tables.read_csv_table`: its errors), refused without column
    ``required`` or without rows."""
    path = Path(path)
    fields, rows = read_csv_table(path, f"{kind} CSV")
    if required not in fields:
        raise InvalidOptionError(f"{path}: a {kind} CSV needs a {required!r} column (found: "
                                 f"{', '.join(fields) or 'none'})")
    if not rows:
        raise InvalidOptionError(f"{path}: the CSV has no rows")
    return rows


def run_from_rows(path: Path, rows: list[dict[str, str]], name: str, pattern: Optional[re.Pattern[str]] = None) -> Run:
    """A run from the rows of CSV ``path`` (``step``, optional ``checkpoint`` relative to its folder, ``test_loss``,
    ``test_accuracy``); without ``checkpoint``, the files beside the CSV are read by step (``pattern``: as in
    :func:`parse_step`).

    Raises:
        InvalidOptionError: a non-integer step, two rows with one step or one checkpoint, a non-numeric metric.
        SourceNotFoundError: no checkpoint for a step.
    """
    found: dict[int, CheckpointRef] = {}
    beside = None
    for i, row in enumerate(rows, start=2):
        step = _int_step(row.get("step"), f"{path}:{i}")
        target = row.get("checkpoint") or ""
        ref: object
        if target:
            from wbfe.sources.hub import HUB_ID

            local = path.parent / target  # an absolute target replaces the folder
            # A relative path that is not there but reads as org/name[@rev] is a hub id.
            ref = target if (not os.path.exists(local) and HUB_ID.match(target)) else str(local)
        else:
            beside = _folder_checkpoints(path.parent, pattern) if beside is None else beside
            if step not in beside:
                raise SourceNotFoundError(f"{path}:{i}: no checkpoint for step {step} next to the CSV (and no "
                                          "'checkpoint' column)", path=str(path))
            ref = str(beside[step])
        _add(found, CheckpointRef(step, ref, _float(row.get("test_loss")), _float(row.get("test_accuracy"))), str(path))
    return _ordered(name, found)


def _from_hub_list(text: str, pattern: Optional[re.Pattern[str]]) -> Run:
    from wbfe.sources.hub import HUB_ID

    found: dict[int, CheckpointRef] = {}
    repo = ""
    for part in (p.strip() for p in text.split(",")):
        match = HUB_ID.match(part)
        if not part or not match or not match.group("rev"):
            raise InvalidOptionError(f"not a hub revision org/name@REV: {part!r}")
        step = parse_step(match.group("rev"), pattern)
        if step is None:
            raise InvalidOptionError(f"cannot parse a step from the revision of {part!r}"
                                     + (f" with --step-pattern {pattern.pattern!r}" if pattern is not None else ""))
        # Two repos in one list are most likely a slip that would compare two models as one run's steps (matched
        # without regard to case, as the hub does).
        if repo and match.group("repo").casefold() != repo.casefold():
            raise InvalidOptionError(f"a revision list names two repos ({repo} and {match.group('repo')}): a run is "
                                     "one model's checkpoints; for checkpoints in several repos, list them in a run "
                                     "CSV with step and checkpoint columns")
        repo = repo or match.group("repo")
        _add(found, CheckpointRef(step, part), "revision list")
    return _ordered(repo, found)


_HF_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def _hf_checkpoints(folder: Path) -> dict[int, Path]:
    """A Trainer output folder's ``checkpoint-N/`` subfolders by step; empty without a ``trainer_state.json``."""
    out = {int(m.group(1)): p for p in folder.iterdir()
           if (m := _HF_CHECKPOINT.fullmatch(p.name)) and p.is_dir() and _is_checkpoint(p)}
    marked = (folder / "trainer_state.json").is_file() or any((p / "trainer_state.json").is_file()
                                                               for p in out.values())
    return out if marked else {}


def trainer_state_metrics(folder: Path, hf: dict[int, Path]) -> dict[int, dict[str, str]]:
    """``{step: {"test_loss", "test_accuracy"}}`` (strings, like a metrics CSV) from the ``eval_loss`` /
    ``eval_accuracy`` of the folder's ``trainer_state.json``, else its newest checkpoint's.

    Raises:
        InvalidOptionError: the state file is not JSON or has no ``log_history`` list.
    """
    import json

    candidates = [folder / "trainer_state.json"] + [hf[s] / "trainer_state.json" for s in sorted(hf, reverse=True)]
    state_path = next((p for p in candidates if p.is_file()), None)
    if state_path is None:
        return {}
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidOptionError(f"{state_path}: not a readable trainer_state.json ({exc})") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise InvalidOptionError(f"{state_path}: no log_history list (not a Hugging Face trainer_state.json)")
    out: dict[int, dict[str, str]] = {}
    for entry in history:
        if not isinstance(entry, dict) or "step" not in entry:
            continue
        row = out.setdefault(_int_step(entry["step"], f"{state_path}: log_history"), {})
        for key, column in (("eval_loss", "test_loss"), ("eval_accuracy", "test_accuracy")):
            # NaN or Infinity (a diverged evaluation) is unknown, as an empty cell of a metrics.csv
            if isinstance(entry.get(key), (int, float)) and math.isfinite(entry[key]):
                row[column] = str(entry[key])
    return {step: row for step, row in out.items() if row}


def _metrics_table(table: Path, checkpoints: dict[int, Path]) -> dict[int, dict[str, str]]:
    """A run folder's metrics.csv, its rows by step; refused (as :func:`read_csv`) without a test metric column, with
    a step twice, or with no row at a checkpoint's step (the table was read and none of it used)."""
    rows = read_csv(table, required="step", kind="run")
    if not {"test_loss", "test_accuracy"} & set(rows[0]):
        raise InvalidOptionError(f"{table}: a run's metrics.csv needs a 'test_loss' or 'test_accuracy' column (found: "
                                 f"{', '.join(rows[0])})", path=str(table))
    metrics: dict[int, dict[str, str]] = {}
    for i, row in enumerate(rows, start=2):
        step = _int_step(row.get("step"), f"{table}:{i}")
        if step in metrics:
            raise InvalidOptionError(f"{table}:{i}: a second row for step {step}; keep one row per step")
        metrics[step] = row
    if checkpoints and not metrics.keys() & checkpoints.keys():
        raise InvalidOptionError(f"{table}: no row is at the step of a checkpoint (rows: steps {_span(metrics)}; "
                                 f"checkpoints: steps {_span(checkpoints)}); write the checkpoints' steps in the "
                                 "'step' column", path=str(table))
    return metrics


def _span(steps: Collection[int]) -> str:
    return f"{min(steps)} to {max(steps)}" if len(steps) > 1 else str(next(iter(steps)))


def discover_run(run: Union[str, Path], *, step_pattern: Optional[str] = None) -> Run:
    """Resolve a run (folder, Trainer output, CSV or comma list of hub revisions: docs/watch.md) into its ordered
    checkpoints; ``step_pattern``: a regular expression on names whose first group, or whole match, is the step.

    Raises:
        SourceNotFoundError: the path does not exist, or holds no checkpoints.
        InvalidOptionError: a checkpoint name without a step, two checkpoints with one step or one at two steps,
            ambiguous names, a broken link, a malformed CSV, revision list, step pattern, trainer state or metrics.csv
            (not a regular file, or matching no checkpoint).
    """
    text = str(run)
    from wbfe.options import compile_layers

    pattern = compile_layers(step_pattern, option="--step-pattern")
    if not text.strip():  # Path("") is the working folder: an empty argument must not read it
        raise SourceNotFoundError("an empty run reference: name a folder of checkpoints, a CSV or a list of hub "
                                  "revisions", path=text)
    path = user_path(text)
    # os.path's tests, not Path's: a name too long for the file system is no file, not an OSError traceback
    if os.path.isdir(path):
        hf = _hf_checkpoints(path)  # its trainer_state.json holds the test metrics under --step-pattern too
        by_step = hf if hf and pattern is None else _folder_checkpoints(path, pattern)
        table = path / "metrics.csv"
        if table.is_file():
            metrics = _metrics_table(table, by_step)
        elif table.exists() or table.is_symlink():  # a folder, FIFO or dangling link was skipped without a word
            kind = "a folder" if table.is_dir() else "a broken link" if not table.exists() else "not a regular file"
            raise InvalidOptionError(f"{table} is {kind}: a run's metrics.csv must be a CSV file; replace or remove it",
                                     path=str(table))
        else:
            metrics = trainer_state_metrics(path, hf) if hf else {}
        return _ordered(str(path), {s: CheckpointRef(s, str(p), _float(metrics.get(s, {}).get("test_loss")),
                                                     _float(metrics.get(s, {}).get("test_accuracy")))
                                    for s, p in by_step.items()})
    if os.path.isfile(path) and path.suffix.lower() == ".csv":
        return run_from_rows(path, read_csv(path, required="step", kind="run"), str(path), pattern)
    if os.path.exists(path):
        raise InvalidOptionError(f"{path}: a run is a folder of checkpoints, a CSV or a list of hub revisions")
    if "@" in text and not text.startswith((".", "/", "~")):
        return _from_hub_list(text, pattern)
    raise SourceNotFoundError(f"no such file or folder: {text}", path=text)
