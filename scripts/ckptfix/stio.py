"""Writing safetensors files (spec torch-hfai-safetensors.md §4.1, §4.3), independent of ckptfs.

The layout is the reference writer's: entries sorted by dtype (descending in the writer's enum
order) then name bytes, data consecutive in that order, a compact JSON header with
`__metadata__` first, padded with spaces to a multiple of 8, after an 8-byte little-endian
length. Content is streamed, so tensors larger than memory can be written.
"""

import json
import struct
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

# MindSpore tensor_type -> safetensors code; the list order is the writer's enum order (§4.3).
CODES = [("Bool", "BOOL"), ("UInt8", "U8"), ("Int8", "I8"), ("Int16", "I16"),
         ("UInt16", "U16"), ("Float16", "F16"), ("BFloat16", "BF16"), ("Int32", "I32"),
         ("UInt32", "U32"), ("Float32", "F32"), ("Float64", "F64"), ("Int64", "I64"),
         ("UInt64", "U64")]
CODE_OF = dict(CODES)
TYPE_OF = {code: t for t, code in CODES}
ENUM_RANK = {code: i for i, (_, code) in enumerate(CODES)}


@dataclass
class Entry:
    name: str
    tensor_type: str  # MindSpore's name ("Float32")
    shape: List[int]
    nbytes: int
    chunks: Callable[[], Iterator[bytes]]


def writer_order(entries):
    """Entries (anything with .tensor_type and .name) in the reference writer's order."""
    return sorted(entries, key=lambda e: (-ENUM_RANK[CODE_OF[e.tensor_type]],
                                          e.name.encode("utf-8")))


def header_bytes(entries: List[Entry], metadata: Optional[Dict[str, str]]) -> bytes:
    """The length prefix and header of `entries`, taken in the order given."""
    doc = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    offset = 0
    for e in entries:
        doc[e.name] = {"dtype": CODE_OF[e.tensor_type], "shape": list(e.shape),
                       "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    # serde_json's compact form: no spaces, raw UTF-8, lowercase \u escapes (Python's too).
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def write(path: str, entries: List[Entry], metadata: Optional[Dict[str, str]],
          keep_order: bool = False) -> int:
    """Writes a file in the reference writer's layout (or, with keep_order, its data and header
    in the order given, as another writer may); returns its size."""
    ordered = list(entries) if keep_order else writer_order(entries)
    size = 0
    with open(path, "wb") as f:
        head = header_bytes(ordered, metadata)
        f.write(head)
        size += len(head)
        for e in ordered:
            got = 0
            for chunk in e.chunks():
                f.write(chunk)
                got += len(chunk)
            if got != e.nbytes:
                raise ValueError(f"{e.name}: {got} bytes written, {e.nbytes} declared")
            size += got
    return size


def read_header(path: str):
    """(metadata, {name: (code, shape, begin, end)}, data_start) of a file, for checks."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        doc = json.loads(f.read(n).decode("utf-8"))
    meta = doc.pop("__metadata__", None)
    return meta, {k: (v["dtype"], v["shape"], *v["data_offsets"]) for k, v in doc.items()}, 8 + n
