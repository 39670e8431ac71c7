"""Safetensors in and out, really mounted.

* Safetensors sources (the generator's own writer, from the spec) on every layout twin, and .ckpt
  sources: both views (.ckpt and .safetensors) of every target equal the expected files the
  generator wrote by construction, whole and in random windows.
* The .safetensors view is read through mmap in the default mount mode, and parsed by an
  independent reader (json + numpy): offsets in order, tiling the data, and every tensor equal to
  the same record of the .ckpt view parsed by Google's protobuf runtime. The `safetensors`
  package's own reader (0.7.0, in build/test-venv, made by scripts/install-deps.sh) reads the view
  too.
* --view and --prefix; strings left out of the safetensors view with one log line.
* Bad input: a rank directory holding both formats, sources mixing them, a huge header length,
  damaged headers, each refused at mount time with one line naming the file.
"""

import json
import mmap
import os
import random
import re
import struct
import sys
import tempfile

import numpy as np

import itest
import ckpt_fixture

# MindSpore tensor_type / safetensors code -> numpy dtype of the raw bytes (BF16 kept as raw u2).
NUMPY = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
         "BF16": "<u2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8",
         "U64": "<u8"}
CKPT_TYPE = {"Bool": "BOOL", "UInt8": "U8", "Int8": "I8", "Int16": "I16", "UInt16": "U16",
             "Float16": "F16", "BFloat16": "BF16", "Int32": "I32", "UInt32": "U32",
             "Float32": "F32", "Float64": "F64", "Int64": "I64", "UInt64": "U64"}
# The reference writer's order of these codes (spec §4.3), descending.
WRITER_RANK = {c: i for i, c in enumerate(["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32",
                                           "U32", "F32", "F64", "I64", "U64"])}

CKPT_SOURCE_CASES = ["demo", "8to1_merge", "crc_oldscalars", "pipeline_src_dir", "4to6"]

_pb2 = None


def checkpoint_pb2(work):
    global _pb2
    if _pb2 is None:
        out = tempfile.mkdtemp(dir=work)
        itest.run(["protoc", f"--proto_path={itest.REPO}/proto", f"--python_out={out}",
                   "checkpoint.proto"])
        sys.path.insert(0, out)
        import checkpoint_pb2 as pb  # noqa: E402
        _pb2 = pb
    return _pb2


def parse_safetensors(buf):
    """(metadata, [(name, code, shape, array)]) of safetensors bytes, checking the layout rules."""
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    header = bytes(buf[8:8 + n])
    assert n % 8 == 0 and header.rstrip(b" ").endswith(b"}"), "header not padded to 8"
    doc = json.loads(header.decode("utf-8"))
    assert list(doc)[0] == "__metadata__", "metadata is not first"
    meta = doc.pop("__metadata__")
    out, at = [], 0
    for name, e in doc.items():  # file order must be offset order
        b, end = e["data_offsets"]
        assert b == at, f"{name}: begins at {b}, expected {at}"
        dt = np.dtype(NUMPY[e["dtype"]])
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - b == count * dt.itemsize, f"{name}: extent does not match shape"
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=8 + n + b).reshape(e["shape"])
        out.append((name, e["dtype"], e["shape"], arr))
        at = end
    assert 8 + n + at == len(buf), "data section not fully covered"
    keys = [(-WRITER_RANK[c], name.encode()) for name, c, _, _ in out]
    assert keys == sorted(keys), "entries not in the reference writer's order"
    return meta, out


def ckpt_tensors(work, data):
    """{name: (code, dims, array)} of a .ckpt's dense records, by Google's parser."""
    pb = checkpoint_pb2(work)
    msg = pb.Checkpoint()
    msg.ParseFromString(data)
    out = {}
    for v in msg.value:
        if not v.HasField("tensor") or v.tensor.tensor_type not in CKPT_TYPE:
            continue
        code = CKPT_TYPE[v.tensor.tensor_type]
        content = v.tensor.tensor_content
        if v.tag in out:  # a chunked record continues
            prev = out[v.tag]
            content = prev[2] + content
        out[v.tag] = (code, list(v.tensor.dims), content)
    return {k: (c, d, np.frombuffer(b, dtype=NUMPY[c])) for k, (c, d, b) in out.items()}


