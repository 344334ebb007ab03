"""Find the checkpoints of one training run and the step each one was saved at.

A run is given as one of:

- a folder of checkpoints: weight files (``epoch_9.pt``, ``ckpt_00020.safetensors``) and/or
  checkpoint folders (``checkpoint-500/``), each named with its step; a ``metrics.csv`` beside them
  (columns ``step`` and optionally ``test_loss`` / ``test_accuracy``) adds test metrics;
- a CSV with a ``step`` column, optional ``checkpoint`` (a path, relative to the CSV's folder, or a
  hub id) and optional ``test_loss`` / ``test_accuracy``; without ``checkpoint`` the checkpoints are
  found by step among the files and folders next to the CSV;
- a comma list of hub revisions, ``org/name@step1000,org/name@step2000``.

Step rule (:func:`parse_step`): the number after the last ``epoch`` / ``step`` / ``ckpt`` /
``checkpoint`` / ``iter`` / ``global_step`` keyword of the name (file suffixes removed); failing
that, the last number in the name. ``epoch_10`` sorts after ``epoch_9``.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from wbfe.errors import InvalidOptionError, SourceNotFoundError
from wbfe.sources import CHECKPOINT_SUFFIXES

__all__ = ["CheckpointRef", "Run", "parse_step", "discover_run", "read_run_csv", "run_from_rows", "WEIGHT_SUFFIXES"]

WEIGHT_SUFFIXES = CHECKPOINT_SUFFIXES  # the readers' one list (no .json: a config is no checkpoint)
_KEYWORD = re.compile(r"(?:global_step|checkpoint|iteration|epoch|step|ckpt|iter)s?[-_.=@ ]?0*(\d+)", re.I)
_NUMBER = re.compile(r"\d+")
_METRIC_COLUMNS = ("test_loss", "test_accuracy")


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint of a run: where its weights are and, when known, its test metrics.

    Attributes:
        step: the training step or epoch it was saved at.
        ref: anything :func:`wbfe.score` accepts (a path, a hub id, a module, a state dict).
        test_loss: test loss measured at that step, NaN when not given.
        test_accuracy: test accuracy at that step, NaN when not given.
    """

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


def _stem(name: str) -> str:
    name = name.rstrip("/")
    if name.endswith(".index.json"):
        name = name[: -len(".index.json")]
    for suffix in WEIGHT_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_step(name: str) -> Optional[int]:
    """The step encoded in a checkpoint's file, folder or revision name, or None when it has no number.

    Args:
        name: e.g. ``epoch_9.pt``, ``checkpoint-500``, ``ckpt_00020.safetensors``, ``step1000``.

    Returns:
        The number after the last step keyword, else the last number in the name; None if none.
    """
    stem = _stem(Path(name).name if "/" in name.rstrip("/") else name)
    keyed = _KEYWORD.findall(stem)
    if keyed:
        return int(keyed[-1])
    numbers = _NUMBER.findall(stem)
    return int(numbers[-1]) if numbers else None


def _is_checkpoint(path: Path) -> bool:
    if path.is_dir():
        return any(p.is_file() and p.name.endswith(WEIGHT_SUFFIXES + (".index.json",)) for p in path.iterdir())
    return path.is_file() and path.name.lower().endswith(WEIGHT_SUFFIXES)


def _float(value: Optional[str]) -> float:
    if value is None or not value.strip():
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise InvalidOptionError(f"not a number in a run CSV: {value!r}") from None


def _int_step(value: Optional[str], where: str) -> int:
    try:
        step = float(value) if value is not None else math.nan
    except ValueError:
        step = math.nan
    if not (math.isfinite(step) and step == int(step)):
        raise InvalidOptionError(f"{where}: step {value!r} is not an integer")
    return int(step)


def _ordered(name: str, found: dict[int, CheckpointRef]) -> Run:
    if not found:
        raise SourceNotFoundError(f"{name}: no checkpoints found", path=name)
    return Run(name=name, checkpoints=tuple(found[s] for s in sorted(found)))


def _add(found: dict[int, CheckpointRef], item: CheckpointRef, label: str, where: str) -> None:
    if item.step in found:
        raise InvalidOptionError(f"{where}: two checkpoints have step {item.step} ({found[item.step].ref} and {label})")
    found[item.step] = item


def _folder_checkpoints(folder: Path) -> dict[int, Path]:
    by_step: dict[int, Path] = {}
    unparsed: list[str] = []
    for path in sorted(folder.iterdir()):
        if not _is_checkpoint(path):
            continue
        step = parse_step(path.name)
        if step is None:
            unparsed.append(path.name)
        elif step in by_step:
            raise InvalidOptionError(f"{folder}: two checkpoints have step {step} ({by_step[step].name} and {path.name})")
        else:
            by_step[step] = path
    if unparsed:
        raise InvalidOptionError(
            f"{folder}: cannot parse a step from {', '.join(unparsed[:3])}"
            + (" ..." if len(unparsed) > 3 else "")
            + " (put the step in the name, e.g. epoch_3.pt, or list the checkpoints in a CSV with a step column)"
        )
    return by_step


