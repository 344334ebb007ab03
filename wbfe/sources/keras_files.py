"""Keras weights through h5py, without TensorFlow: Keras 2 HDF5 files (``model.save`` or ``save_weights``),
Keras 3 ``.keras`` archives and bare ``.weights.h5``. Kernels are reported in PyTorch's layout (docs/formats.md);
the file's own model config is its description (:mod:`wbfe.framework.keras_graph`)."""

from __future__ import annotations

import functools
import itertools
import json
import re
import struct
import threading
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from wbfe._deps import require
from wbfe.errors import CorruptCheckpointError, TruncatedCheckpointError
from wbfe.framework import IN_OUT, OUT_IN, FrameworkDescription
from wbfe.framework.keras_graph import KerasHead, class_name, config_layers, keras_facts, keras_head
from wbfe.linalg.arrays import from_bytes
from wbfe.sources._base import FileDigest, Provenance, TensorEntry, TensorSource
from wbfe.sources._order import natural_key
from wbfe.sources.file_window import FileWindow
from wbfe.sources.hdf5_guard import Hdf5IndexError, check_hdf5_index
from wbfe.sources.registry import ZIP_ERRORS, FileFormat, register_format, zip_members

__all__ = ["KerasSource", "is_keras_file", "KERAS"]

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_WEIGHTS_MEMBER = "model.weights.h5"
# Keras 3's variables of a layer, by index, for the classes whose order is fixed by their build().
_KERAS3_VARS: dict[str, tuple[str, ...]] = {
    **{c: ("kernel", "bias") for c in ("dense", "conv1d", "conv2d", "conv3d", "conv1d_transpose",
                                        "conv2d_transpose", "conv3d_transpose", "einsum_dense")},
    **{f"depthwise_conv{d}d": ("depthwise_kernel", "bias") for d in (1, 2)},
    **{f"separable_conv{d}d": ("depthwise_kernel", "pointwise_kernel", "bias") for d in (1, 2)},
    "embedding": ("embeddings",),
    "layer_normalization": ("gamma", "beta"),
    "cell": ("kernel", "recurrent_kernel", "bias"),  # layers/lstm/cell/vars/...: LSTM, GRU, SimpleRNN
}
# Variables whose layout the layer's class does not change.
_FIXED_LAYOUTS: dict[str, tuple[str, Optional[str]]] = {
    "bias": ("skip", "bias"), "embeddings": ("stored", None),
    **{v: ("skip", f"BatchNorm moving statistic ({v})") for v in ("moving_mean", "moving_variance")},
    **{v: ("skip", f"normalisation scale or shift ({v})") for v in ("gamma", "beta", "gamma or beta")}}
_NO_DATASPACE = "an HDF5 dataset with no dataspace: it holds no values"
_NUMBERED = re.compile(r"^(?P<base>.+?)(_\d+)?$")


@dataclass(frozen=True)
class _Var:
    name: str
    path: str  # inside the HDF5 file
    shape: tuple[int, ...]  # as reported (out × in …)
    dtype: str
    layout: str  # dense | conv | depthwise | stored | skip
    skip: Optional[str] = None
    layer: str = ""  # the top-level layer's group (Keras 2) or the layer's folder (Keras 3)
    axes: str = OUT_IN  # the layout of the tensor as read: in_out for a transposed convolution


def _layout(layer_class: str, var: str, ndim: int) -> tuple[str, Optional[str]]:
    """How a variable of a layer of class ``layer_class`` (snake case) becomes a matrix, or why not."""
    if var in _FIXED_LAYOUTS:
        return _FIXED_LAYOUTS[var]
    if var == "depthwise_kernel" or (var == "kernel" and layer_class.startswith("depthwise_conv")):
        # Keras 3's legacy .h5 writer names a DepthwiseConv2D's variable ``kernel``.
        return ("depthwise", None) if ndim >= 3 else ("skip", f"depthwise kernel of rank {ndim}")
    if var in ("kernel", "pointwise_kernel", "recurrent_kernel"):
        if layer_class in ("einsum_dense", "multi_head_attention"):
            return "skip", "EinsumDense kernel: its layout follows its equation, which wbfe does not read"
        return ("dense", None) if ndim == 2 else ("conv", None) if ndim >= 3 else ("skip", f"{ndim}-D kernel")
    return "skip", f"variable {var!r} of a {layer_class or 'Keras'} layer: not a kernel wbfe knows the layout of"