def check_windows(path, want, rng):
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(30):
            off = rng.randrange(len(want) + 1)
            size = rng.choice([1, 7, 4096, 65536, rng.randrange(1, len(want) + 2)])
            assert os.pread(fd, size, off) == want[off:off + size], f"{path}: {off}+{size}"
    finally:
        os.close(fd)


def reference_safe_open():
    """safetensors.safe_open of the reference package (itest.TEST_VENV)."""
    return itest.import_from_test_venv("safetensors").safe_open


def check_with_reference_reader(path, tensors):
    """The reference reader validates the header; every tensor numpy has a type for must be
    the bytes the independent parse found."""
    safe_open = reference_safe_open()
    with safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "ms"}
        assert sorted(f.keys()) == sorted(n for n, *_ in tensors)
        for n, code, shape, arr in tensors:
            assert list(f.get_slice(n).get_shape()) == shape, n
            if code != "BF16":
                assert f.get_tensor(n).tobytes() == arr.tobytes(), n


def check_case(args, name):
    work = os.path.join(args.work, name)
    fx = ckpt_fixture.make_builtin(name, os.path.join(work, "fixture"), shared=args.shared)
    mnt = os.path.join(work, "mnt")
    log = os.path.join(work, "log")
    rng = random.Random(name)
    os.makedirs(mnt)
    proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                                     dst_strategy=fx.dst_strategy,
                                     index_dir=os.path.join(work, "index"), log_file=log))
    try:
        for t, ckpt_path in fx.expected_files().items():
            st_path = fx.expected_safetensors_files()[t]
            assert sorted(os.listdir(os.path.join(mnt, f"rank_{t}"))) == \
                [f"checkpoint_{t}.ckpt", f"checkpoint_{t}.safetensors"]
            for want_path in (ckpt_path, st_path):
                got_path = os.path.join(mnt, f"rank_{t}", os.path.basename(want_path))
                want = itest.read_file(want_path)
                assert os.stat(got_path).st_size == len(want), f"{got_path}: size"
                diff = ckpt_fixture.describe_difference(want_path, got_path)
                assert not diff, f"{got_path}: {diff}"
                check_windows(got_path, want, rng)
            # mmap in the default mode: first read, then a re-read.
            got_path = os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.safetensors")
            want = itest.read_file(st_path)
            with open(got_path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                assert m[:] == want and m[:] == want, f"{got_path}: mmap differs"
                meta, tensors = parse_safetensors(m)
                assert meta == {"format": "ms"}, meta
                ckpt = ckpt_tensors(work, itest.read_file(
                    os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt")))
                names = {n for n, *_ in tensors}
                for n, code, shape, arr in tensors:
                    if arr.size == 0:
                        continue  # the .ckpt writer has no record for empty tensors
                    c, dims, flat = ckpt[n]
                    assert c == code and dims == shape, f"{n}: {c}{dims} vs {code}{shape}"
                    assert np.array_equal(arr.reshape(-1), flat), f"{n}: values differ"
                    del arr
                del tensors
                left_out = [t2 for t2 in ckpt if t2 not in names]
                assert not left_out, f"rank {t}: {left_out} missing from the safetensors view"
            # Once mapped, the file is served from the page cache the mapping filled: read()
            # and a new mapping see the same bytes.
            assert itest.read_file(got_path) == want, f"{got_path}: read() after mmap differs"
            with open(got_path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                assert m[:] == want, f"{got_path}: second mapping differs"
            check_with_reference_reader(got_path, parse_safetensors(want)[1])
    finally:
        itest.unmount(args.ckptfs, mnt)
    # Entries a safetensors file cannot hold: named in one warning of the mount.
    strings = {n for tgt in fx.targets for n in tgt["safetensors_left_out"]}
    lines = [line for line in proc.stderr.splitlines() if "leave out" in line]
    if strings:
        assert len(lines) == 1 and all(s in lines[0] for s in strings), proc.stderr
    else:
        assert not lines, proc.stderr


def check_inspect(args):
    work = os.path.join(args.work, "inspect")
    fx = ckpt_fixture.make_builtin("st_demo", os.path.join(work, "fixture"))
    for path in list(fx.source_files.values()) + list(fx.expected_safetensors_files().values()):
        proc = itest.run([args.ckptfs, "inspect", path, "--json"])
        doc = json.loads(proc.stdout)
        data = itest.read_file(path)
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        assert doc["metadata"] == header.pop("__metadata__") == {"format": "ms"}
        assert doc["header_bytes"] == n and doc["file_size"] == len(data)
        assert [t["name"] for t in doc["tensors"]] == list(header)
        for t in doc["tensors"]:
            h = header[t["name"]]
            assert [t["dtype"], t["shape"], t["data_offsets"]] == \
                [h["dtype"], h["shape"], h["data_offsets"]]
            assert t["offset"] == 8 + n + h["data_offsets"][0]
        table = itest.run([args.ckptfs, "inspect", path]).stdout
        assert "metadata: format=ms" in table and list(header)[0] in table


def check_views_and_prefix(args):
    work = os.path.join(args.work, "views")
    fx = ckpt_fixture.make_builtin("st_8to1_merge", os.path.join(work, "fixture"))
    mnt = os.path.join(work, "mnt")
    base = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy,
                index_dir=os.path.join(work, "index"))
    want_st = itest.read_file(fx.expected_safetensors_files()[0])
    want_ckpt = itest.read_file(fx.expected_files()[0])
    for extra, listing, want in (
            (["--view", "safetensors"], ["checkpoint_0.safetensors"], want_st),
            (["--view", "ckpt"], ["checkpoint_0.ckpt"], want_ckpt),
            (["--prefix", "net_"], ["net_0.ckpt", "net_0.safetensors"], want_ckpt),
            (["--view", "ckpt,safetensors", "--prefix", "m"], ["m0.ckpt", "m0.safetensors"],
             want_ckpt)):
        with itest.mounted(args.ckptfs, fx.src_dir, mnt, extra_args=extra, **base):
            assert sorted(os.listdir(os.path.join(mnt, "rank_0"))) == listing, extra
            assert itest.read_file(os.path.join(mnt, "rank_0", listing[0])) == want, extra
    # Without a destination strategy: one file holding the whole model.
    meta, tensors = parse_safetensors(want_st)
    assert meta == {"format": "ms"} and len(tensors) == len(fx.case.params) + len(fx.case.extras)
    for bad in (["--view", "pt"], ["--prefix", "a/b"]):
        proc = itest.run(itest.mount_cmd(args.ckptfs, fx.src_dir, mnt, extra_args=bad, **base),
                         check=False)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not itest.is_mounted(mnt)


def mount_error(args, src, work, **kwargs):
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    proc = itest.run(itest.mount_cmd(args.ckptfs, src, mnt, index_dir=os.path.join(work, "index"),
                                     **kwargs), check=False)
    if proc.returncode == 0:
        itest.unmount(args.ckptfs, mnt)
        raise AssertionError(f"mount of {src} succeeded")
    assert not itest.is_mounted(mnt)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def check_bad_input(args):
    work = os.path.join(args.work, "bad")
    fx = ckpt_fixture.make_builtin("st_8to1_merge", os.path.join(work, "fixture"))
    kw = dict(src_strategy=fx.src_strategy, dst_strategy=fx.dst_strategy)
    src = fx.src_dir
    rank1 = os.path.dirname(fx.source_files[1])
    st1 = fx.source_files[1]
    good = itest.read_file(st1)

    # A rank directory holding both formats: refused, naming both files.
    ckpt_fixture.make_builtin("8to1_merge", os.path.join(work, "ckpt"))
    other = os.path.join(rank1, "zz.ckpt")
    with open(other, "wb") as f:
        f.write(itest.read_file(os.path.join(work, "ckpt", "src", "rank_1",
                                             "checkpoint-1_1.ckpt")))
    line = mount_error(args, src, os.path.join(work, "m1"), **kw)
    assert other in line and st1 in line and "both" in line, line
    os.unlink(other)

    # Sources mixing the formats across rank directories.
    parked = os.path.join(work, "parked.safetensors")
    os.rename(st1, parked)
    with open(os.path.join(rank1, "checkpoint-1_1.ckpt"), "wb") as f:
        f.write(itest.read_file(os.path.join(work, "ckpt", "src", "rank_1",
                                             "checkpoint-1_1.ckpt")))
    line = mount_error(args, src, os.path.join(work, "m2"), **kw)
    assert "mix .ckpt and .safetensors" in line, line
    os.unlink(os.path.join(rank1, "checkpoint-1_1.ckpt"))
    os.rename(parked, st1)

    (n,) = struct.unpack("<Q", good[:8])
    damaged = {
        "huge header length": (struct.pack("<Q", 1 << 62) + good[8:], "100 MB limit"),
        "header past the end": (struct.pack("<Q", len(good)) + good[8:], "larger than the file"),
        "truncated data": (good[:-3], "truncated"),
        "trailing bytes": (good + b"\0", "longer than its header says"),
        "not JSON": (good[:8] + b"[" + good[9:], "not valid UTF-8 JSON"),
        "bad dtype": (good.replace(b'"dtype":"F32"', b'"dtype":"F31"', 1), "F31"),
        # The same header length: one dimension's first digit one higher.
        "bad shape": (re.sub(rb'"shape":\[([1-8])', lambda m: b'"shape":[' + bytes(
            [m.group(1)[0] + 1]), good, count=1), "but data_offsets"),
        "short file": (good[:5], "too short"),
    }
    for what, (data, needle) in damaged.items():
        with open(st1, "wb") as f:
            f.write(data)
        line = mount_error(args, src, os.path.join(work, "m3"), **kw)
        assert st1 in line and needle in line, f"{what}: {line}"
        proc = itest.run([args.ckptfs, "inspect", st1], check=False)
        assert proc.returncode != 0 and needle in proc.stderr, f"{what}: {proc.stderr}"
    with open(st1, "wb") as f:
        f.write(good)


def write_unified(fx, out, wrapped, src=None):
    """MindSpore's unified_safetensors layout of the full checkpoint `src` (default: the full
    source rank_0 of `fx`): parameters split over part0/part1, extras in
    hyper_param.safetensors, and the map in either form."""
    from ckptfix import stio  # the generator's own writer (written from the spec)
    src = src or fx.source_files[0]
    meta, entries, data_start = stio.read_header(src)
    raw = itest.read_file(src)
    params = sorted(p.name for p in fx.case.params)
    extras = {e.name for e in fx.case.extras}
    groups = {"part0.safetensors": params[::2], "part1.safetensors": params[1::2],
              "hyper_param.safetensors": sorted(extras)}
    os.makedirs(out)
    weight_map = {}
    for file, names in groups.items():
        items = []
        for n in names:
            code, shape, b, e = entries[n]
            blob = raw[data_start + b:data_start + e]
            items.append(stio.Entry(n, stio.TYPE_OF[code], shape, e - b,
                                    (lambda blob=blob: iter([blob]))))
            if file != "hyper_param.safetensors":
                weight_map[n] = file
        stio.write(os.path.join(out, file), items, {"format": "ms"})
    doc = {"metadata": {"total_size": 0}, "weight_map": weight_map} if wrapped else weight_map
    with open(os.path.join(out, "param_name_map.json"), "w") as f:
        json.dump(doc, f)
    return groups


def check_unified(args):
    """A unified_safetensors directory as a full source: the .safetensors view is the same file
    as from the single-file source (its layout does not depend on entry order); the .ckpt view
    holds the same records, resharded ones in part order."""
    from ckptfix import stio
    work = os.path.join(args.work, "unified")
    fx = ckpt_fixture.make_builtin("st_1to8_split", os.path.join(work, "fixture"))
    for wrapped in (False, True):
        udir = os.path.join(work, f"unified{int(wrapped)}")
        groups = write_unified(fx, udir, wrapped)
        mnt = os.path.join(work, "mnt")
        with itest.mounted(args.ckptfs, udir, mnt, dst_strategy=fx.dst_strategy,
                           index_dir=os.path.join(work, "index")):
            for t, st_path in fx.expected_safetensors_files().items():
                got = os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.safetensors")
                assert itest.read_file(got) == itest.read_file(st_path), f"rank {t} differs"
                ckpt = itest.read_file(os.path.join(mnt, f"rank_{t}", f"checkpoint_{t}.ckpt"))
                want = itest.read_file(fx.expected_files()[t])
                pb = checkpoint_pb2(work)
                a, b = pb.Checkpoint(), pb.Checkpoint()
                a.ParseFromString(ckpt)
                b.ParseFromString(want)
                assert sorted(v.SerializeToString() for v in a.value) == \
                    sorted(v.SerializeToString() for v in b.value), f"rank {t}: records differ"
                # Each part's entries in its data-offset order, part0 first.
                order = [n for part in ("part0.safetensors", "part1.safetensors")
                         for n in stio.read_header(os.path.join(udir, part))[1]]
                resharded = {r["name"] for r in fx.targets[t]["records"]
                             if r["role"] == "reshard"}
                tags = [v.tag for v in a.value if v.tag in resharded]
                assert tags == [n for n in order if n in resharded], f"rank {t}: order {tags}"
    # `index build` indexes every part.
    out = itest.run([args.ckptfs, "index", "build", os.path.join(work, "unified0"),
                     "--index-dir", os.path.join(work, "index-build")]).stdout
    assert out.startswith("3 files,"), out
    # A map naming a parameter its file lacks, and --src-strategy on a unified directory.
    udir = os.path.join(work, "unified1")
    with open(os.path.join(udir, "param_name_map.json")) as f:
        doc = json.load(f)
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = "part1.safetensors" if doc["weight_map"][name] == \
        "part0.safetensors" else "part0.safetensors"
    with open(os.path.join(udir, "param_name_map.json"), "w") as f:
        json.dump(doc, f)
    line = mount_error(args, udir, os.path.join(work, "bad1"), dst_strategy=fx.dst_strategy)
    assert name in line and "does not hold it" in line, line
    line = mount_error(args, udir, os.path.join(work, "bad2"), dst_strategy=fx.dst_strategy,
                       src_strategy=fx.dst_strategy)
    assert "omit --src-strategy" in line, line


def check_unified_whole(args):
    """A unified_safetensors directory without --dst-strategy: one full checkpoint, served as
    rank_0/checkpoint_0.{ckpt,safetensors} like any full source merged. The unified directory is
    written from the generator's expected merge of 8to1_merge (its one target file), so the views
    must be that file: the .safetensors byte for byte, the .ckpt with the expected file's records
    (in the parts' order, so compared as a set)."""
    work = os.path.join(args.work, "unified_whole")
    fx = ckpt_fixture.make_builtin("st_8to1_merge", os.path.join(work, "fixture"))
    want_st = itest.read_file(fx.expected_safetensors_files()[0])
    want_ckpt = itest.read_file(fx.expected_files()[0])
    udir = os.path.join(work, "unified")
    write_unified(fx, udir, True, src=fx.expected_safetensors_files()[0])
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, udir, mnt, index_dir=os.path.join(work, "index")):
        assert sorted(os.listdir(mnt)) == ["rank_0"], os.listdir(mnt)
        assert sorted(os.listdir(os.path.join(mnt, "rank_0"))) == \
            ["checkpoint_0.ckpt", "checkpoint_0.safetensors"]
        got = itest.read_file(os.path.join(mnt, "rank_0", "checkpoint_0.safetensors"))
        assert got == want_st, "the .safetensors view differs from the expected merge"
        pb = checkpoint_pb2(work)
        a, b = pb.Checkpoint(), pb.Checkpoint()
        a.ParseFromString(itest.read_file(os.path.join(mnt, "rank_0", "checkpoint_0.ckpt")))
        b.ParseFromString(want_ckpt)
        assert sorted(v.SerializeToString() for v in a.value) == \
            sorted(v.SerializeToString() for v in b.value), "the .ckpt view's records differ"
    # materialize gives the same file (the view a mount shows, without FUSE).
    out = os.path.join(work, "out")
    itest.run([args.ckptfs, "materialize", udir, out, "--view", "safetensors", "-q",
               "--index-dir", os.path.join(work, "index")])
    assert itest.read_file(os.path.join(out, "rank_0", "checkpoint_0.safetensors")) == want_st


def rewrite_source(path, extra_entries, metadata):
    """Rewrites a safetensors source with its entries plus `extra_entries` and `metadata`."""
    from ckptfix import stio
    _, entries, start = stio.read_header(path)
    raw = itest.read_file(path)
    items = [stio.Entry(n, stio.TYPE_OF[code], shape, e - b,
                        (lambda blob=raw[start + b:start + e]: iter([blob])))
             for n, (code, shape, b, e) in entries.items()]
    stio.write(path, items + extra_entries, metadata)


def check_int4(args):
    """Int4-marked tensors: copied whole as their stored type into both views; refused when a
    strategy splits them."""
    from ckptfix import stio
    work = os.path.join(args.work, "int4")
    fx = ckpt_fixture.make_builtin("st_8to1_merge", os.path.join(work, "fixture"))
    for g, path in fx.source_files.items():
        blob = bytes((g * 16 + i) % 256 for i in range(8))
        rewrite_source(path, [stio.Entry("q.int4", "Int8", [8], 8, lambda b=blob: iter([b]))],
                       {"format": "ms", "q.int4": "Int4"})
    mnt = os.path.join(work, "mnt")
    with itest.mounted(args.ckptfs, fx.src_dir, mnt, src_strategy=fx.src_strategy,
                       index_dir=os.path.join(work, "index")):
        want = bytes(range(8))  # target 0 takes passthrough entries from source rank 0
        _, tensors = parse_safetensors(itest.read_file(
            os.path.join(mnt, "rank_0", "checkpoint_0.safetensors")))
        got = {n: (code, shape, arr.tobytes()) for n, code, shape, arr in tensors}
        assert got["q.int4"] == ("I8", [8], want), got["q.int4"]
        ckpt = ckpt_tensors(work, itest.read_file(os.path.join(mnt, "rank_0",
                                                               "checkpoint_0.ckpt")))
        code, dims, arr = ckpt["q.int4"]
        assert (code, dims, arr.tobytes()) == ("I8", [8], want), ckpt["q.int4"]
        # Everything else is the expected view.
        _, expected = parse_safetensors(itest.read_file(fx.expected_safetensors_files()[0]))
        for n, code, shape, arr in expected:
            assert got[n] == (code, shape, arr.tobytes()), n
    # A strategy parameter marked Int4 cannot be split.
    name = next(p.name for p in fx.case.params
                if p.src and any(m != -1 for m in p.src.tensor_map))
    for path in fx.source_files.values():
        rewrite_source(path, [], {"format": "ms", name: "Int4"})
    line = mount_error(args, fx.src_dir, os.path.join(work, "bad"), src_strategy=fx.src_strategy)
    assert name in line and "cannot be resharded" in line, line


def main():
    args = itest.parse_args()
    checks = itest.Checks(args.only)
    for name in ckpt_fixture.SAFETENSORS_BUILTINS + CKPT_SOURCE_CASES:
        checks.run(f"case {name}", check_case, args, name)
    checks.run("inspect", check_inspect, args)
    checks.run("views and prefix", check_views_and_prefix, args)
    checks.run("bad input", check_bad_input, args)
    checks.run("unified_safetensors directory as a source", check_unified, args)
    checks.run("unified_safetensors directory as one full checkpoint", check_unified_whole, args)
    checks.run("Int4-marked tensors", check_int4, args)
    checks.finish()


if __name__ == "__main__":
    main()
