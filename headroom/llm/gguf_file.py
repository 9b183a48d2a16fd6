"""A fast GGUF reader: metadata and memory-mapped tensor views, nothing converted.

The `gguf` package's `GGUFReader` builds a numpy view for every part of every metadata field, which takes
~4 s on SmolLM2's file (its 49k-token vocabulary and merges); this reader walks the header once with
`struct` (string arrays are skipped, ~0.1 s) and keeps scalars and short arrays only. Tensor data are
`np.memmap` views of the file: `[rows, row_bytes]` uint8 (a row of a block-quantised matrix is its blocks) or
the raw float array for F32/F16, paged in on first touch and shared with every process mapping the file.

Format (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key/value count; each
key/value: string key, u32 type, value; each tensor: string name, u32 n_dims, u64 dims (innermost first),
u32 ggml type, u64 offset from the aligned start of the data section (`general.alignment`, default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# ggml type id -> (name, values per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEPT_ARRAY = 4096  # longer arrays (vocabulary, merges, scores) are skipped unless asked for


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file, still in the file's format."""

    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    fmt: str  # "F32" | "F16" | "Q4_0" | "Q4_1" | "Q8_0"
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix (GGUF stores dims innermost first)
    data: np.ndarray  # memory-mapped: uint8 [rows, row_bytes] for block formats, else float32/float16 values


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """A GGUF file's metadata (scalars and arrays of <= 4096 items) and its tensors, by name."""

    path: Path  # the file
    metadata: dict[str, Any]  # key -> value (strings decoded; long arrays absent)
    tensors: dict[str, GGUFTensor]  # name -> tensor, in file order

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, or `default` when absent."""
        return self.metadata.get(key, default)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = int(self.unpack("<Q"))
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, keep_all: bool = False) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        item_type, count = int(self.unpack("<I")), int(self.unpack("<Q"))
        if keep_all and item_type == _STRING:
            return self.strings(count)
        if item_type in _SCALARS and (keep_all or count <= _MAX_KEPT_ARRAY):
            size = struct.calcsize(_SCALARS[item_type])
            out = list(struct.unpack_from(f"<{count}{_SCALARS[item_type][1]}", self.buf, self.pos))
            self.pos += count * size
            return out
        if item_type in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[item_type])
            return None
        if item_type == _STRING and count > _MAX_KEPT_ARRAY:
            for _ in range(count):  # skip: each string is a u64 length + bytes
                self.pos += 8 + int(struct.unpack_from("<Q", self.buf, self.pos)[0])
            return None
        return [self.value(item_type) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        out: list[str] = []
        buf, pos = self.buf, self.pos
        for _ in range(count):
            n = int(struct.unpack_from("<Q", buf, pos)[0])
            out.append(bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", errors="replace"))
            pos += 8 + n
        self.pos = pos
        return out


def read_gguf(path: Path, full_arrays: frozenset[str] = frozenset()) -> GGUFFile:
    """Parse the header of a GGUF file and map its tensors (no tensor data is read); the arrays named in
    `full_arrays` (e.g. "tokenizer.ggml.tokens") are kept whatever their length."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(data))  # type: ignore[arg-type]
    if bytes(cur.buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (bad magic)")
    cur.pos = 4
    version = int(cur.unpack("<I"))
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = int(cur.unpack("<Q")), int(cur.unpack("<Q"))
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(int(cur.unpack("<I")), keep_all=key in full_arrays)
        if value is not None:
            metadata[key] = value
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(int(cur.unpack("<Q")) for _ in range(int(cur.unpack("<I"))))
        infos.append((name, dims, int(cur.unpack("<I")), int(cur.unpack("<Q"))))
    align = int(metadata.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, type_id, offset in infos:
        if type_id not in GGML_TYPES:
            raise ValueError(
                f"{path}: tensor {name} has ggml type {type_id}; supported: "
                f"{', '.join(n for n, _, _ in GGML_TYPES.values())} (re-quantise the GGUF to one of them)"
            )
        fmt, per_block, block_bytes = GGML_TYPES[type_id]
        cols = dims[0]
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        if cols % per_block:
            raise ValueError(f"{path}: tensor {name} has {cols} columns, not a multiple of {fmt}'s block")
        row_bytes = cols // per_block * block_bytes
        begin = start + offset
        raw = data[begin : begin + rows * row_bytes]
        if raw.size != rows * row_bytes:
            raise ValueError(f"{path}: tensor {name} runs past the end of the file (truncated download?)")
        shape = tuple(reversed(dims))
        view: np.ndarray
        if fmt == "F32":
            view = raw.view(np.float32).reshape(shape)
        elif fmt == "F16":
            view = raw.view(np.float16).reshape(shape)
        else:
            view = raw.reshape(rows, row_bytes)
        tensors[name] = GGUFTensor(name, fmt, shape, view)
    return GGUFFile(path, metadata, tensors)