def _reported_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if layout in ("dense", "conv"):  # in × out, or k… × in × out
        return (shape[-1], shape[-2], *shape[:-2])
    if layout == "depthwise":
        return (shape[-2] * shape[-1], 1, *shape[:-2])
    return shape


def _to_torch_layout(t: "np.ndarray", layout: str) -> "np.ndarray":
    n = t.ndim
    if layout in ("dense", "conv", "depthwise"):
        swap = (n - 2, n - 1) if layout == "depthwise" else (n - 1, n - 2)
        t = np.transpose(t, (*swap, *range(n - 2))).reshape(_reported_shape(layout, t.shape))
    return np.require(t, requirements="C")  # not ascontiguousarray, which makes a 0-D array 1-D


def _snake(name: str) -> str:
    """keras.src.utils.naming.to_snake_case, the rule that names Keras 3's layer folders."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _text(value: Any) -> str:
    return value.decode("utf8") if isinstance(value, bytes) else str(value)


def _attr_list(group: Any, key: str) -> Optional[list[str]]:
    """Keras's list attributes, split into ``key0``, ``key1``… when they outgrow an HDF5 header."""
    keys = [key] if key in group.attrs else list(
        itertools.takewhile(group.attrs.__contains__, (f"{key}{i}" for i in itertools.count())))
    values = [group.attrs[k] for k in keys]
    # an empty list is stored as an empty float array
    if not all(isinstance(v, np.ndarray) and v.ndim == 1 and (v.dtype.kind in "SUO" or not v.size) for v in values):
        raise ValueError(f"its {key} attribute is not a list of names")  # a scalar was iterated, or not iterable
    return [_text(v) for part in values for v in part] if keys else None


