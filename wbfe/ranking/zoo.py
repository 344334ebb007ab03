"""Zoo specs: which checkpoints to rank and their published quality numbers (docs/ranking.md, "Your own zoo")."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from wbfe._config import hf_offline, shared_zoo_dir, torch_hub_dir, user_path
from wbfe._deps import require
from wbfe.errors import InvalidOptionError, MissingDependencyError, SourceNotFoundError, unknown_name
from wbfe.fixtures import fixtures_dir
from wbfe.sources import WEIGHT_SUFFIXES
from wbfe.sources.object_store import is_uri
from wbfe.sources.tables import read_csv_table, read_table_text

__all__ = ["ZooEntry", "Zoo", "BuiltinZoo", "load_zoo", "read_zoo_file", "zoo_from_rows", "list_zoos",
           "builtin_zoo_names", "torchvision_imagenet_rows", "TORCHVISION_DOWNLOADS", "torchvision_weight_not_cached",
           "fixtures_dir", "shared_zoo_dir"]

_RESERVED = ("model", "checkpoint", "source")
_PREFIXES = ("timm:", "torchvision:", "hf:", "hf-hub:")
_TABLE = "a CSV or YAML table"  # what a zoo spec is, for the messages that refuse one


@dataclass(frozen=True)
class ZooEntry:
    """One model of a zoo: its unique label, the reference handed to ``wbfe.score`` (relative paths resolved),
    every numeric column of its row (NaN where empty) and its citation."""

    name: str
    ref: str
    quality: Mapping[str, float]
    source: Optional[str] = None


@dataclass(frozen=True)
class Zoo:
    """A parsed zoo spec: its name (built-in, the YAML's ``name``, or ``<folder>/<file name>``), models and numeric
    columns in file order, and the column ranked when none is asked for (None: the only one, if unique)."""

    name: str
    entries: tuple[ZooEntry, ...]
    quality_columns: tuple[str, ...]
    lower_is_better: frozenset[str] = field(default_factory=frozenset)
    default_quality: Optional[str] = None
    path: Optional[Path] = None
    not_numeric: Mapping[str, str] = field(default_factory=dict)  # partly numeric column: why it is not a quality

    def resolve_quality(self, quality: Optional[str]) -> str:
        """The quality column to rank: ``quality`` if given, else the zoo's default.

        Raises:
            UnknownNameError: the column is not a quality column of this zoo.
            InvalidOptionError: none was given and the zoo has several and no default; the column holds text.
        """
        if quality is not None and quality in self.not_numeric:
            raise InvalidOptionError(f"zoo {self.name!r}: {self.not_numeric[quality]}")
        if quality is None:
            quality = self.default_quality
        if quality is None:
            if len(self.quality_columns) != 1:
                raise InvalidOptionError(f"zoo {self.name!r} has several quality columns; choose one with --quality "
                                         f"({', '.join(self.quality_columns)})")
            if self.not_numeric:  # the only numeric one, or a typo?
                raise InvalidOptionError(f"zoo {self.name!r}: {next(iter(self.not_numeric.values()))}; fix it, or "
                                         f"choose the quality column with --quality ({self.quality_columns[0]})")
            quality = self.quality_columns[0]
        if quality not in self.quality_columns:
            raise unknown_name("quality column", quality, self.quality_columns)
        return quality


@dataclass(frozen=True)
class BuiltinZoo:
    """A zoo shipped with wbfe, found by its stable name; ``load`` builds it with ``read`` (and may raise when its
    checkpoints are absent), ``offline`` says every checkpoint is available without a network."""

    name: str
    description: str
    default_quality: str
    lower_is_better: tuple[str, ...]
    read: Callable[[str, str, tuple[str, ...]], Zoo]  # (name, default quality, lower-is-better columns)
    offline: bool

    def load(self) -> Zoo:
        return self.read(self.name, self.default_quality, self.lower_is_better)


# --------------------------------------------------------------------------- parsing


def _is_number(text: str) -> bool:
    try:
        return float(text) is not None
    except ValueError:
        return False


def _resolve_ref(value: str, base_dir: Optional[Path]) -> str:
    """A local path relative to ``base_dir`` becomes absolute; hub ids and prefixed names stay."""
    value = value.strip()
    if value.startswith(_PREFIXES) or base_dir is None or is_uri(value):
        return value
    candidate = user_path(value)
    if candidate.is_absolute():
        return str(candidate)
    joined = base_dir / candidate
    # A hub id is "org/name" or a bare "name": a path has more slashes, a leading "." or "~", or a weights suffix.
    # os.path.exists is False for a name too long for the file system, or holding a NUL.
    if (os.path.exists(joined) or value.startswith((".", "~")) or candidate.suffix.lower() in WEIGHT_SUFFIXES
            or value.count("/") >= 2):
        try:
            return str(joined.resolve())
        except (OSError, ValueError, RuntimeError):
            return str(joined)
    return value


def zoo_from_rows(rows: Sequence[Mapping[str, Any]], *, name: str, base_dir: Optional[Path] = None,
                  lower_is_better: Iterable[str] = (), default_quality: Optional[str] = None,
                  path: Optional[Path] = None) -> Zoo:
    """Build a :class:`Zoo` from row mappings (CSV rows or YAML items), each with at least a ``model`` key; relative
    paths resolve against ``base_dir`` (None: references stay as given).

    Raises:
        InvalidOptionError: no rows, a row without ``model`` or naming a column twice, duplicate model labels or
            checkpoints, no numeric column, an infinite quality value, or a lower-is-better / default column that is
            not a quality column.
    """
    if not rows:
        raise InvalidOptionError(f"zoo {name!r} has no models")
    for number, row in enumerate(rows, start=1):
        keys = [str(key).strip() for key in row]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:  # 'acc' and ' acc' of a YAML row: one of the two was read, the other dropped without a word
            raise InvalidOptionError(f"zoo {name!r}: row {number} names column {twice[0]!r} twice")
    columns = [c for c in dict.fromkeys(str(key).strip() for row in rows for key in row) if c]
    if "model" not in columns:
        raise InvalidOptionError(f"zoo {name!r} has no 'model' column (columns: {', '.join(columns)})")
    stripped = [{str(key).strip(): value for key, value in row.items()} for row in rows]  # no key twice, above
    table = [{key: "" if row.get(key) is None else str(row[key]).strip() for key in (*columns, *_RESERVED)}
             for row in stripped]
    numeric, mixed = [], {}
    for col in (c for c in columns if c not in _RESERVED):
        filled = [(row["model"], row[col]) for row in table if row[col]]
        words = [(label, text) for label, text in filled if not _is_number(text)]
        if filled and not words:
            numeric.append(col)
        elif words and len(words) < len(filled):  # a typo in a column of numbers
            mixed[col] = f"column {col!r} is not numeric: model {words[0][0]!r} has {words[0][1]!r}"
    if not numeric:
        raise InvalidOptionError(f"zoo {name!r} has no numeric quality column"
                                 + "".join(f" ({why})" for why in list(mixed.values())[:1]))
    lower = frozenset(lower_is_better)
    for col in [*sorted(lower), *([] if default_quality is None else [default_quality])]:
        if col in mixed:
            raise InvalidOptionError(f"zoo {name!r}: {mixed[col]}")
        if col not in numeric:
            raise unknown_name("quality column", col, tuple(numeric))

    entries: list[ZooEntry] = []
    seen: set[str] = set()
    owners: dict[str, str] = {}  # checkpoint -> the model that names it
    for number, row in enumerate(table, start=1):
        label = row["model"]
        if not label:
            raise InvalidOptionError(f"zoo {name!r}: row {number} has an empty 'model' cell")
        if label in seen:
            raise InvalidOptionError(f"zoo {name!r}: model {label!r} appears twice")
        seen.add(label)
        quality = {col: float(row[col]) if row[col] else math.nan for col in numeric}
        # "inf" parses as a number, but no quality is infinite (found by fuzzing)
        for col in (c for c in numeric if math.isinf(quality[c])):
            raise InvalidOptionError(f"zoo {name!r}: model {label!r} has {col} = {row[col]!r}, not a finite number")
        resolved = _resolve_ref(row["checkpoint"] or label, base_dir)
        if resolved in owners:  # one checkpoint ranked twice counts its metric and quality twice
            raise InvalidOptionError(f"zoo {name!r}: models {owners[resolved]!r} and {label!r} are the same checkpoint "
                                     f"({resolved}); list each checkpoint once")
        owners[resolved] = label
        entries.append(ZooEntry(label, resolved, quality, row["source"] or None))
    return Zoo(name, tuple(entries), tuple(numeric), lower, default_quality, path, mixed)


def _read_yaml(path: Path) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
    yaml = require("yaml", "reading a YAML zoo needs PyYAML (pip install pyyaml), or give the zoo as CSV")
    try:
        data = yaml.safe_load(read_table_text(path, "zoo spec", _TABLE))
    except yaml.YAMLError as exc:
        raise InvalidOptionError.at(path, f"not valid YAML ({exc.__class__.__name__})") from None
    except RecursionError:
        raise InvalidOptionError.at(path, "YAML nested too deeply to be a zoo") from None
    if isinstance(data, list):
        rows, meta = data, {}
    elif isinstance(data, dict) and isinstance(data.get("models"), list):
        rows, meta = data["models"], {k: v for k, v in data.items() if k != "models"}
    else:
        raise InvalidOptionError.at(path, "a YAML zoo is a list of rows or a mapping with 'models'")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise InvalidOptionError.at(path, f"row {number} is not a mapping of column to value")
    for key in ("name", "quality"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise InvalidOptionError.at(path, f"'{key}' must be text, not {type(meta[key]).__name__}")
    declared = meta.get("lower_is_better")
    if declared is not None and not isinstance(declared, str) and not (
            isinstance(declared, list) and all(isinstance(c, str) for c in declared)):
        raise InvalidOptionError.at(path, "'lower_is_better' must be a column name or a list of them")
    return rows, meta


def read_zoo_file(path: Union[str, Path], *, lower_is_better: Iterable[str] = (), default_quality: Optional[str] = None,
                  name: Optional[str] = None, base_dir: Optional[Path] = None) -> Zoo:
    """Parse a CSV or YAML (``.yaml``, ``.yml``) zoo spec; ``lower_is_better`` adds to the columns the YAML declares,
    ``default_quality`` and ``name`` override its own, ``base_dir`` defaults to the file's folder.

    Raises:
        SourceNotFoundError: the file does not exist.
        InvalidOptionError: the file is not a valid zoo (see :func:`zoo_from_rows`).
    """
    spec = user_path(path)
    if not os.path.exists(spec):  # False, not an OSError, for a name too long for the file system
        raise SourceNotFoundError(f"zoo spec not found: {spec}", path=str(spec))
    rows, meta = (_read_yaml(spec) if spec.suffix.lower() in (".yaml", ".yml")
                  else (read_csv_table(spec, "zoo spec", _TABLE)[1], {}))
    declared = meta.get("lower_is_better") or ()
    declared = [declared] if isinstance(declared, str) else declared
    return zoo_from_rows(rows, name=name or str(meta.get("name") or f"{spec.resolve().parent.name}/{spec.name}"),
                         base_dir=(base_dir or spec.parent).resolve(),
                         lower_is_better=set(declared) | set(lower_is_better),
                         default_quality=default_quality or meta.get("quality"), path=spec.resolve())


# --------------------------------------------------------------------------- built-in zoos


def _load_table(name: str, default: str, lower: tuple[str, ...] = (), base_dir: Optional[Path] = None) -> Zoo:
    return read_zoo_file(fixtures_dir() / "tables" / f"{name}.csv", name=name, default_quality=default,
                         lower_is_better=lower, base_dir=base_dir)


def _load_fmnist(name: str, default: str, lower: tuple[str, ...]) -> Zoo:
    spec = fixtures_dir() / "fmnist-zoo" / "zoo.csv"
    if not spec.is_file():
        raise SourceNotFoundError(f"the Fashion-MNIST zoo is not built yet (expected {spec}; see benchmarks/zoo/)",
                                  path=str(spec))
    return read_zoo_file(spec, name=name, default_quality=default, lower_is_better=lower)


def _load_cifar10(name: str, default: str, lower: tuple[str, ...]) -> Zoo:
    folder = shared_zoo_dir() / "cifar10-resnet"
    if not folder.is_dir():
        raise SourceNotFoundError(f"the CIFAR-10 ResNet checkpoints are not at {folder}; set WBFE_SHARED_ZOO to the "
                                  "folder that holds cifar10-resnet/", path=str(folder))
    return _load_table(name, default, lower, base_dir=folder)


def torchvision_imagenet_rows() -> list[dict[str, object]]:
    """One row per torchvision classification weight with an ImageNet-1K acc@1 in its metadata.

    Raises:
        MissingDependencyError: torchvision is not installed.
    """
    torchvision = require("torchvision", "reading torchvision's weight metadata needs torchvision")
    tvm = torchvision.models  # imported by torchvision itself
    rows: list[dict[str, object]] = []
    for arch in sorted(tvm.list_models(module=tvm)):
        for weight in tvm.get_model_weights(arch):
            meta = weight.meta
            metrics = meta.get("_metrics", {}).get("ImageNet-1K")
            # VGG16 IMAGENET1K_FEATURES publishes NaN: a feature extractor has no acc@1.
            if not metrics or not math.isfinite(float(metrics.get("acc@1", math.nan))):
                continue
            enum = f"{type(weight).__name__}.{weight.name}"
            rows.append({"model": f"torchvision:{enum}", "acc1": metrics["acc@1"], "acc5": metrics.get("acc@5", ""),
                         "num_params": meta.get("num_params", ""), "gflops": meta.get("_ops", ""),
                         "file_size_mb": meta.get("_file_size", ""),
                         "source": f"torchvision {torchvision.__version__} weight metadata {enum}.meta['_metrics']"
                                   f"['ImageNet-1K']; recipe {meta.get('recipe', '')}"})
    return rows


# Where every torchvision weight is published (``weights.url``), so its host is known without torchvision.
TORCHVISION_DOWNLOADS = "https://download.pytorch.org/models/"


def _torch_hub_checkpoints_empty() -> bool:
    """Whether torch's hub cache holds no file: then no torchvision weight is cached, whatever its file's name."""
    folder = torch_hub_dir() / "checkpoints"
    try:
        return not any(p.is_file() for p in folder.iterdir())
    except OSError:  # absent, or not a folder
        return True


@functools.lru_cache(maxsize=1)
def _shipped_torchvision_refs() -> frozenset[str]:
    return frozenset(e.ref for e in _load_table("torchvision-imagenet", "acc1").entries)


def torchvision_weight_not_cached(ref: str) -> bool:
    """True when ``ref`` is a torchvision weight the shipped table lists and torch's hub cache holds no file at all,
    told without importing torchvision; False means "ask torchvision"."""
    return ref in _shipped_torchvision_refs() and _torch_hub_checkpoints_empty()


def _load_torchvision(name: str, default: str, lower: tuple[str, ...]) -> Zoo:
    # With none of the weights to be had, the shipped table is as good as torchvision's metadata,
    # and wbfe rank says so without importing torchvision.
    if not (hf_offline() and _torch_hub_checkpoints_empty()):
        with contextlib.suppress(MissingDependencyError):  # no torchvision: the shipped table
            return zoo_from_rows(torchvision_imagenet_rows(), name=name, default_quality=default)
    return _load_table(name, default)


_BUILTINS: dict[str, BuiltinZoo] = {
    zoo.name: zoo
    for zoo in (
        BuiltinZoo("fmnist", "Fashion-MNIST MLPs and small CNNs trained offline by benchmarks/zoo/ "
                   "(test accuracy and loss measured)", "test_accuracy", ("test_loss",), _load_fmnist, True),
        BuiltinZoo("cifar10-resnet", "CIFAR-10 ResNet-20/32/44/56 (akamaster/pytorch_resnet_cifar10) with "
                   "published test accuracy; checkpoints in ../shared/zoo", "test_accuracy", (),
                   _load_cifar10, True),
        BuiltinZoo("torchvision-imagenet", "torchvision ImageNet-1K classifiers, acc@1/acc@5 from torchvision's "
                   "weight metadata (downloads the weights)", "acc1", (), _load_torchvision, False),
        BuiltinZoo("pythia-deduped-lambada", "Pythia deduped LLMs, zero-shot LAMBADA (OpenAI) accuracy at "
                   "step 143000 from EleutherAI/pythia evals (downloads the weights)", "lambada_acc",
                   ("lambada_ppl",), _load_table, False),
        BuiltinZoo("qwen3.5", "Qwen3.5 post-trained LLMs, knowledge benchmarks from the official model "
                   "cards (downloads the weights)", "mmlu_pro", (), _load_table, False),
    )
}


def builtin_zoo_names() -> tuple[str, ...]:
    """The stable names of the built-in zoos."""
    return tuple(_BUILTINS)


def list_zoos() -> tuple[BuiltinZoo, ...]:
    """Every built-in zoo, in a stable order."""
    return tuple(_BUILTINS.values())


def load_zoo(spec: Union[str, Path, Zoo], *, lower_is_better: Iterable[str] = ()) -> Zoo:
    """A zoo from a built-in name (:func:`list_zoos`), a CSV/YAML path, or a :class:`Zoo`, with extra
    lower-is-better columns.

    Raises:
        UnknownNameError: ``spec`` is neither a file nor a built-in name.
        SourceNotFoundError: a built-in zoo whose files are absent.
        InvalidOptionError: the spec is not a valid zoo.
    """
    extra = frozenset(lower_is_better)
    if isinstance(spec, Zoo):
        zoo = spec
    elif isinstance(spec, str) and spec in _BUILTINS:
        zoo = _BUILTINS[spec].load()
    else:
        path = user_path(spec)
        if not os.path.exists(path) and isinstance(spec, str) and os.sep not in spec and not path.suffix:
            raise unknown_name("zoo", spec, builtin_zoo_names())
        return read_zoo_file(path, lower_is_better=extra)  # which refuses a path that does not exist
    for col in (c for c in sorted(extra) if c not in zoo.quality_columns):
        raise unknown_name("quality column", col, zoo.quality_columns)
    return replace(zoo, lower_is_better=zoo.lower_is_better | extra) if extra else zoo
