"""Layout semantics (spec §3.1–§3.2): which block of a global tensor each local rank holds.

Written from the spec's definitions, not from ckptfs: device coordinates row-major, tensor map
values counted from the right, multi-axis dimensions as mixed-radix numbers, optimizer sharding as
a further split of dimension 0 chosen by the rank's position in its replica group.
"""

import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple


class LayoutError(ValueError):
    pass


def _map_entry_axes(entry, n_axes: int) -> Tuple[int, ...]:
    """Device-axis indices (into dev_matrix, outer first) of one tensor-map entry."""
    values = entry if isinstance(entry, (list, tuple)) else [entry]
    values = [v for v in values if v != -1]
    axes = []
    for v in values:
        if not 0 <= v < n_axes:
            raise LayoutError(f"tensor map value {v} outside a {n_axes}-axis device matrix")
        axes.append(n_axes - 1 - v)
    return tuple(axes)


def coords_of(rank: int, dev_matrix: Sequence[int]) -> Tuple[int, ...]:
    coords = []
    for size in reversed(dev_matrix):
        coords.append(rank % size)
        rank //= size
    return tuple(reversed(coords))


def rank_of(coords: Sequence[int], dev_matrix: Sequence[int]) -> int:
    rank = 0
    for c, size in zip(coords, dev_matrix):
        rank = rank * size + c
    return rank


