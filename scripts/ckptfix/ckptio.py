"""Reading and writing MindSpore `.ckpt` files record by record (spec §1).

A file is a run of one-record `Checkpoint` messages; content is streamed so a parameter larger
than memory can be written, split into several records exactly as MindSpore's savers do (§1.5).
"""

import math
import zlib
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

import numpy as np

from . import wire

# MindSpore ≥2.3 cuts content larger than this into byte chunks of exactly this size (§1.5).
MINDSPORE_CHUNK_BYTES = 536_870_912

CRC_MAGIC = b"crc_num"
CRC_TRAILER_BYTES = 17

# Encryption magics as they appear at the start of the file (little-endian uint32s, §1.8).
ENCRYPTION_MAGICS = {
    "gcm": bytes.fromhex("D85E3A7F"),
    "cbc": bytes.fromhex("D95E3A7F"),
    "sm4": bytes.fromhex("DA5E3A7F"),
}

# tensor_type string -> little-endian NumPy storage dtype. BFloat16 has no NumPy type: its raw
# 16-bit patterns are kept as uint16, which is all a byte-level oracle needs.
NUMPY_DTYPES = {
    "Bool": np.dtype("?"),
    "Int8": np.dtype("i1"),
    "UInt8": np.dtype("u1"),
    "Int16": np.dtype("<i2"),
    "UInt16": np.dtype("<u2"),
    "Int32": np.dtype("<i4"),
    "UInt32": np.dtype("<u4"),
    "Int64": np.dtype("<i8"),
    "UInt64": np.dtype("<u8"),
    "Float16": np.dtype("<f2"),
    "Float32": np.dtype("<f4"),
    "Float64": np.dtype("<f8"),
    "BFloat16": np.dtype("<u2"),
}

STRING_TYPE = "str"


def element_size(tensor_type: str) -> int:
    return NUMPY_DTYPES[tensor_type].itemsize


def encode_string(text: str) -> bytes:
    # MindSpore stores Python strings as NumPy unicode: 4-byte little-endian code points.
    return text.encode("utf-32-le")


def record_header(tag: str, dims: List[int], tensor_type: str, content_length: int) -> bytes:
    """Every byte of one record except its content (field order of §1.3: dims, type, content)."""
    tensor_prefix = (wire.repeated_varints(1, dims) + wire.string_field(2, tensor_type)
                     + wire.len_field_header(3, content_length))
    tensor_length = len(tensor_prefix) + content_length
    value_prefix = wire.string_field(1, tag) + wire.len_field_header(2, tensor_length)
    value_length = len(value_prefix) + tensor_length
    return wire.len_field_header(1, value_length) + value_prefix + tensor_prefix


def encode_record(tag: str, dims: List[int], tensor_type: str, content: bytes) -> bytes:
    return record_header(tag, dims, tensor_type, len(content)) + content


def chunk_lengths(nbytes: int, limit: int, style: str = "bytes", itemsize: int = 1) -> List[int]:
    """Content length of each record a parameter of `nbytes` becomes (§1.5).

    style "bytes": ≥2.3 synchronous save, consecutive chunks of exactly `limit` bytes; a tensor
    without bytes yields no record. style "elements": ≤2.2, the flattened array is cut by
    array_split into ceil(nbytes/limit) nearly equal element counts.
    """
    if nbytes <= limit:
        if nbytes == 0 and style == "bytes":
            return []
        return [nbytes]
    pieces = math.ceil(nbytes / limit)
    if style == "bytes":
        return [limit] * (pieces - 1) + [nbytes - limit * (pieces - 1)]
    if style == "elements":
        elements = nbytes // itemsize
        base, extra = divmod(elements, pieces)
        return [(base + (1 if i < extra else 0)) * itemsize for i in range(pieces)]
    raise ValueError(f"unknown chunk style {style!r}")


def crc_trailer(crc: int) -> bytes:
    return CRC_MAGIC + crc.to_bytes(10, "big")


