"""The bad-input campaign of issue #16, reader half: hostile and broken checkpoint files, as a table.

Each case builds a bad checkpoint in ``tmp_path`` and names what must happen, through the library
(``wbfe.score``) and through the CLI (``wbfe score``) alike:

- an error case: a typed ``WbfeError`` subclass whose one-line message holds a given text (exit 2
  and that one line on stderr from the CLI, no traceback), and never any of a set of forbidden
  texts (bytes of a foreign file, or numbers derived from them);
- an accounted case: the score succeeds and named tensors are in ``layers``, or in ``skipped``
  with a given reason (nothing lost silently, nothing materialised beyond its storage).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import wbfe
from tests.conftest import small_state_dict, write_sharded
from wbfe.errors import (
    CorruptCheckpointError,
    ModelNotFoundError,
    NoUsableMatrixError,
    SourceNotFoundError,
    TruncatedCheckpointError,
    UnknownNameError,
    WbfeError,
)
from wbfe_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
# The first 8 bytes of a typical /etc/passwd line, read as safetensors' header length.
PASSWD = b"root:x:0:0:root:/root:/bin/bash\n" * 4
PASSWD_LENGTH = str(struct.unpack("<Q", PASSWD[:8])[0])


@dataclass
class Case:
    """``build(tmp_path, monkeypatch)`` writes the bad input and returns the reference to score."""

    name: str
    build: Callable[[Path, pytest.MonkeyPatch], str]
    error: type[WbfeError] | None = None
    message: str = ""
    forbidden: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)


# --- builders -------------------------------------------------------------------------------------


def _matrix(seed: int = 0, rows: int = 24, cols: int = 16) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _raw_st(path: Path, header: bytes, data: bytes = b"") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return str(path)


def _st(header: Any, data: bytes = b"", name: str = "bad.safetensors") -> Callable[[Path, Any], str]:
    """A safetensors file with this header (a JSON value or raw bytes) and data section."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return lambda tmp, mp: _raw_st(tmp / name, raw, data)


def _f32(shape: list[Any], offsets: list[Any], dtype: Any = "F32") -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


D384 = bytes(384)  # room for a 24 x 4 float32 tensor


def _valid_st(path: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors or {"fc.weight": _matrix()}, str(path))
    return path