def read_csv(path: Union[str, Path], *, required: str, kind: str) -> list[dict[str, str]]:
    """The rows of a CSV as dicts of stripped strings, checked to have column ``required`` and rows.

    Raises:
        SourceNotFoundError: the file does not exist.
        InvalidOptionError: the column is missing, or there are no rows.
    """
    path = Path(path)
    if not path.is_file():
        raise SourceNotFoundError(f"no such file: {path}", path=str(path))
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = [f.strip() for f in (reader.fieldnames or [])]
        if required not in fields:
            raise InvalidOptionError(
                f"{path}: a {kind} CSV needs a {required!r} column (found: {', '.join(fields) or 'none'})"
            )
        rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    if not rows:
        raise InvalidOptionError(f"{path}: the CSV has no rows")
    return rows


def read_run_csv(path: Union[str, Path]) -> list[dict[str, str]]:
    """The rows of a run CSV (dicts of strings), checked to have a ``step`` column; see :func:`read_csv`."""
    return read_csv(path, required="step", kind="run")


def run_from_rows(path: Path, rows: list[dict[str, str]], name: str) -> Run:
    """A run from CSV rows (``step``, optional ``checkpoint``, ``test_loss``, ``test_accuracy``).

    Args:
        path: the CSV file the rows came from (relative checkpoint paths are resolved against its folder).
        rows: the rows, as :func:`read_run_csv` returns them.
        name: the run's name.

    Raises:
        InvalidOptionError: a non-integer step, two rows with one step, a non-numeric metric.
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

            local = Path(target) if Path(target).is_absolute() else path.parent / target
            # A relative path that is not there but reads as org/name[@rev] is a hub id.
            ref = target if (not local.exists() and HUB_ID.match(target)) else str(local)
        else:
            if beside is None:
                beside = _folder_checkpoints(path.parent)
            if step not in beside:
                raise SourceNotFoundError(
                    f"{path}:{i}: no checkpoint for step {step} next to the CSV (and no 'checkpoint' column)",
                    path=str(path),
                )
            ref = str(beside[step])
        item = CheckpointRef(step, ref, _float(row.get("test_loss")), _float(row.get("test_accuracy")))
        _add(found, item, str(ref), str(path))
    return _ordered(name, found)


def _from_hub_list(text: str) -> Run:
    from wbfe.sources.hub import HUB_ID

    found: dict[int, CheckpointRef] = {}
    repos = set()
    for part in (p.strip() for p in text.split(",")):
        match = HUB_ID.match(part)
        if not part or not match or not match.group("rev"):
            raise InvalidOptionError(f"not a hub revision org/name@REV: {part!r}")
        step = parse_step(match.group("rev"))
        if step is None:
            raise InvalidOptionError(f"cannot parse a step from the revision of {part!r}")
        repos.add(match.group("repo"))
        _add(found, CheckpointRef(step, part), part, "revision list")
    return _ordered(",".join(sorted(repos)), found)


def discover_run(run: Union[str, Path]) -> Run:
    """Resolve a run (folder, CSV or comma list of hub revisions) into its ordered checkpoints.

    Args:
        run: see the module docstring.

    Returns:
        A :class:`Run`; a folder's ``metrics.csv`` supplies test metrics by step.

    Raises:
        SourceNotFoundError: the path does not exist, or holds no checkpoints.
        InvalidOptionError: a checkpoint name without a step, two checkpoints with one step, a
            malformed CSV or revision list.
    """
    text = str(run)
    if not text.strip():  # Path("") is the working folder: an empty argument must not read it
        raise SourceNotFoundError("an empty run reference: name a folder of checkpoints, a CSV or a list of hub "
                                  "revisions", path=text)
    path = Path(text).expanduser()
    if path.is_dir():
        by_step = _folder_checkpoints(path)
        metrics: dict[int, dict[str, str]] = {}
        if (path / "metrics.csv").is_file():
            for i, row in enumerate(read_run_csv(path / "metrics.csv"), start=2):
                metrics[_int_step(row.get("step"), f"{path / 'metrics.csv'}:{i}")] = row
        found = {s: CheckpointRef(s, str(p), _float(metrics.get(s, {}).get("test_loss")),
                                  _float(metrics.get(s, {}).get("test_accuracy")))
                 for s, p in by_step.items()}
        return _ordered(str(path), found)
    if path.is_file() and path.suffix.lower() == ".csv":
        return run_from_rows(path, read_run_csv(path), str(path))
    if path.exists():
        raise InvalidOptionError(f"{path}: a run is a folder of checkpoints, a CSV or a list of hub revisions")
    if "@" in text and not text.startswith((".", "/", "~")):
        return _from_hub_list(text)
    raise SourceNotFoundError(f"no such file or folder: {text}", path=text)
