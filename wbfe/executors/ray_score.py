"""``wbfe score --executor ray``: one Ray task per shard of a safetensors checkpoint (or per group of tensors of one
large file), merged into exactly a local score's result (docs/ray.md). Each task streams the entries in a local score's
order, scores its own part's and hashes its own file; the driver merges the rows in stream order, resolves ties across
parts and finishes with the engine's functions. Any other checkpoint is scored whole by one task (``score_here``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from wbfe import engine
from wbfe.engine.matrices import Skip
from wbfe.engine.pipeline import Pipeline
from wbfe.engine.ties import full_digest
from wbfe._config import user_path
from wbfe.errors import CorruptCheckpointError, WbfeError
from wbfe.executors import ExecutorOptions, ScoreHere
from wbfe.executors.ray_cluster import (SYSTEM_ERRORS, Progress, connect, node_of_this_task, numel, run_tasks,
                                        task_resources)
from wbfe.options import ScoreOptions
from wbfe.sources import combine_digests, open_source
from wbfe.sources.local import open_path, pick_weight_files
from wbfe.sources.registry import folder_kinds
from wbfe.sources.safetensors_files import SafetensorsSource, changed_while_read, pinned_sha256

__all__ = ["score_on_ray", "plan_parts", "Part", "PART_BYTES", "largest_tensor_elements", "local_safetensors"]

PART_BYTES = 2 * 2**30
"""A single safetensors file larger than this is split into groups of tensors of about this size."""

# An expert matrix split out of a fused stack (wbfe.engine.experts) belongs where the stack is stored.
_EXPERT_SUFFIX = re.compile(r"\[\d+\](?:\.[A-Za-z_]+)?$")


@dataclass(frozen=True)
class Part:
    """The rows one task scores, the file it hashes (None: another part of it does), the elements of
    its largest tensor, its tensors' bytes, and every shard's pin (:meth:`SafetensorsSource.pins`)."""

    names: tuple[str, ...]
    file: Optional[str]
    largest: int
    nbytes: int = 0
    pins: Optional[dict[str, tuple[int, ...]]] = None


def local_safetensors(ref: Any) -> Optional[SafetensorsSource]:
    """The reader a local score opens for ``ref`` (its headers read, its shards pinned) where that is a local
    safetensors checkpoint: a file, an index, or a folder whose weight files, as a local score picks them, are
    either; None for anything else, before any of it is read."""
    if not isinstance(ref, (str, Path)):
        return None
    path = user_path(ref)
    try:
        chosen = [path.name] if path.is_file() else pick_weight_files(p.name for p in path.iterdir())
    except (OSError, ValueError, CorruptCheckpointError):  # nothing there, or a folder a local score refuses
        return None
    if not chosen or not chosen[0].endswith((".safetensors", ".safetensors.index.json")) or any(
            kind.claims(path) for kind in folder_kinds()):
        return None
    source = open_path(path, ref=str(ref))
    if isinstance(source, SafetensorsSource):
        return source
    source.close()
    return None


def largest_tensor_elements(ref: Any) -> Optional[int]:
    """Elements of the largest tensor of a local safetensors checkpoint, from the headers a local score reads;
    None for anything whose sizes cannot be read that cheaply."""
    try:
        return max((part.largest for part in plan_parts(ref) or ()), default=None)
    except WbfeError:  # the task itself reports an unreadable checkpoint
        return None


def plan_parts(ref: Any, part_bytes: int = PART_BYTES) -> Optional[list[Part]]:
    """The parts of a local safetensors checkpoint (a file, an index or a folder holding either), from the
    headers its reader reads, its shards pinned there; None for anything else."""
    source = local_safetensors(ref)
    if source is None:
        return None
    parts: list[Part] = []
    with source:
        pins = source.pins()
        for shard, rows, header in source._plan:
            size = {row: header[name]["data_offsets"][1] - header[name]["data_offsets"][0] for row, name, _ in rows}
            shape = {row: header[name]["shape"] for row, name, _ in rows}
            groups: list[list[str]] = [[]]
            total = 0
            for row in size:
                if groups[-1] and total + size[row] > part_bytes:
                    groups.append([])
                    total = 0
                groups[-1].append(row)
                total += size[row]
            # The file's first part hashes it.
            parts += [Part(tuple(group), str(shard) if i == 0 else None, max((numel(shape[n]) for n in group),
                           default=0), sum(size[n] for n in group), pins) for i, group in enumerate(groups)]
    return parts


class _Digests:
    """:class:`wbfe.engine.ties.SeenContent` in a task: keeps every full digest, the driver finds the ties."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[Any, ...]] = {}

    def earlier_copy(self, entry: Any, tensor: Any) -> Optional[str]:
        self.keys[entry.name] = (tuple(entry.shape), entry.dtype, full_digest(tensor))
        return None