class KerasSource(TensorSource):
    """The variables of a Keras ``.h5`` / ``.weights.h5`` file or ``.keras`` archive."""

    def __init__(self, path: Path, ref: str, fmt: Optional[str] = None):
        h5py = require("h5py", "reading Keras files needs h5py: pip install 'wbfe[keras]'")
        self._path = path
        self._lock = threading.Lock()
        self._archive: Optional[zipfile.ZipFile] = None
        self._fileobj: Any = None
        config: Any = None
        metadata: dict[str, Any] = {}
        with open(path, "rb") as fh:
            head = fh.read(8)
        try:
            keras3 = head[:4] == b"PK\x03\x04"
            if keras3:
                config, metadata = self._open_archive(path)
                # The index walked in a bounded child first (wbfe.sources.hdf5_guard).
                check_hdf5_index(path, window=self._window, member=None if self._window else _WEIGHTS_MEMBER)
                self._h5 = h5py.File(self._fileobj, "r")
                size = self._member_size
            elif head != HDF5_MAGIC:
                raise CorruptCheckpointError.at(path, "not a Keras file (neither HDF5 nor a .keras zip: starts "
                                                f"{head[:8]!r})")
            else:
                check_hdf5_index(path)
                self._h5 = h5py.File(path, "r")
                size = path.stat().st_size
            self._vars, description, extra = self._plan(self._h5, config, size)
        except BaseException as exc:
            self.close_files()
            if isinstance(exc, Hdf5IndexError):
                raise _hdf5_error(path, OSError(exc.text)) from None
            if not isinstance(exc, CorruptCheckpointError) and isinstance(exc, (KeyError, OSError, ValueError,
                                                                                RuntimeError)):
                raise _hdf5_error(path, exc) from None
            raise
        self.own_description = description
        if "keras_version" in metadata:
            extra["keras_version"] = metadata["keras_version"]
        layout = extra.pop("layout")
        self.provenance = Provenance(source=ref, format="keras3" if keras3 else layout, files=[str(path)],
            pending=FileDigest([path]), extra={"metadata": extra} if extra else {})

    def _open_archive(self, path: Path) -> tuple[Any, dict[str, Any]]:
        try:
            self._archive = archive = zipfile.ZipFile(path)
            if _WEIGHTS_MEMBER not in archive.namelist():
                raise CorruptCheckpointError.at(path, f"a zip without {_WEIGHTS_MEMBER}: not a Keras 3 archive")
            config = _read_json(archive, "config.json")
            metadata = _read_json(archive, "metadata.json")  # None where there is none
            info = archive.getinfo(_WEIGHTS_MEMBER)
            self._member_size = info.file_size
            self._window: Optional[tuple[int, int]] = None
            if info.compress_type == zipfile.ZIP_STORED:  # as Keras writes it: read in place
                # zipfile's checks of the member's local header (its name, its flags), which reading in place
                # would skip (found by fuzzing: a member whose local header names another file was read).
                archive.open(info).close()
                self._window = (_member_offset(path, info), info.file_size)
                self._fileobj = FileWindow(path, *self._window, what=_WEIGHTS_MEMBER)
                # Read in place, the member skips zipfile's CRC-32 check: made here (found by fuzzing).
                crc = 0
                while chunk := self._fileobj.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
                if crc != info.CRC:
                    raise CorruptCheckpointError.at(path, f"{_WEIGHTS_MEMBER} fails its CRC-32 check")
                self._fileobj.seek(0)
            else:
                self._fileobj = archive.open(info)
        except ZIP_ERRORS as exc:  # our own CorruptCheckpointError (a ValueError) included: one message
            raise CorruptCheckpointError.at(path, f"corrupt or truncated .keras archive ({exc})") from None
        return config, metadata if isinstance(metadata, dict) else {}

    def _plan(self, h5: Any, config: Any,
              size: int) -> tuple[list[_Var], Optional[FrameworkDescription], dict[str, Any]]:
        datasets: list[str] = []
        h5.visititems(lambda name, obj: datasets.append(name) if hasattr(obj, "shape") else None)
        links: list[str] = []  # soft and external ones, which visititems does not follow (h5py 3.11 lists them)
        if hasattr(h5, "visititems_links"):
            h5.visititems_links(lambda name, link: None if type(link).__name__ == "HardLink" else links.append(name))
        for name in links:  # not raised inside the visit: h5py's C callback would turn it into a SystemError
            self._inside(h5, name)
        if not all(isinstance(name, str) for name in datasets):  # h5py gives a name that is not UTF-8 as bytes
            raise CorruptCheckpointError.at(self._path, "an HDF5 dataset name that is not UTF-8 text; Keras "
                                            "writes UTF-8 names")
        extra: dict[str, Any] = {k: _text(v) for k in ("keras_version", "backend")
                                 if (v := h5.attrs.get(k)) is not None}
        if "model_weights" in h5 or _attr_list(h5, "layer_names") is not None:
            root = h5["model_weights"] if "model_weights" in h5 else h5
            extra["layout"] = "keras-h5"
            raw = h5.attrs.get("model_config")
            try:
                config = None if raw is None else json.loads(_text(raw))
            except (UnicodeDecodeError, json.JSONDecodeError):
                config = None
            ordered = self._plan_keras2(h5, root, config)
        elif "layers" in h5 or "vars" in h5:
            extra["layout"] = "keras3-weights-h5"
            ordered = self._plan_keras3(h5, datasets, config)
        else:
            raise CorruptCheckpointError.at(
                self._path, "an HDF5 file but not Keras weights (no model_weights, layer_names or layers/)")
        found = keras_head(config)  # once: for the head's stored matrix and for the description's facts
        head, why = _head(ordered, config, found, keras3=extra["layout"] == "keras3-weights-h5")
        listed = {v.path for v in ordered}
        for path in datasets:  # everything else: optimizer and metric state, stray datasets
            if path not in listed:
                top = path.split("/")[0]
                reason = ("optimizer state" if top in ("optimizer_weights", "optimizer") else
                          "metric state" if top == "metrics" else "not a layer variable of the model")
                ordered.append(self._var(h5, path, path, "skip", f"{reason} ({top}/)"))
        for var in ordered:  # a contiguous dataset must lie inside the file: HDF5 would fail only when it is read
            ds = h5[var.path]
            offset = ds.id.get_offset()
            if offset is not None and offset + ds.id.get_storage_size() > size:
                raise TruncatedCheckpointError.at(self._path, f"data of {var.name!r} lies past the end of the weights "
                    f"({offset + ds.id.get_storage_size()} > {size} bytes)")
        description = None
        if config_layers(config):  # the file's own model graph: its order and its output layer
            description = FrameworkDescription(
                "keras", class_name(config) or "Model", tuple(v.name for v in ordered if v.skip is None), head,
                layouts={v.name: v.axes for v in ordered if v.axes != OUT_IN}, note=why, facts=keras_facts(*found))
        return ordered, description, extra

    def _inside(self, h5: Any, path: str) -> None:
        """Refuse a dataset whose data HDF5 would read from another file (which the user did not name): through an
        external link, from external storage or as a virtual dataset (other files' names are taken relative to the
        working folder; they were read and scored as the file's own)."""
        obj, why = h5, None
        for part in (p for p in path.split("/") if p):
            link = obj.get(part, getlink=True)
            if link is None:  # missing: the caller says so
                return
            if type(link).__name__ == "ExternalLink":
                why = f"an external link to {link.filename!r}"
                break
            try:
                obj = obj[part]
            except KeyError:  # a dangling soft link: the caller says so, if it is a weight
                return
        if why is None and obj.file != h5:  # a soft link through an external one
            why = "a link into another file"
        if why is None and hasattr(obj, "shape"):
            why = ("a virtual dataset mapping other files" if obj.is_virtual else
                   f"external storage in {obj.external[0][0]!r}" if obj.external else None)
        if why is not None:
            raise CorruptCheckpointError.at(self._path, f"dataset {path[:200]!r} is {why}: wbfe reads only the file "
                                            "named")

    def _var(self, h5: Any, name: str, path: str, layout: str, skip: Optional[str] = None, layer: str = "",
             axes: str = OUT_IN) -> _Var:
        self._inside(h5, path)
        ds = h5[path]
        if ds.shape is None:  # a null dataspace (h5py.Empty): no shape, no values
            return _Var(name, path, (), _dtype_name(ds), "skip", _NO_DATASPACE, layer, OUT_IN)
        stored = tuple(int(s) for s in ds.shape)
        if skip is None and 0 not in stored and ds.id.get_storage_size() == 0:
            # nothing written: HDF5 gives its fill value for every element, and a few bytes can declare terabytes
            skip = f"no values stored: every element is the HDF5 fill value ({ds.fillvalue})"
        return _Var(name, path, _reported_shape(layout, stored) if skip is None else stored, _dtype_name(ds), layout,
                    skip, layer, axes)

    def _plan_keras2(self, h5: Any, root: Any, model_config: Any) -> list[_Var]:
        classes = {str(_inner(layer).get("name")): _snake(class_name(layer))
                   for layer in _walk_config(model_config)}
        layer_names = _attr_list(root, "layer_names")
        if layer_names is None:
            raise CorruptCheckpointError.at(self._path, "Keras HDF5 without its layer_names attribute")
        if len(set(layer_names)) != len(layer_names):
            twice = next(n for n in layer_names if layer_names.count(n) > 1)
            raise CorruptCheckpointError.at(self._path, f"layer {twice!r} is listed twice in layer_names")
        out: list[_Var] = []
        for layer in layer_names:
            if layer not in root:
                raise CorruptCheckpointError.at(self._path, f"layer {layer!r} listed in layer_names is missing")
            group = root[layer]
            layer_class = classes.get(layer) or _NUMBERED.match(layer)["base"]  # type: ignore[index]
            weights = _attr_list(group, "weight_names") or []
            if len(set(weights)) != len(weights):  # each copy was another row of the one dataset
                raise CorruptCheckpointError.at(self._path, f"a weight of layer {layer!r} is listed twice")
            for weight in weights:
                if weight not in group:
                    raise CorruptCheckpointError.at(
                        self._path, f"weight {weight!r} of layer {layer!r} listed in weight_names is missing")
                var = weight.split("/")[-1].split(":")[0]
                path = f"{group.name.lstrip('/')}/{weight}"
                self._inside(h5, path)  # before its shape is read: an external link's would be the other file's
                # A weight of a nested model names its own layer: ``backbone/conv1/kernel``.
                inner = next((classes[p] for p in reversed(weight.split("/")[:-1]) if p in classes), layer_class)
                layout, skip = _layout(inner, var, group[weight].ndim)
                out.append(self._var(h5, weight, path, layout, skip, layer, _axes(inner, layout)))
        return out

    def _plan_keras3(self, h5: Any, datasets: list[str], config: Any) -> list[_Var]:
        folders = _keras3_folders(config)
        position = {folder: i for i, (_, folder, _) in enumerate(folders)}
        # a wrapper's layer (TimeDistributed's) is saved in <wrapper>/layer/, a folder named for no class
        wrapped = {f"{folder}/layer": _snake(class_name(_inner(layer)["layer"])) for _, folder, layer in folders
                   if isinstance(_inner(layer).get("layer"), dict)}

        def key(path: str) -> tuple[int, list[object]]:
            # a layer's own sublayers' folders (an LSTM's cell/, MultiHeadAttention's query_dense/) are at its place
            folder = path.rsplit("/vars/", 1)[0]
            while folder not in position and "/" in folder:
                folder = folder.rsplit("/", 1)[0]
            return position.get(folder, len(position)), natural_key(path)

        out: list[_Var] = []
        for path in sorted((p for p in datasets if "/vars/" in p and p.split("/")[0] == "layers"), key=key):
            folder, index = path.rsplit("/vars/", 1)
            layer_class = wrapped.get(folder) or _NUMBERED.match(folder.split("/")[-1])["base"]  # type: ignore[index]
            names = _KERAS3_VARS.get(layer_class)
            if layer_class == "batch_normalization":  # [gamma] [beta] moving_mean moving_variance
                count = len(h5[f"{folder}/vars"])
                names = ("gamma or beta",) * (count - 2) + ("moving_mean", "moving_variance")
            if index.isdigit() and names is not None and int(index) < len(names):
                layout, skip = _layout(layer_class, names[int(index)], h5[path].ndim)
            elif not index.isdigit():
                layout, skip = "skip", "not a numbered layer variable"
            else:
                layout, skip = "skip", (f"variable {int(index)} of a {layer_class!r} layer: not a kernel wbfe knows "
                                        "the layout of")
            out.append(self._var(h5, path, path, layout, skip, folder, _axes(layer_class, layout)))
        return out

    def __len__(self) -> int:
        return len(self._vars)

    def entries(self) -> Iterator[TensorEntry]:
        for var in self._vars:
            yield TensorEntry(name=var.name, shape=var.shape, dtype=var.dtype, load=functools.partial(self.read, var),
                              skip=var.skip, layout=var.axes)

    def read(self, var: _Var) -> Any:
        with self._lock:
            if self._h5 is None:
                raise CorruptCheckpointError.at(self._path, "read after the file was closed")
            ds = self._h5[var.path]
            if ds.shape is None:
                raise CorruptCheckpointError.at(self._path, f"{var.name!r}: {_NO_DATASPACE}")
            try:
                array = ds[()]
            except (OSError, ValueError) as exc:
                raise TruncatedCheckpointError.at(
                    self._path, f"data of {var.name!r} unreadable ({str(exc).splitlines()[0][:120]})") from None
        if var.dtype == "bfloat16":  # Keras 3 stores bfloat16 as 2-byte opaque values, so marked
            bits = _to_torch_layout(np.require(array, requirements="C").view(np.uint8).view(np.int16), var.layout)
            return from_bytes(bits.view(np.uint8), "bfloat16", bits.shape)
        return _to_torch_layout(np.asarray(array), var.layout)

    def close_files(self) -> None:
        with self._lock:
            if getattr(self, "_h5", None) is not None:
                self._h5.close()
            self._h5 = None
        for handle in (self._fileobj, self._archive):
            if handle is not None:
                handle.close()
        self._fileobj = self._archive = None

    def close(self) -> None:
        super().close()
        self.close_files()