@dataclass(frozen=True)
class Layout:
    dev_matrix: Tuple[int, ...]
    # Per tensor dimension, the device axes splitting it, most significant first.
    dim_axes: Tuple[Tuple[int, ...], ...]
    opt_size: int = 0
    opt_step: int = 0

    @staticmethod
    def from_map(dev_matrix, tensor_map, opt_size: int = 0, opt_step: int = 0) -> "Layout":
        dev = tuple(int(d) for d in dev_matrix)
        if not dev or any(d < 1 for d in dev):
            raise LayoutError(f"bad device matrix {list(dev)}")
        dim_axes = tuple(_map_entry_axes(e, len(dev)) for e in tensor_map)
        used = [a for axes in dim_axes for a in axes]
        if len(used) != len(set(used)):
            raise LayoutError(f"a device axis splits two dimensions in map {tensor_map}")
        layout = Layout(dev, dim_axes, int(opt_size), int(opt_step))
        layout._check_optimizer_shard()
        return layout

    @staticmethod
    def unsharded(ndim: int) -> "Layout":
        return Layout((1,), tuple(() for _ in range(ndim)))

    # -- device space ---------------------------------------------------------------------------

    @property
    def devices(self) -> int:
        return math.prod(self.dev_matrix)

    @property
    def ndim(self) -> int:
        return len(self.dim_axes)

    def coords(self, rank: int) -> Tuple[int, ...]:
        if not 0 <= rank < self.devices:
            raise LayoutError(f"rank {rank} outside {self.devices} devices")
        return coords_of(rank, self.dev_matrix)

    def replication_axes(self) -> List[int]:
        used = {a for axes in self.dim_axes for a in axes}
        return [a for a in range(len(self.dev_matrix)) if a not in used]

    # -- model-parallel blocks (§3.1) -----------------------------------------------------------

    def model_splits(self) -> List[int]:
        return [math.prod(self.dev_matrix[a] for a in axes) for axes in self.dim_axes]

    def model_block(self, rank: int) -> Tuple[int, ...]:
        c = self.coords(rank)
        blocks = []
        for axes in self.dim_axes:
            b = 0
            for a in axes:
                b = b * self.dev_matrix[a] + c[a]
            blocks.append(b)
        return tuple(blocks)

    # -- optimizer sharding (§3.2) --------------------------------------------------------------

    @property
    def replica_count(self) -> int:
        return self.devices // math.prod(self.model_splits())

    @property
    def opt_pieces(self) -> int:
        """K: how many optimizer pieces dimension 0's model-parallel slice is cut into."""
        if self.opt_size == 0 or self.opt_step == 0:
            return 1
        return self.replica_count if self.opt_size == -1 else self.opt_size

    def _check_optimizer_shard(self) -> None:
        if self.opt_size > 0 and self.opt_step == 0:
            raise LayoutError("opt_weight_shard_size set without opt_weight_shard_step")
        if self.opt_size < -1:
            raise LayoutError(f"bad opt_weight_shard_size {self.opt_size}")
        if self.opt_pieces > 1 and self.ndim == 0:
            raise LayoutError("optimizer sharding of a 0-d tensor")
        if self.replica_count % self.opt_pieces:
            raise LayoutError(f"optimizer shard size {self.opt_pieces} does not divide "
                              f"{self.replica_count} replicas")

    def replica_group(self, rank: int) -> List[int]:
        block = self.model_block(rank)
        return [r for r in range(self.devices) if self.model_block(r) == block]

    def opt_piece(self, rank: int) -> int:
        if self.opt_pieces == 1:
            return 0
        return self.replica_group(rank).index(rank) % self.opt_pieces

    def mindspore_opt_step(self) -> int:
        """The step MindSpore writes: stride between consecutive members of a replica group."""
        group = self.replica_group(0)
        if len(group) < 2:
            return 0
        return (group[-1] - group[0]) // (len(group) - 1)

    # -- blocks with both splits folded in ------------------------------------------------------

    def splits(self) -> List[int]:
        s = self.model_splits()
        if s:
            s[0] *= self.opt_pieces
        return s

    def block(self, rank: int) -> Tuple[int, ...]:
        b = list(self.model_block(rank))
        if b:
            b[0] = b[0] * self.opt_pieces + self.opt_piece(rank)
        return tuple(b)

    def check_shape(self, global_shape: Sequence[int], what: str = "tensor") -> None:
        if len(global_shape) != self.ndim:
            raise LayoutError(f"{what}: tensor map has {self.ndim} entries, tensor has "
                              f"{len(global_shape)} dimensions")
        for j, (g, s) in enumerate(zip(global_shape, self.splits())):
            if g % s:
                raise LayoutError(f"{what}: dimension {j} of size {g} does not divide by {s}")

    def slice_shape(self, global_shape: Sequence[int]) -> List[int]:
        self.check_shape(global_shape)
        return [g // s for g, s in zip(global_shape, self.splits())]

    def box(self, rank: int, global_shape: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
        """Half-open per-dimension ranges of the global tensor that local `rank` stores."""
        lengths = self.slice_shape(global_shape)
        return tuple((b * n, (b + 1) * n) for b, n in zip(self.block(rank), lengths))

    # -- expanded form for the needed-rank rule (§4.5 a) ----------------------------------------

    def expanded(self) -> Tuple[Tuple[int, ...], Tuple[Tuple[int, ...], ...]]:
        """Device axes and per-dimension axis lists with the optimizer split made an axis.

        The optimizer piece is the rank's replica position mod K, i.e. the lowest digits of the
        mixed-radix number over the replication axes: the innermost replication axes (the last
        one cut in two when K falls inside it), appended as least significant axes of dim 0.
        """
        k = self.opt_pieces
        if k == 1:
            return self.dev_matrix, self.dim_axes
        sizes = list(self.dev_matrix)
        opt_axes: List[int] = []  # indices into the original matrix, outer first
        split_at = None           # (axis, inner part) when K ends inside an axis
        remaining = k
        for a in reversed(self.replication_axes()):
            if remaining == 1:
                break
            if remaining % sizes[a] == 0:
                opt_axes.insert(0, a)
                remaining //= sizes[a]
            elif sizes[a] % remaining == 0:
                split_at = (a, remaining)
                remaining = 1
            else:
                raise LayoutError(f"optimizer shard size {k} is not a product of inner replication "
                                  f"axes of {list(self.dev_matrix)}")
        # Re-index after splitting: axis a becomes (outer a, inner a+1) and later axes shift.
        new_sizes: List[int] = []
        index_map = {}
        split_inner = None
        for a, size in enumerate(sizes):
            index_map[a] = len(new_sizes)
            if split_at and split_at[0] == a:
                new_sizes.append(size // split_at[1])
                split_inner = len(new_sizes)
                new_sizes.append(split_at[1])
            else:
                new_sizes.append(size)
        dims = [tuple(index_map[a] for a in axes) for axes in self.dim_axes]
        extra = [split_inner] if split_inner is not None else []
        extra += [index_map[a] for a in opt_axes]
        dims[0] = dims[0] + tuple(extra)
        return tuple(new_sizes), tuple(dims)
