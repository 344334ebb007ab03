"""Legacy (non-zip) PyTorch checkpoints: torch fills the storages its key list names from their
records without comparing them with the tensors (wbfe/sources/torch_legacy.py). A file whose key
list leaves a storage out, whose record counts other elements, or whose bytes run past its end is
refused before torch hands over uninitialised memory; what torch.save writes still loads as
torch.load reads it. Found by fuzzing the torch reader: the corpus input has its key list emptied,
and torch.load returns different numbers for it on every call."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import wbfe  # noqa: E402
from wbfe.errors import CorruptCheckpointError  # noqa: E402

CORPUS = Path(__file__).parent / "fuzz_corpus" / "torch" / "uninitialised-legacy-storages-84cac5d2.bin"


def _legacy(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def _state():
    g = torch.Generator().manual_seed(4)
    return {"fc.weight": torch.randn(12, 6, generator=g), "fc.bias": torch.zeros(12),
            "head.weight": torch.randn(3, 12, generator=g).half(), "view.weight": torch.randn(8, 8, generator=g)[::2]}


def _key_list_span(data: bytes) -> tuple[int, int]:
    """Where the pickled key list sits: after the four pickles (the test's own, trusted bytes)."""
    fh = io.BytesIO(data)
    for _ in range(3):
        pickle.load(fh)

    class Objects(pickle.Unpickler):
        def persistent_load(self, pid):
            return None

        def find_class(self, module, name):
            return lambda *a, **k: None

    Objects(fh).load()
    start = fh.tell()
    pickle.load(fh)
    return start, fh.tell()


def test_what_torch_save_writes_still_loads_as_torch_reads_it(tmp_path):
    path = tmp_path / "legacy.bin"
    path.write_bytes(_legacy(_state()))
    got = {row["name"]: row for row in wbfe.score(str(path), metrics="bfe").layers}
    want = {row["name"]: row for row in wbfe.score(torch.load(path, weights_only=True), metrics="bfe").layers}
    assert got.keys() == want.keys() and got
    assert all(got[n]["bfe"] == want[n]["bfe"] for n in got)


def test_a_storage_left_out_of_the_key_list_is_refused(tmp_path):
    data = _legacy(_state())
    start, end = _key_list_span(data)
    keys = pickle.loads(data[start:end])
    path = tmp_path / "dropped.bin"
    # the last key left out, its record left in place: torch loads it and leaves that storage unfilled
    path.write_bytes(data[:start] + pickle.dumps(keys[:-1], protocol=2) + data[end:])
    with pytest.raises(CorruptCheckpointError, match=r"1 of its 4 storages have no record in the file"):
        wbfe.score(str(path))


def test_a_record_that_counts_other_elements_is_refused(tmp_path):
    data = _legacy(_state())
    _, end = _key_list_span(data)
    (count,) = struct.unpack("<q", data[end:end + 8])
    path = tmp_path / "count.bin"
    path.write_bytes(data[:end] + struct.pack("<q", count - 1) + data[end + 8:])
    with pytest.raises(CorruptCheckpointError, match=rf"holds {count - 1} elements in the file, {count} in its tensor"):
        wbfe.score(str(path))


def test_a_record_cut_short_is_refused(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(_legacy(_state())[:-5])
    with pytest.raises(CorruptCheckpointError, match="legacy PyTorch checkpoint"):
        wbfe.score(str(path))


def test_the_fuzz_input_is_refused(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(CORPUS.read_bytes())
    with pytest.raises(CorruptCheckpointError, match=r"4 of its 4 storages have no record in the file"):
        wbfe.score(str(path))


def test_a_key_list_pickled_with_a_protocol_number_pickle_refuses_is_still_checked(tmp_path):
    # torch's weights-only unpickler reads any PROTO number (it warns and reads on); the check read
    # the key list with pickle, which refuses a protocol above HIGHEST_PROTOCOL, and so left torch
    # to fill the storages unchecked: a key list short of a storage loaded, with uninitialised memory
    # in it (found by fuzzing: tests/fuzz_corpus/torch/legacy-pickle-protocol-101-*).
    data = _legacy(_state())
    start, end = _key_list_span(data)
    keys = pickle.loads(data[start:end])
    shorter = pickle.dumps(keys[:-1], protocol=2)
    assert shorter[:2] == b"\x80\x02"
    path = tmp_path / "protocol.bin"
    path.write_bytes(data[:start] + b"\x80\x65" + shorter[2:] + data[end:])
    with pytest.raises(CorruptCheckpointError, match=r"1 of its 4 storages have no record in the file"):
        wbfe.score(str(path))
    # and a sound file whose pickles say protocol 101 is read as torch reads it
    path.write_bytes(data[:start] + b"\x80\x65" + data[start + 2:])
    got = {row["name"]: row["bfe"] for row in wbfe.score(str(path), metrics="bfe").layers}
    assert got and got == {row["name"]: row["bfe"] for row in wbfe.score(_state(), metrics="bfe").layers}


def test_a_record_count_past_any_file_size_is_refused(tmp_path):
    # A count whose bytes no seek can reach (2**62 elements) ended the check in a ValueError.
    data = _legacy(_state())
    _, end = _key_list_span(data)
    path = tmp_path / "huge.bin"
    path.write_bytes(data[:end] + struct.pack("<q", 1 << 62) + data[end + 8:])
    with pytest.raises(CorruptCheckpointError, match=rf"holds {1 << 62} elements in the file"):
        wbfe.score(str(path))


@pytest.mark.parametrize("name", ["legacy-pickle-protocol-101-84cac5d2.bin", "legacy-record-count-overflow-807c168f.bin",
                                  "legacy-sys-info-damaged-84cac5d2.bin"])
def test_the_later_fuzz_inputs_are_refused(tmp_path, name):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes((CORPUS.parent / name).read_bytes())
    with pytest.raises(CorruptCheckpointError, match="corrupt legacy PyTorch checkpoint"):
        wbfe.score(str(path))


def test_a_damaged_system_info_does_not_switch_the_check_off(tmp_path):
    # torch ignores the third pickle (byte order, type sizes); the check gave up on a file whose
    # "little_endian" key was damaged, and torch filled its storages unchecked (found by fuzzing:
    # tests/fuzz_corpus/torch/legacy-sys-info-damaged-*, its key list also emptied).
    data = _legacy(_state())
    fh = io.BytesIO(data)
    for _ in range(2):
        pickle.load(fh)
    info_start = fh.tell()
    info = pickle.load(fh)
    info_end = fh.tell()
    damaged = pickle.dumps({("lmttle_endian" if k == "little_endian" else k): v for k, v in info.items()}, protocol=2)
    start, end = _key_list_span(data)
    keys = pickle.loads(data[start:end])
    rebuilt = data[:info_start] + damaged + data[info_end:start] + pickle.dumps(keys[:-1], protocol=2) + data[end:]
    path = tmp_path / "info.bin"
    path.write_bytes(rebuilt)
    with pytest.raises(CorruptCheckpointError, match=r"1 of its 4 storages have no record in the file"):
        wbfe.score(str(path))
    # and a sound file with that damage still loads as torch reads it
    path.write_bytes(data[:info_start] + damaged + data[info_end:])
    got = {row["name"]: row["bfe"] for row in wbfe.score(str(path), metrics="bfe").layers}
    assert got and got == {row["name"]: row["bfe"] for row in wbfe.score(_state(), metrics="bfe").layers}