def _hdf5_error(path: Path, exc: BaseException) -> CorruptCheckpointError:
    """h5py's error as a typed one: truncated where HDF5 found data past the end of the file."""
    text = str(exc).strip("'\"").splitlines()[0][:160] if str(exc) else exc.__class__.__name__
    truncated = any(k in text.lower() for k in ("truncated", "dataset size", "addr overflow", "eof"))
    kind = TruncatedCheckpointError if truncated else CorruptCheckpointError
    return kind.at(path, f"{'truncated' if truncated else 'corrupt'} HDF5 file ({text})")


def _dtype_name(ds: Any) -> str:
    if ds.attrs.get("dtype") in ("bfloat16", b"bfloat16"):
        return "bfloat16"
    return str(ds.dtype.name) if ds.dtype.kind in "fiub" else f"hdf5-{ds.dtype.str}"


def _inner(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's ``config``; ``{}`` where a damaged model config holds no mapping there."""
    inner = layer.get("config")
    return inner if isinstance(inner, dict) else {}


def _walk_config(config: Any) -> Iterator[dict[str, Any]]:
    for layer in config_layers(config):
        yield layer
        yield from _walk_config(layer)


def _keras3_folders(config: Any, prefix: str = "layers",
                    names: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    """Keras 3's folder of each layer in model order, with its names from the outer model in and its config
    (saving_lib numbers a container's layers by their class in snake case as it walks ``model.layers``)."""
    used: dict[str, int] = {}
    out: list[tuple[tuple[str, ...], str, dict[str, Any]]] = []
    for layer in config_layers(config):
        name = _snake(class_name(layer))
        if name == "input_layer" and prefix == "layers" and class_name(config) == "Sequential":
            continue  # Sequential.layers leaves its InputLayer out
        used[name] = used.get(name, -1) + 1
        folder = f"{prefix}/{name}" + (f"_{used[name]}" if used[name] else "")
        path = names + (str(_inner(layer).get("name", layer.get("name", ""))),)
        out.append((path, folder, layer))
        if config_layers(layer):
            out += _keras3_folders(layer, f"{folder}/layers", path)
    return out


def _axes(layer_class: str, layout: str) -> str:
    """The layout of a converted kernel: Keras stores a transposed convolution's as k… × out × in."""
    return IN_OUT if layout == "conv" and layer_class.endswith("_transpose") else OUT_IN


def _head(variables: list[_Var], config: Any, walked: tuple[Optional[KerasHead], Optional[str]],
          keras3: bool) -> tuple[Optional[str], Optional[str]]:
    """The stored name of the matrix of the head :func:`keras_head` found (``walked``) in the model config of a
    Keras 2 ``.h5`` or a Keras 3 archive."""
    head, why = walked
    if head is None:
        return None, why
    path = head.layer.path
    folder = {p: f for p, f, _ in _keras3_folders(config)}.get(path) if keras3 else None
    names = _KERAS3_VARS.get(_snake(head.layer.class_name), ())
    for wanted in head.variables:
        if keras3:
            stored = f"{folder}/vars/{names.index(wanted)}" if folder is not None and wanted in names else None
            found = [v for v in variables if v.name == stored]
        else:
            found = [v for v in variables if v.layer == path[0] and v.name.split("/")[-1].split(":")[0] == wanted
                     and (len(path) == 1 or path[-1] in v.name.split("/")[:-1])]
        for var in found:
            if var.skip is None:
                return var.name, head.note
    return None, f"the output layer {'/'.join(path)} has no {' or '.join(head.variables)} stored"


def _read_json(archive: zipfile.ZipFile, member: str) -> Any:
    try:
        return json.loads(archive.read(member))
    except KeyError:
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError.at(archive.filename, f"{member} is not JSON ({exc})") from None


def _member_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """First byte of a stored member's data: after its local header (name and extra field)."""
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def is_keras_file(head: bytes, path: Path) -> bool:
    """An HDF5 file (by its magic), or a zip holding a Keras 3 archive's members (keras.saving.saving_lib: the
    weights and the model's config), whatever its name."""
    return head[:8] == HDF5_MAGIC or head[:4] == b"PK\x03\x04" and all(
        m in zip_members(path) for m in (_WEIGHTS_MEMBER, "config.json"))


KERAS = register_format(FileFormat(
    name="keras", suffixes=(".h5", ".hdf5", ".keras"), open=KerasSource, sniff=is_keras_file, group="other", rank=30))
