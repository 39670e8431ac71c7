"""End-to-end check of `ckptfs inspect` against Google's Python protobuf parser.

Run by ctest as
    /usr/bin/python3 test_inspect.py --ckptfs BIN --shared DATA_DIR --work WORK_DIR

For every real checkpoint fixture and the sources of two generator cases, proto/checkpoint.proto
is compiled with protoc and the file is parsed with Google's runtime; `ckptfs inspect --json`
must list the same parameters, kinds and records, and the file bytes at each reported offset
must be exactly the parsed tensor_content. Damaged, encrypted and
CRC-trailed files are checked for the error contract (exit code, one stderr line naming the file
and the byte offset).
"""

import argparse
import glob
import importlib
import json
import os
import shutil
import subprocess
import sys
import traceback
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckptfs", required=True)
    parser.add_argument("--shared", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return args


def load_checkpoint_pb2(work):
    out = os.path.join(work, "pb")
    os.makedirs(out, exist_ok=True)
    subprocess.run(["protoc", "--proto_path=" + os.path.join(REPO, "proto"), "--python_out=" + out,
                    os.path.join(REPO, "proto", "checkpoint.proto")], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("checkpoint_pb2")


def inspect(binary, path, *flags):
    return subprocess.run([binary, "inspect", path, *flags], capture_output=True, text=True,
                          timeout=120)


def inspect_json(binary, path, *flags):
    result = inspect(binary, path, "--json", *flags)
    assert result.returncode == 0, f"{path}: exit {result.returncode}: {result.stderr}"
    assert result.stderr == "", result.stderr
    return json.loads(result.stdout)


# Element types with a grid (spec §1.3); anything else is copied as an opaque entry.
DENSE_TYPES = {"Float16", "Float32", "Float64", "BFloat16", "Int8", "Int16", "Int32", "Int64",
               "UInt8", "UInt16", "UInt32", "UInt64", "Bool"}


def top_level_records(data):
    """[offset, length] of every top-level field 1 record (0x0A, varint length, Value), by a
    walk of the wire format written here, independent of the scanner."""
    def varint(pos):
        value, shift = 0, 0
        while True:
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            pos += 1
            if byte < 0x80:
                return value, pos
            shift += 7

    records, pos = [], 0
    while pos < len(data):
        start = pos
        key, pos = varint(pos)
        length, pos = varint(pos)
        if key != 0x0A:  # a CRC trailer or another field: not a record
            break
        records.append([start, pos - start + length])
        pos += length
    return records


def expected_params(pb2, data):
    """Google's parse, grouped as spec §1.5 says: consecutive equal tags form one parameter."""
    records = top_level_records(data)
    checkpoint = pb2.Checkpoint()
    # Up to the last record: a CRC trailer (spec §1.7) is not protobuf.
    checkpoint.ParseFromString(data[:sum(records[-1]) if records else 0])
    assert len(checkpoint.value) == len(records), (len(checkpoint.value), len(records))
    params = []
    for value, record in zip(checkpoint.value, records):
        tensor = value.tensor
        dims = list(tensor.dims)
        shape = [] if dims == [0] and tensor.tensor_type != "str" else dims
        if params and params[-1]["name"] == value.tag:
            params[-1]["contents"].append(tensor.tensor_content)
            params[-1]["records"].append(record)
            continue
        kind = ("maptensor" if value.HasField("maptensor") else "string"
                if tensor.tensor_type == "str" else "tensor"
                if tensor.tensor_type in DENSE_TYPES else "opaque")
        params.append({"name": value.tag, "dtype": tensor.tensor_type, "shape": shape,
                       "contents": [tensor.tensor_content], "records": [record], "kind": kind,
                       "dims_zero": dims == [0]})
    return params


def check_fixture(binary, pb2, path):
    with open(path, "rb") as f:
        data = f.read()
    expected = expected_params(pb2, data)
    got = inspect_json(binary, path)
    assert [p["name"] for p in got] == [p["name"] for p in expected], (got, expected)
    for g, e in zip(got, expected):
        assert g["dtype"] == e["dtype"], (g["name"], g["dtype"], e["dtype"])
        assert g["shape"] == e["shape"], (g["name"], g["shape"], e["shape"])
        assert g["nbytes"] == sum(len(c) for c in e["contents"]), g["name"]
        assert len(g["offsets"]) == len(e["contents"]), g["name"]
        for (offset, length), content in zip(g["offsets"], e["contents"]):
            assert length == len(content), (g["name"], length, len(content))
            assert data[offset:offset + length] == content, (g["name"], offset)
        assert g["records"] == e["records"], (g["name"], g["records"], e["records"])
        assert g["kind"] == e["kind"], (g["name"], g["kind"], e["kind"])
        if e["kind"] != "string":
            assert g["dims_zero"] == e["dims_zero"], (g["name"], g["dims_zero"])


def check_one_error_line(result, path, *words):
    assert result.returncode != 0, "accepted"
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert path in lines[0], lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert result.stdout == "", result.stdout


def check_corrupt(binary, shared):
    for path in glob.glob(os.path.join(shared, "fixtures", "real", "corrupt", "*.ckpt")):
        check_one_error_line(inspect(binary, path), path, "offset")
        check_one_error_line(inspect(binary, path, "--json"), path, "offset")


# Spec §1.3 records and the §1.7 trailer for their concatenation.
W = bytes([0x0A, 0x1A, 0x0A, 0x01, 0x77, 0x12, 0x15, 0x08, 0x02, 0x12, 0x07]) + b"Float32" + \
    bytes([0x1A, 0x08, 0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40])
EPOCH = bytes([0x0A, 0x1E, 0x0A, 0x09]) + b"epoch_num" + bytes([0x12, 0x11, 0x12, 0x05]) + \
    b"Int64" + bytes([0x1A, 0x08, 3, 0, 0, 0, 0, 0, 0, 0])


def check_crc_trailer(binary, work):
    body = W + EPOCH
    trailer = b"crc_num" + zlib.crc32(body).to_bytes(10, "big")
    assert trailer.hex() == "6372635f6e756d000000000000b191eab2"  # the spec's example bytes
    good = os.path.join(work, "crc.ckpt")
    with open(good, "wb") as f:
        f.write(body + trailer)
    got = inspect_json(binary, good, "--verify-crc")
    assert [p["name"] for p in got] == ["w", "epoch_num"], got
    assert got[0]["offsets"] == [[20, 8]] and got[1]["offsets"] == [[52, 8]], got
    assert got[1]["shape"] == [], got
    table = inspect(binary, good, "--verify-crc")
    assert table.returncode == 0 and "CRC verified" in table.stdout, table.stdout

    bad = os.path.join(work, "crc_bad.ckpt")
    damaged = bytearray(body + trailer)
    damaged[21] ^= 1
    with open(bad, "wb") as f:
        f.write(bytes(damaged))
    assert inspect(binary, bad).returncode == 0  # stripped, not verified
    check_one_error_line(inspect(binary, bad, "--verify-crc"), bad, "crc check failed")


def check_encrypted(binary, work):
    for magic, mode in ((0x7F3A5ED8, "AES-GCM"), (0x7F3A5ED9, "AES-CBC"), (0x7F3A5EDA, "SM4-CBC")):
        path = os.path.join(work, f"enc_{mode}.ckpt")
        with open(path, "wb") as f:
            f.write(magic.to_bytes(4, "little") + bytes(64))
        check_one_error_line(inspect(binary, path), path, "encrypted", mode, "offset")


def check_truncated(binary, shared, work):
    src = os.path.join(shared, "fixtures", "real", "ckpt", "mindformers_golden_router.ckpt")
    with open(src, "rb") as f:
        data = f.read()
    for length in (1, 3, 20, 36, 100, len(data) - 1):
        path = os.path.join(work, f"router_{length}.ckpt")
        with open(path, "wb") as f:
            f.write(data[:length])
        check_one_error_line(inspect(binary, path, "--json"), path, "offset")


def check_table(binary, shared):
    path = os.path.join(shared, "fixtures", "real", "ckpt", "mindformers_golden_moe.ckpt")
    result = inspect(binary, path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 4 + 1, lines  # header, four parameters, summary
    assert lines[1].split()[:4] == ["feed_forward.ffn.w1.weight", "Float32", "[4,64,16]", "16384"]
    assert lines[-1].startswith("4 parameters"), lines[-1]


def check_generated(binary, pb2, work, name):
    """A generator fixture's sources: strings, ≤2.2 dims-[0] scalars and CRC trailers
    (crc_oldscalars), or large parameters split over several records (src_chunks)."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import ckpt_fixture
    fx = ckpt_fixture.make_builtin(name, os.path.join(work, name))
    for path in sorted(fx.source_files.values()):
        check_fixture(binary, pb2, os.path.realpath(path))


def check_empty(binary, work):
    path = os.path.join(work, "empty.ckpt")
    open(path, "wb").close()
    assert inspect_json(binary, path) == []


def main():
    args = parse_args()
    binary = os.path.abspath(args.ckptfs)
    pb2 = load_checkpoint_pb2(args.work)
    checks = []
    for path in sorted(glob.glob(os.path.join(args.shared, "fixtures", "real", "ckpt", "*.ckpt"))):
        checks.append((f"fixture {os.path.basename(path)}", check_fixture, binary, pb2, path))
    assert len(checks) >= 8, "real fixtures missing"
    checks += [
        ("corrupt fixture", check_corrupt, binary, args.shared),
        ("crc trailer", check_crc_trailer, binary, args.work),
        ("encrypted", check_encrypted, binary, args.work),
        ("truncated", check_truncated, binary, args.shared, args.work),
        ("table output", check_table, binary, args.shared),
        ("empty file", check_empty, binary, args.work),
        ("generated: strings, old scalars, CRC", check_generated, binary, pb2, args.work,
         "crc_oldscalars"),
        ("generated: parameters over several records", check_generated, binary, pb2, args.work,
         "src_chunks"),
    ]
    passed, failed = 0, 0
    for name, fn, *fn_args in checks:
        try:
            fn(*fn_args)
        except Exception:  # report every failure, then go on
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        else:
            passed += 1
            print(f"ok   {name}", flush=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