def _index(folder: Path, weight_map: Any, name: str = "model.safetensors.index.json", raw: bytes | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / name
    index.write_bytes(raw if raw is not None else json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
    return str(index)


def _index_to(shard: Any, *, outside: bool = True) -> Callable[[Path, Any], str]:
    """A checkpoint folder whose index names ``shard`` (a valid safetensors file waits outside)."""
    def build(tmp: Path, mp: Any) -> str:
        if outside:
            _valid_st(tmp / "outside" / "x.safetensors")
        _valid_st(tmp / "ckpt" / "model-00001.safetensors", {"a.weight": _matrix(1)})
        return _index(tmp / "ckpt", {"a.weight": "model-00001.safetensors", "fc.weight": shard})
    return build


def _folder_symlink(tmp: Path, mp: Any) -> str:
    _valid_st(tmp / "outside" / "x.safetensors")
    (tmp / "ckpt").mkdir()
    (tmp / "ckpt" / "sub").symlink_to(tmp / "outside")
    return _index(tmp / "ckpt", {"fc.weight": "sub/x.safetensors"})


def _shard_link(target: Callable[[Path], Path]) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        (tmp / "ckpt").mkdir()
        (tmp / "ckpt" / "model-00001.safetensors").symlink_to(target(tmp))
        return _index(tmp / "ckpt", {"fc.weight": "model-00001.safetensors"})
    return build


def _fifo(tmp: Path) -> Path:
    path = tmp / "pipe"
    os.mkfifo(path)
    return path


def _passwd(tmp: Path) -> Path:
    path = tmp / "etc" / "passwd"
    path.parent.mkdir()
    path.write_bytes(PASSWD)
    return path


def _file(name: str, data: bytes) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        (tmp / name).write_bytes(data)
        return str(tmp / name)
    return build


def _named_fifo(name: str) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        os.mkfifo(tmp / name)
        return str(tmp / name)
    return build


def _link(name: str, target: str) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        (tmp / name).symlink_to(target)
        return str(tmp / name)
    return build


def _pt(obj: Callable[[], Any], name: str = "model.pt") -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        torch.save(obj(), tmp / name)
        return str(tmp / name)
    return build


def _pt_edit(edit: Callable[[bytes], bytes]) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        path = tmp / "model.pt"
        torch.save({"fc.weight": _matrix(), "fc2.weight": _matrix(1)}, path)
        path.write_bytes(edit(path.read_bytes()))
        return str(path)
    return build


def _flip_data_record(data: bytes) -> bytes:
    """Flip one byte inside the first tensor's data record (its CRC-32 no longer matches)."""
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename and "serialization_id" not in i.filename)
        payload = archive.read(info.filename)
    offset = data.index(payload[:64], info.header_offset)  # the record's bytes follow its local header
    out = bytearray(data)
    out[offset + 17] ^= 0x40
    return bytes(out)


def _compressed_pt(tmp: Path, mp: Any) -> str:
    plain = tmp / "plain.pt"
    torch.save({"fc.weight": _matrix()}, plain)
    path = tmp / "model.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    return str(path)


def _cycle() -> dict[str, Any]:
    inner: dict[str, Any] = {"fc.weight": _matrix(1)}
    inner["again"] = inner
    return {"head.weight": _matrix(), "encoder": inner}


def _dotted_prefix_index(tmp: Path, mp: Any) -> str:
    index = Path(write_sharded(tmp / "ckpt", small_state_dict(), n_shards=3))
    data = json.loads(index.read_text())
    data["weight_map"]["classifier.weight"] = "./" + data["weight_map"]["classifier.weight"]
    index.write_text(json.dumps(data))
    return str(index)


def _bin_index(shard: str) -> Callable[[Path, Any], str]:
    def build(tmp: Path, mp: Any) -> str:
        (tmp / "outside").mkdir()
        torch.save({"fc.weight": _matrix()}, tmp / "outside" / "x.bin")
        (tmp / "ckpt").mkdir()
        torch.save({"a.weight": _matrix(1)}, tmp / "ckpt" / "pytorch_model-00001.bin")
        return _index(tmp / "ckpt", {"a.weight": "pytorch_model-00001.bin", "fc.weight": shard},
                      name="pytorch_model.bin.index.json")
    return build


def _bin_index_missing_tensor(tmp: Path, mp: Any) -> str:
    torch.save({"a.weight": _matrix(1)}, tmp / "pytorch_model-00001.bin")
    return _index(tmp, {"a.weight": "pytorch_model-00001.bin", "b.weight": "pytorch_model-00001.bin"},
                  name="pytorch_model.bin.index.json")


def _mistyped_folder(tmp: Path, mp: pytest.MonkeyPatch) -> str:
    (tmp / "hf" / "llama").mkdir(parents=True)
    mp.chdir(tmp)
    return "hf/lama"


def _hub_unreachable(tmp: Path, mp: pytest.MonkeyPatch) -> str:
    """Offline without HF_HUB_OFFLINE: the endpoint is a closed local port, and any attempt by
    huggingface_hub's own client (which would retry for ~25 s) fails the test."""
    from huggingface_hub import HfApi, constants

    mp.delenv("HF_HUB_OFFLINE", raising=False)
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    mp.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")

    def no_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("huggingface_hub's client was called although the hub is unreachable")

    mp.setattr(HfApi, "model_info", no_client)  # what a stream and a download ask first
    mp.chdir(tmp)
    return "nobody/nothing-here"


def _hub_answers(exc: Callable[[], BaseException]) -> Callable[[Path, Any], str]:
    """The hub is reachable and its client raises ``exc()`` (a typed huggingface_hub error)."""
    def build(tmp: Path, mp: pytest.MonkeyPatch) -> str:
        from huggingface_hub import HfApi, constants

        from wbfe.sources import hub

        mp.delenv("HF_HUB_OFFLINE", raising=False)
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(hub, "host_unreachable", lambda url, **kwargs: None)

        def answer(*args: Any, **kwargs: Any) -> Any:
            raise exc()

        # model_info: the first call of a model not in the cache, the stream's and the download's
        mp.setattr(HfApi, "model_info", answer)
        return "acme/some-model"
    return build


def _http_error(kind: str, status: int) -> Callable[[], BaseException]:
    def make() -> BaseException:
        from huggingface_hub import errors

        response = SimpleNamespace(headers={}, request=None, status_code=status)
        return getattr(errors, kind)(f"{status} Client Error", response=response)
    return make


def _sparse_only() -> dict[str, Any]:
    return {"a.weight": _matrix().to_sparse(), "b.weight": _matrix(1).to_sparse()}


# --- the table ------------------------------------------------------------------------------------

NOT_INSIDE = "is not a file name inside the checkpoint's folder"
ST = "corrupt safetensors header"
E = CorruptCheckpointError

CASES = [
    # 1. shard names that leave the checkpoint's folder; foreign bytes never echoed
    Case("index-absolute", _index_to("/etc/passwd"), E, NOT_INSIDE),
    Case("index-absolute-valid-foreign", lambda t, m: _index_to(str(t / "outside" / "x.safetensors"))(t, m), E, NOT_INSIDE),
    Case("index-dotdot", _index_to("../outside/x.safetensors"), E, NOT_INSIDE),
    Case("index-dotdot-deep", _index_to("../../../../etc/passwd"), E, NOT_INSIDE),
    Case("index-dotdot-middle", _index_to("sub/../../outside/x.safetensors"), E, NOT_INSIDE),
    Case("index-dot-dotdot", _index_to("./../outside/x.safetensors"), E, NOT_INSIDE),
    Case("index-backslash", _index_to("..\\outside\\x.safetensors"), E, NOT_INSIDE),
    Case("index-nul", _index_to("model-00001.safetensors\0.txt"), E, NOT_INSIDE),
    Case("index-empty-name", _index_to(""), E, NOT_INSIDE),
    Case("index-only-dots", _index_to("./."), E, NOT_INSIDE),
    Case("index-folder-symlink", _folder_symlink, E, "which is not a folder of the checkpoint"),
    Case("index-shard-is-folder", lambda t, m: (t / "ckpt" / "d").mkdir(parents=True) or _index(t / "ckpt", {"w": "d"}),
         E, "listed in the index is not a regular file"),
    Case("index-shard-symlink-to-fifo", _shard_link(_fifo), E, "listed in the index is not a regular file"),
    Case("index-shard-symlink-to-dev-zero", _shard_link(lambda t: Path("/dev/zero")), E, "not a regular file"),
    Case("index-shard-symlink-to-passwd", _shard_link(_passwd), E,
         "not a safetensors file (its first 8 bytes are not a header length)", forbidden=(PASSWD_LENGTH, "x:0:0")),
    Case("index-shard-missing", _index_to("model-00009.safetensors", outside=False), SourceNotFoundError,
         "shard 'model-00009.safetensors' listed in the index is missing"),
    Case("index-shard-not-string", _index_to(3, outside=False), E, "is not a file name"),
    Case("index-weight-map-list", lambda t, m: _index(t, ["a"]), E, "expected JSON with a 'weight_map' object"),
    Case("index-not-object", lambda t, m: _index(t, None, raw=b"[1, 2]"), E, "'weight_map' object"),
    Case("index-weight-map-empty", lambda t, m: _valid_st(t / "model-00001.safetensors") and _index(t, {}), E,
         "its 'weight_map' lists no tensor"),
    Case("index-duplicate-tensor", lambda t, m: _index(t, None, raw=b'{"weight_map": {"a": "x", "a": "y"}}'),
         E, "the key 'a' appears twice"),
    Case("index-not-utf8", lambda t, m: _index(t, None, raw=b'{"weight_map": {"\xff\xfe": "x"}}'), E, "not UTF-8"),
    Case("index-deep-nesting", lambda t, m: _index(t, None, raw=b"[" * 100_000 + b"]" * 100_000), E, "nested too deeply"),
    Case("index-is-fifo", _named_fifo("model.safetensors.index.json"), E, "not a regular file (a FIFO)"),
    Case("bin-index-dotdot", _bin_index("../outside/x.bin"), E, NOT_INSIDE),
    Case("bin-index-absolute", _bin_index("/etc/passwd"), E, NOT_INSIDE),
    Case("bin-index-tensor-not-in-shard", _bin_index_missing_tensor, E, "'b.weight' listed in the index is not in this shard"),
    Case("foreign-bytes-as-safetensors", lambda t, m: str(_passwd(t).rename(t / "x.safetensors")), E,
         "not a safetensors file", forbidden=(PASSWD_LENGTH, "x:0:0")),
    # 3. headers the safetensors format forbids
    Case("overlap", _st({"a": _f32([24, 4], [0, 384]), "b": _f32([24, 4], [0, 384])}, D384), E,
         "overlaps the tensor before it"),
    Case("partial-overlap", _st({"a": _f32([24, 4], [0, 384]), "b": _f32([4], [368, 384])}, D384), E, "overlaps"),
    Case("many-over-one-region", _st({k: _f32([24, 4], [0, 384]) for k in "abcd"}, D384), E, "overlaps"),
    Case("gap", _st({"a": _f32([20, 4], [64, 384])}, D384), E, "leaves a gap before it"),
    Case("trailing-bytes", _st({"a": _f32([24, 4], [0, 384])}, D384 + b"xx"), E, "its tensors cover 384 of the 386 data bytes"),
    Case("duplicate-key", _st(b'{"a": ' + json.dumps(_f32([24, 4], [0, 384])).encode() + b', "a": '
                              + json.dumps(_f32([24, 4], [0, 384])).encode() + b"}", D384), E, "the key 'a' appears twice"),
    Case("duplicate-field", _st(b'{"a": {"dtype": "F32", "dtype": "F16", "shape": [24, 4], "data_offsets": [0, 384]}}', D384),
         E, "the key 'dtype' appears twice"),
    Case("offsets-reversed", _st({"a": _f32([0], [384, 0])}, D384), E, "data_offsets do not match"),
    Case("size-mismatch", _st({"a": _f32([24, 5], [0, 384])}, D384), E, "data_offsets do not match its shape and dtype"),
    Case("unknown-dtype", _st({"a": _f32([24, 4], [0, 384], "F33")}, D384), E, "unknown dtype 'F33'"),
    Case("lowercase-dtype", _st({"a": _f32([24, 4], [0, 384], "f32")}, D384), E, "unknown dtype 'f32'"),
    Case("f4-odd-bits", _st({"a": _f32([3], [0, 1], "F4")}, b"\0"), E, "data_offsets do not match"),
    # 11. values of the wrong type or range; 19. negative shapes refused at parse time
    Case("dtype-list", _st({"a": _f32([24, 4], [0, 384], ["F32"])}, D384), E, "dtype is not a string"),
    Case("negative-shape", _st({"a": _f32([-96, 4], [0, 384])}, D384), E, "shape is not a list of non-negative integers"),
    Case("float-shape", _st({"a": _f32([24.0, 4], [0, 384])}, D384), E, "shape is not a list"),
    Case("bool-shape", _st({"a": _f32([True, 96], [0, 384])}, D384), E, "shape is not a list"),
    Case("string-shape", _st({"a": _f32(["24", 4], [0, 384])}, D384), E, "shape is not a list"),
    Case("shape-not-list", _st({"a": _f32(96, [0, 384])}, D384), E, "shape is not a list"),
    Case("shape-2-to-64", _st({"a": _f32([2**64], [0, 384])}, D384), E, "shape is not a list"),
    Case("shape-overflow", _st({"a": _f32([2**40, 2**40], [0, 384])}, D384), E, "more than 2^64 elements"),
    Case("string-offsets", _st({"a": _f32([24, 4], ["0", "384"])}, D384), E, "data_offsets is not two non-negative integers"),
    Case("1e400-offsets", _st(b'{"a": {"dtype": "F32", "shape": [24, 4], "data_offsets": [0, 1e400]}}', D384), E,
         "data_offsets is not two"),
    Case("float-offsets", _st({"a": _f32([24, 4], [0.0, 384.0])}, D384), E, "data_offsets is not two"),
    Case("negative-offsets", _st({"a": _f32([24, 4], [-384, 0])}, D384), E, "data_offsets is not two"),
    Case("three-offsets", _st({"a": _f32([24, 4], [0, 384, 384])}, D384), E, "data_offsets is not two"),
    Case("metadata-list", _st({"__metadata__": [], "a": _f32([24, 4], [0, 384])}, D384), E, "__metadata__ must map strings"),
    Case("metadata-int-value", _st({"__metadata__": {"k": 1}, "a": _f32([24, 4], [0, 384])}, D384), E, "__metadata__ must map"),
    Case("metadata-string", _st({"__metadata__": "x", "a": _f32([24, 4], [0, 384])}, D384), E, "__metadata__ must map"),
    Case("deep-nesting", _st(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), E, "nested too deeply"),
    Case("nan-in-header", _st(b'{"a": {"dtype": "F32", "shape": [24, 4], "data_offsets": [0, 384]}, "z": NaN}', D384), E,
         "NaN is not JSON"),
    Case("header-is-list", _st([1, 2]), E, "not a JSON object"),
    Case("entry-not-object", _st({"a": 3}), E, "expected an object with dtype, shape and data_offsets"),
    Case("entry-missing-offsets", _st({"a": {"dtype": "F32", "shape": [24, 4]}}, D384), E, "expected an object"),
    Case("header-not-utf8", _st(b'{"\xff": 1}'), E, "not UTF-8 text"),
    Case("lone-surrogate-name", _st(b'{"\\ud800": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'), E,
         "unpaired surrogate"),
    Case("header-length-impossible", _file("x.safetensors", b"\xff" * 64), E,
         "its first 8 bytes are not a header length", forbidden=(str(2**64 - 1),)),
    Case("header-past-end", _file("x.safetensors", struct.pack("<Q", 5000) + b"{}"), TruncatedCheckpointError,
         "its header would run past the end of its 10 bytes", forbidden=("5000", "5008")),
    Case("data-cut-short", _st({"a": _f32([24, 4], [0, 384])}, D384[:100]), TruncatedCheckpointError,
         "tensor data needs 384 bytes after the header, file has 100"),
    # 12. unreadable, special or looping paths; 16. nothing that would block
    Case("fifo-safetensors", _named_fifo("x.safetensors"), E, "not a regular file (a FIFO)"),
    Case("fifo-pt", _named_fifo("x.pt"), E, "not a regular file (a FIFO)"),
    Case("fifo-in-folder", lambda t, m: _named_fifo("model.safetensors")(t, m) and str(t), SourceNotFoundError, "no weight files"),
    Case("dev-zero-safetensors", _link("x.safetensors", "/dev/zero"), E, "not a regular file (a character device)"),
    Case("dev-null-pt", _link("x.pt", "/dev/null"), E, "not a regular file (a character device)"),
    Case("proc-self-mem-safetensors", _link("x.safetensors", "/proc/self/mem"), SourceNotFoundError,
         "cannot be read (Input/output error)"),
    Case("proc-self-mem-pt", _link("x.pt", "/proc/self/mem"), SourceNotFoundError, "cannot be read (Input/output error)"),
    Case("symlink-loop", lambda t, m: (t / "a.safetensors").symlink_to(t / "b.safetensors") or
         (t / "b.safetensors").symlink_to(t / "a.safetensors") or str(t / "a.safetensors"), SourceNotFoundError,
         "a symbolic link in a loop"),
    Case("dangling-symlink", _link("x.safetensors", "/no/such/file"), SourceNotFoundError,
         "a symbolic link to /no/such/file, which does not exist"),
    Case("nul-in-path", lambda t, m: str(t / "x\0.safetensors"), SourceNotFoundError, "no such file or folder"),
    # 7. zip .pt records: CRC, compression, truncation, garbage
    Case("pt-crc-mismatch", _pt_edit(_flip_data_record), E, "a data record fails its CRC-32 check"),
    Case("pt-compressed-record", _compressed_pt, E, "a compressed zip record"),
    Case("pt-truncated", _pt_edit(lambda d: d[: len(d) // 2]), E, "not a readable PyTorch checkpoint"),
    Case("pt-garbage-passwd", lambda t, m: str(_passwd(t).rename(t / "x.pt")), E, "not a readable PyTorch checkpoint",
         forbidden=("'r'", "x:0:0")),
    # 13. sparse, meta and expanded tensors; 5. nested containers
    Case("sparse-coo", _pt(lambda: {"dense.weight": _matrix(), "s.weight": _matrix(1).to_sparse()}),
         layers=("dense.weight",), skipped={"s.weight": "sparse_coo tensor: wbfe reads dense weights only"}),
    Case("sparse-csr", _pt(lambda: {"dense.weight": _matrix(), "s.weight": _matrix(1).to_sparse_csr()}),
         layers=("dense.weight",), skipped={"s.weight": "sparse_csr tensor"}),
    Case("meta-device", _pt(lambda: {"dense.weight": _matrix(), "m.weight": torch.empty(24, 16, device="meta")}),
         layers=("dense.weight",), skipped={"m.weight": "meta-device tensor"}),
    Case("stride-0-20000", _pt(lambda: {"dense.weight": _matrix(), "big.weight": torch.ones(1).expand(20_000, 20_000)}),
         layers=("dense.weight",), skipped={"big.weight": "stride-0 (expanded) storage: its 400000000 elements view 4 bytes"}),
    Case("stride-0-row", _pt(lambda: {"dense.weight": _matrix(), "row.weight": _matrix(2)[:1].expand(64, 16)}),
         layers=("dense.weight",), skipped={"row.weight": "stride-0 (expanded) storage"}),
    Case("sparse-only", _pt(_sparse_only), NoUsableMatrixError, "sparse_coo tensor"),
    Case("nested-dict", _pt(lambda: {"fc.weight": _matrix(), "encoder": {"layer.weight": _matrix(1), "deeper": {"w": _matrix(2)}}}),
         layers=("fc.weight", "encoder.layer.weight", "encoder.deeper.w")),
    Case("nested-list", _pt(lambda: {"fc.weight": _matrix(), "blocks": [{"w": _matrix(1)}, _matrix(2)]}),
         layers=("fc.weight", "blocks.0.w", "blocks.1")),
    Case("nested-cycle", _pt(_cycle), layers=("head.weight", "encoder.fc.weight")),
    Case("nested-name-clash", _pt(lambda: {"encoder.w": _matrix(), "encoder": {"w": _matrix(1)}}), E,
         "two tensors are both named 'encoder.w'"),
    # 4. a './' shard name: the same file, every tensor kept
    Case("index-dot-slash-shard", _dotted_prefix_index,
         layers=("classifier.weight", "blocks.0.mlp.fc1.weight", "blocks.0.attn.qkv.weight", "embed.weight")),
    # a config.json beside the weights that is a FIFO, or nested too deeply: ignored, never blocking
    Case("config-json-fifo", lambda t, m: os.mkfifo(t / "config.json") or str(_valid_st(t / "model.safetensors").parent),
         layers=("fc.weight",)),
    Case("config-json-deep", lambda t, m: (t / "config.json").write_bytes(b"[" * 100_000 + b"]" * 100_000) and
         str(_valid_st(t / "model.safetensors").parent), layers=("fc.weight",)),
    # 17. hub ids: a mistyped folder, an unreachable hub, typed hub answers
    Case("mistyped-folder-offline", _mistyped_folder, ModelNotFoundError,
         "hf/lama: no such file or folder, and no such model in the local Hugging Face cache"),
    Case("hub-unreachable-fast", _hub_unreachable, ModelNotFoundError, "the Hugging Face hub could not be reached (127.0.0.1"),
    Case("hub-repo-not-found", _hub_answers(_http_error("RepositoryNotFoundError", 404)), ModelNotFoundError,
         "no such model on the Hugging Face hub"),
    Case("hub-gated", _hub_answers(_http_error("GatedRepoError", 403)), ModelNotFoundError, "a gated model"),
    Case("hub-revision-not-found", _hub_answers(_http_error("RevisionNotFoundError", 404)), ModelNotFoundError,
         "no such revision"),
    Case("hub-server-error", _hub_answers(_http_error("HfHubHTTPError", 503)), ModelNotFoundError,
         "the Hugging Face hub refused the request (HTTP 503)"),
    # 18. an unknown timm name: a short message with close suggestions
    Case("timm-unknown", lambda t, m: "timm:resnet5O", UnknownNameError, "did you mean 'resnet50"),
]


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """A case that blocks (a FIFO opened for reading) fails instead of hanging the suite."""
    def fail(signum: int, frame: Any) -> None:
        raise TimeoutError("blocked for 60 s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


def test_the_table_covers_the_campaign() -> None:
    assert len(CASES) >= 60 and len(set(_ids(CASES))) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_library(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = case.build(tmp_path, monkeypatch)
    if case.error is None:
        result = wbfe.score(ref, metrics="bfe")
        _check_accounted(case, {r["name"] for r in result.layers}, {s["name"]: s["reason"] for s in result.skipped})
        return
    with pytest.raises(case.error) as caught:
        wbfe.score(ref, metrics="bfe")
    message = str(caught.value)
    assert case.message in message
    assert "\n" not in message and len(message) < 1000, message
    for text in case.forbidden:
        assert text not in message


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_cli(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = case.build(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["score", ref, "--metrics", "bfe", "--format", "json"])
    assert "Traceback" not in result.stdout + result.stderr
    if case.error is None:
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)
        _check_accounted(case, {r["name"] for r in data["layers"]}, {s["name"]: s["reason"] for s in data["skipped"]})
        return
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert result.stdout == ""
    assert result.stderr.startswith("wbfe: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert case.message in result.stderr
    for text in case.forbidden:
        assert text not in result.stderr


def _check_accounted(case: Case, layers: set[str], skipped: dict[str, str]) -> None:
    assert set(case.layers) <= layers, (layers, skipped)
    for name, reason in case.skipped.items():
        assert reason in skipped.get(name, ""), skipped
    assert not layers & set(skipped)
    assert not any("tied" in reason and reason.endswith(name) for name, reason in skipped.items())


# --- cases that need a process of their own ---------------------------------------------------------


def _cli_process(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "default"}
    return subprocess.run([str(Path(sys.executable).parent / "wbfe"), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT, **kwargs)


def test_torch_warnings_do_not_precede_the_error_line(tmp_path: Path) -> None:
    """torch warns while loading sparse tensors ("Validating sparse tensor invariants"); the user
    sees wbfe's one line only (pytest would swallow the warning in-process, hence a process)."""
    path = tmp_path / "sparse.pt"
    torch.save(_sparse_only(), path)
    done = _cli_process("score", str(path), "--metrics", "bfe")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("wbfe: error: "), done.stderr
    assert "no usable weight matrix" in done.stderr and "sparse_coo tensor" in done.stderr


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder another user can reach (pytest's tmp_path sits under a 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="wbfe-unreadable-"))
    folder.chmod(0o755)
    yield folder
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(0o700)
    import shutil

    shutil.rmtree(folder)


@pytest.mark.parametrize("kind", ["file", "folder", "shard"])
def test_unreadable_file_or_folder(kind: str, open_dir: Path) -> None:
    """As root permissions do not apply, so the CLI then runs as user 'nobody' (uid 65534)."""
    _valid_st(open_dir / "ok.safetensors")
    if kind == "file":
        target = open_dir / "ok.safetensors"
        target.chmod(0o000)
    elif kind == "folder":
        target = open_dir / "ckpt"
        _valid_st(target / "model.safetensors")
        target.chmod(0o000)
    else:
        _valid_st(open_dir / "ckpt" / "model-00001.safetensors")
        target = Path(_index(open_dir / "ckpt", {"fc.weight": "model-00001.safetensors"}))
        (open_dir / "ckpt" / "model-00001.safetensors").chmod(0o000)
    if os.geteuid() == 0:
        # Root reads anything, and Python may live under root's 0700 home: import everything
        # first, then drop to 'nobody' (uid 65534) and open the checkpoint.
        script = ("import os, sys, torch, wbfe.errors, wbfe.sources.local\n"
                  "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                  f"try: wbfe.sources.open_source({str(target)!r})\n"
                  "except wbfe.errors.WbfeError as exc: print(type(exc).__name__, exc)")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.stderr == "" and done.stdout.count("\n") == 1, done.stdout + done.stderr
        assert done.stdout.startswith("SourceNotFoundError ")
        assert "cannot be read (Permission denied)" in done.stdout
    else:
        with pytest.raises(SourceNotFoundError, match=r"cannot be read \(Permission denied\)"):
            wbfe.score(target, metrics="bfe")


def test_unknown_timm_name_is_short() -> None:
    pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    with pytest.raises(UnknownNameError) as caught:
        wbfe.score("timm:resnet5O")
    message = str(caught.value)
    assert len(message) < 300 and message.count("'") <= 12, message
    assert "known names, not listed" in message