class _ByteStream:
    """Hands out exact byte counts from an iterator of arbitrarily sized chunks."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def take(self, count: int) -> Iterator[memoryview]:
        while count > 0:
            if not self._pending:
                try:
                    self._pending = memoryview(next(self._chunks)).cast("B")
                except StopIteration:
                    raise ValueError(f"content ended {count} bytes early") from None
                continue
            part = self._pending[:count]
            self._pending = self._pending[len(part):]
            count -= len(part)
            yield part

    def assert_exhausted(self):
        if self._pending:
            raise ValueError("content longer than announced")
        for rest in self._chunks:
            if len(rest):
                raise ValueError("content longer than announced")


class CheckpointWriter:
    """Appends records to a new checkpoint file; optionally closes it with a CRC trailer (§1.7)."""

    def __init__(self, path: str, crc: bool = False):
        self.path = path
        self._file = open(path, "wb")
        self._want_crc = crc
        self._crc = 0
        self.size = 0

    def _write(self, data) -> None:
        self._file.write(data)
        self._crc = zlib.crc32(data, self._crc)
        self.size += len(data)

    def add(self, tag: str, dims: List[int], tensor_type: str, nbytes: int,
            content: Iterable[bytes], chunk_limit: int = MINDSPORE_CHUNK_BYTES,
            chunk_style: str = "bytes") -> int:
        """Writes one parameter; returns how many records it became."""
        itemsize = 1 if tensor_type == STRING_TYPE else element_size(tensor_type)
        lengths = chunk_lengths(nbytes, chunk_limit, chunk_style, itemsize)
        stream = _ByteStream(content)
        for length in lengths:
            self._write(record_header(tag, dims, tensor_type, length))
            for part in stream.take(length):
                self._write(part)
        stream.assert_exhausted()
        return len(lengths)

    def add_bytes(self, tag: str, dims: List[int], tensor_type: str, content: bytes, **kw) -> int:
        return self.add(tag, dims, tensor_type, len(content), [content], **kw)

    def close(self) -> None:
        if self._file.closed:
            return
        if self._want_crc:
            self._file.write(crc_trailer(self._crc))
            self.size += CRC_TRAILER_BYTES
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Record:
    tag: str
    dims: List[int]
    tensor_type: str
    content: bytes
    # Offset of this record's first byte in the file; lets negative helpers cut inside a record.
    offset: int = 0
    length: int = 0


def split_crc_trailer(data: bytes):
    """(body, crc or None): the trailer is recognised by its magic alone, as MindSpore does."""
    if len(data) >= CRC_TRAILER_BYTES and data[-CRC_TRAILER_BYTES:-10] == CRC_MAGIC:
        return data[:-CRC_TRAILER_BYTES], int.from_bytes(data[-10:], "big")
    return data, None


def parse_records(data: bytes) -> List[Record]:
    """Raw records of a checkpoint body in file order (chunks are NOT joined)."""
    body, _ = split_crc_trailer(data)
    records = []
    view = memoryview(body)
    pos = 0
    while pos < len(view):
        start = pos
        tag_key, pos = wire.read_varint(view, pos)
        if tag_key != 0x0A:
            raise wire.WireError(f"offset {start}: expected a Checkpoint.value record")
        length, pos = wire.read_varint(view, pos)
        if pos + length > len(view):
            raise wire.WireError(f"offset {start}: record overruns the file")
        value = list(wire.iter_fields(view[pos:pos + length]))
        pos += length
        tag = next(bytes(f.value).decode("utf-8") for f in value if f.number == 1)
        tensor = next(f.value for f in value if f.number == 2)
        tensor_fields = list(wire.iter_fields(tensor))
        dims = wire.repeated_ints(tensor_fields, 1)
        tensor_type = next(bytes(f.value).decode() for f in tensor_fields if f.number == 2)
        content = next(bytes(f.value) for f in tensor_fields if f.number == 3)
        records.append(Record(tag, dims, tensor_type, content, start, pos - start))
    return records


def read_records(path: str) -> List[Record]:
    with open(path, "rb") as f:
        return parse_records(f.read())


def join_chunks(records: List[Record]) -> List[Record]:
    """Reader rule of §1.5: consecutive equal tags are one parameter."""
    joined: List[Record] = []
    for rec in records:
        if joined and joined[-1].tag == rec.tag:
            last = joined[-1]
            joined[-1] = Record(rec.tag, rec.dims, rec.tensor_type, last.content + rec.content,
                                last.offset, last.length + rec.length)
        else:
            joined.append(rec)
    return joined


def describe_difference(expected_path: str, actual_path: str) -> Optional[str]:
    """None if the files are byte-identical, else the first difference in record terms."""
    with open(expected_path, "rb") as f:
        want = f.read()
    with open(actual_path, "rb") as f:
        got = f.read()
    if want == got:
        return None
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    try:
        want_recs, got_recs = parse_records(want), parse_records(got)
    except wire.WireError as err:
        return f"sizes {len(want)} vs {len(got)}, first differing byte {first}; unparsable: {err}"
    for i, (a, b) in enumerate(zip(want_recs, got_recs)):
        if (a.tag, a.dims, a.tensor_type) != (b.tag, b.dims, b.tensor_type):
            return (f"record {i}: expected {a.tag} {a.dims} {a.tensor_type}, "
                    f"got {b.tag} {b.dims} {b.tensor_type}")
        if a.content != b.content:
            at = next((j for j, (x, y) in enumerate(zip(a.content, b.content)) if x != y),
                      min(len(a.content), len(b.content)))
            return f"record {i} ({a.tag}): content differs from byte {at}"
    if len(want_recs) != len(got_recs):
        return f"expected {len(want_recs)} records, got {len(got_recs)}"
    return f"sizes {len(want)} vs {len(got)}, first differing byte {first}"
