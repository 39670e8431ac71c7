"""Deterministic tensor contents.

Small tensors are drawn whole from a seeded NumPy generator. Tensors above the case's
`materialize_limit` are never held in memory: each global row (index along dimension 0) is a
window into a fixed pool of random values, so any block can be produced row-chunk by row-chunk.
Float values are kept finite (normal draws) even though the oracle only compares bytes.
"""

import math
import zlib
from typing import Iterator, Sequence, Tuple

import numpy as np

from . import ckptio

# Bytes of global rows generated at once while streaming a block.
STREAM_CHUNK_BYTES = 32 << 20
POOL_ELEMENTS = (1 << 22) + 4099  # odd length so consecutive rows start at unrelated offsets


def rng_for(seed: int, name: str, variant: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), variant])


def random_values(rng: np.random.Generator, tensor_type: str, count: int) -> np.ndarray:
    """`count` random elements in the storage dtype of `tensor_type` (1-D)."""
    dtype = ckptio.NUMPY_DTYPES[tensor_type]
    if tensor_type == "Float32":
        return rng.standard_normal(count, dtype=np.float32)
    if tensor_type == "Float64":
        return rng.standard_normal(count)
    if tensor_type == "Float16":
        return rng.standard_normal(count, dtype=np.float32).astype(dtype)
    if tensor_type == "BFloat16":
        # The top half of a finite float32 is a finite bfloat16 (same exponent bits).
        bits = rng.standard_normal(count, dtype=np.float32).view(np.uint32)
        return (bits >> 16).astype(dtype)
    if tensor_type == "Bool":
        return rng.integers(0, 2, count, dtype=np.uint8).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)


Box = Tuple[Tuple[int, int], ...]


class TensorData:
    """Contents of one global tensor; subclasses differ in how rows are produced."""

    def __init__(self, shape: Sequence[int], tensor_type: str):
        self.shape = tuple(shape)
        self.tensor_type = tensor_type
        self.dtype = ckptio.NUMPY_DTYPES[tensor_type]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def rows(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def block_nbytes(self, box: Box) -> int:
        return math.prod(hi - lo for lo, hi in box) * self.dtype.itemsize

    def block_chunks(self, box: Box) -> Iterator[bytes]:
        """C-order bytes of the sub-block `box`, in pieces of bounded size."""
        (row_lo, row_hi), rest = box[0], box[1:]
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        step = max(1, STREAM_CHUNK_BYTES // max(1, row_bytes))
        inner = tuple(slice(lo, hi) for lo, hi in rest)
        for start in range(row_lo, row_hi, step):
            rows = self.rows(start, min(start + step, row_hi))
            yield np.ascontiguousarray(rows[(slice(None),) + inner]).tobytes()

    def block_array(self, box: Box) -> np.ndarray:
        """The block as an array (small tensors; used by checks)."""
        data = b"".join(self.block_chunks(box))
        return np.frombuffer(data, dtype=self.dtype).reshape([hi - lo for lo, hi in box])


class MaterializedTensor(TensorData):
    def __init__(self, shape, tensor_type, rng: np.random.Generator):
        super().__init__(shape, tensor_type)
        self.array = random_values(rng, tensor_type, math.prod(shape)).reshape(shape)

    def rows(self, start, stop):
        return self.array[start:stop]


_POOLS: dict = {}


def _pool(seed: int, tensor_type: str) -> np.ndarray:
    # One pool per (seed, dtype) shared by all pooled tensors, so memory does not grow with
    # the number of parameters.
    key = (seed, tensor_type)
    if key not in _POOLS:
        _POOLS[key] = random_values(rng_for(seed, "pool:" + tensor_type), tensor_type,
                                    POOL_ELEMENTS)
    return _POOLS[key]


class PooledTensor(TensorData):
    """Row i = a window of a shared random pool starting at (offset + i*stride) mod P."""

    def __init__(self, shape, tensor_type, rng: np.random.Generator, seed: int):
        super().__init__(shape, tensor_type)
        self.pool = _pool(seed, tensor_type)
        self.row_elements = math.prod(shape[1:])
        self.offset = int(rng.integers(0, POOL_ELEMENTS))
        self.stride = int(rng.integers(1, POOL_ELEMENTS))

    def _row(self, i: int) -> np.ndarray:
        start = (self.offset + i * self.stride) % POOL_ELEMENTS
        n = self.row_elements
        pieces = []
        while n > 0:
            take = min(n, POOL_ELEMENTS - start)
            pieces.append(self.pool[start:start + take])
            n -= take
            start = 0
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def rows(self, start, stop):
        out = np.empty((stop - start, self.row_elements), dtype=self.dtype)
        for i in range(start, stop):
            out[i - start] = self._row(i)
        return out.reshape((stop - start,) + self.shape[1:])


def make_tensor(shape, tensor_type: str, seed: int, name: str, variant: int = 0,
                materialize_limit: int = 64 << 20) -> TensorData:
    rng = rng_for(seed, name, variant)
    nbytes = math.prod(shape) * ckptio.NUMPY_DTYPES[tensor_type].itemsize
    if nbytes <= materialize_limit or len(shape) < 2:
        return MaterializedTensor(shape, tensor_type, rng)
    return PooledTensor(shape, tensor_type, rng, seed)


def full_box(shape: Sequence[int]) -> Box:
    return tuple((0, d) for d in shape)


def scalar_bytes(tensor_type: str, value) -> bytes:
    if tensor_type == ckptio.STRING_TYPE:
        return ckptio.encode_string(str(value))
    if tensor_type == "BFloat16":
        bits = np.array([value], dtype=np.float32).view(np.uint32)
        return (bits >> 16).astype("<u2").tobytes()
    return np.array([value], dtype=ckptio.NUMPY_DTYPES[tensor_type]).tobytes()


def rank_variant(tensor_type: str, value, rank: int):
    """The value a rank-specific extra has on global rank `rank` (rank 0 keeps the original)."""
    if rank == 0:
        return value
    if tensor_type == ckptio.STRING_TYPE:
        return f"{value}@rank{rank}"
    if tensor_type == "Bool":
        return bool(value) != bool(rank % 2)
    if isinstance(value, float) or tensor_type.startswith(("Float", "BFloat")):
        return float(value) + rank
    return int(value) + rank