def _score_part(ref: Any, options: ScoreOptions, part: int, owner: dict[str, int], file: Optional[str],
                pins: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Runs on a Ray worker: the rows of the tensors ``owner`` gives to ``part`` (a split expert goes with
    its stack, another row to part 0) with their stream positions, and the SHA-256 of ``file``, read from the
    files the driver pinned (``pins``), as one local score reads them."""
    node = node_of_this_task()
    try:
        context = engine.Context.of(options)
        digests = _Digests()
        rows: list[tuple[int, str, dict[str, Any]]] = []
        position: dict[str, int] = {}

        def mine(index: int, name: str) -> bool:
            position[name] = index
            return owner.get(name, owner.get(_EXPERT_SUFFIX.sub("", name), 0)) == part

        def record(entry: Any, item: Any) -> None:
            skip = isinstance(item, Skip)
            rows.append((position[entry.name], "skipped" if skip else "layer", item.to_dict() if skip else item))

        with open_source(ref) as source, Pipeline(context.device) as pipeline:
            found = source.pins() if isinstance(source, SafetensorsSource) else {}
            changed = next((path for path in {**pins, **found} if pins.get(path) != found.get(path)), None)
            if changed is not None or not found:  # re-saved since the parts were planned: they would mix versions
                raise changed_while_read(changed or str(ref))
            planned = (item for k, item in enumerate(engine.stream(source, options)) if mine(k, item.entry.name))
            engine.run(pipeline, planned, context, digests, record)
            description = source.description  # before the provenance: it records which was used
            p = source.provenance  # not waiting for the digest: the driver combines the parts'
            provenance = {"source": p.source, "format": p.format, "files": list(p.files), "sha256": None, **p.extra}
            head_hint, config = source.head_hint, source.config
        digest = pinned_sha256(Path(file), pins[file]) if file else None
    except WbfeError as exc:
        return {"error": exc, "node": node}
    return {"rows": rows, "ties": digests.keys, "provenance": provenance, "head_hint": head_hint,
            "config": config, "description": description, "digest": digest, "node": node}


def score_on_ray(ref: Any, options: ScoreOptions, executor: ExecutorOptions, score_here: ScoreHere, *,
                 progress: Optional[engine.Progress] = None, part_bytes: int = PART_BYTES) -> Any:
    """:func:`wbfe.score` of ``ref`` on Ray: the same :class:`~wbfe.engine.ModelScore` (its provenance adds
    ``executor``), raising the errors a local score raises (a part's WbfeError is never retried)."""
    ray = connect(executor.address)
    # A product of consecutive matrices (--intra) may straddle two parts: one task scores the whole.
    parts = None if options.intra else plan_parts(ref, part_bytes)
    def say(line: str) -> None:
        if progress is not None:
            progress(0 if parts is None else len(answers), None if parts is None else len(parts), line)

    answers: dict[int, dict[str, Any]] = {}
    retry = dict(max_retries=executor.max_retries, retry_exceptions=SYSTEM_ERRORS)
    if parts is None:  # not safetensors: the whole model is one task
        whole = ray.remote(_score_whole).options(**retry, **task_resources(options.device, None))
        answer = ray.get(whole.remote(score_here, ref, options))
        say(f"[ray] {ref}: {'failed' if 'error' in answer else 'scored whole'} on {answer['node']}")
        if "error" in answer:
            raise answer["error"]
        answer["result"].model["executor"] = "ray"
        return answer["result"]
    owner_ref = ray.put({name: k for k, part in enumerate(parts) for name in part.names})
    counter = Progress(total=len(parts), what="parts", total_bytes=sum(p.nbytes for p in parts))
    calls = ((f"wbfe-score-part-{k}", options.device, part.largest, (ref, options, k, owner_ref, part.file, part.pins))
             for k, part in enumerate(parts))
    for k, done in run_tasks(ray, _score_part, executor.max_retries, calls):
        answer = ray.get(done)
        if "error" in answer:
            say(f"[ray] part {k + 1}: failed{counter.step(answer['node'], parts[k].nbytes)}: {answer['error']}")
            raise answer["error"]
        answers[k] = answer
        say(f"[ray] part {k + 1} ({len(parts[k].names)} tensors) scored{counter.step(answer['node'], parts[k].nbytes)}")
    rows = sorted((row for answer in answers.values() for row in answer["rows"]), key=lambda row: row[0])
    ties = {name: key for answer in answers.values() for name, key in answer["ties"].items()}
    layers, skipped = _merge(rows, ties)
    first = answers[0]
    provenance = dict(first["provenance"])
    provenance["sha256"] = combine_digests([(Path(parts[k].file).name, answers[k]["digest"])  # type: ignore[arg-type]
                                            for k in sorted(answers) if parts[k].file is not None])
    context = engine.Context.of(options)
    model = {**engine.provenance_of(provenance, context), "executor": "ray"}
    return engine.finish(model, layers, skipped, context.groups, head=options.head, head_hint=first["head_hint"],
                         config=first["config"], description=first["description"])


def _merge(rows: list[tuple[int, str, dict[str, Any]]], ties: dict[str, tuple[Any, ...]]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Layers and skipped rows in stream order; a copy of an earlier tensor's bytes (in any part) becomes
    a ``tied`` skip, as :class:`wbfe.engine.ties.SeenContent` does."""
    first_copy: dict[tuple[Any, ...], str] = {}
    layers: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for _, kind, row in rows:
        key = ties.get(row["name"])
        if key is not None:
            earlier = first_copy.setdefault(key, row["name"])
            if earlier != row["name"]:
                skipped.append({"name": row["name"], "reason": f"tied: identical to {earlier}",
                                "shape": list(key[0]), "dtype": key[1]})
                continue
        (layers if kind == "layer" else skipped).append(row)
    return layers, skipped


def _score_whole(score_here: ScoreHere, ref: Any, options: ScoreOptions) -> dict[str, Any]:
    """Runs on a Ray worker: ``score_here`` of a checkpoint that is not split into parts."""
    node = node_of_this_task()
    try:
        return {"result": score_here(ref, options), "node": node}
    except WbfeError as exc:
        return {"error": exc, "node": node}
