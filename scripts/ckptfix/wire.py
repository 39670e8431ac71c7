"""Protobuf wire format by hand (spec §1.3, §2.1).

The fixture writes checkpoints and strategies byte by byte instead of through generated classes so
that every choice MindSpore makes (unpacked repeated scalars, field order, empty sub-messages that
must still be present) is explicit here and cannot drift with the protobuf runtime's version.
"""

from dataclasses import dataclass

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5


class WireError(ValueError):
    pass


def varint(value: int) -> bytes:
    # Negative int32/int64 values travel as their 64-bit two's complement: ten bytes for -1.
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def varint_field(field: int, value: int) -> bytes:
    return key(field, VARINT) + varint(value)


def len_field(field: int, payload: bytes) -> bytes:
    return key(field, LEN) + varint(len(payload)) + payload


def len_field_header(field: int, payload_length: int) -> bytes:
    """Key and length of a LEN field whose payload is written separately (streamed content)."""
    return key(field, LEN) + varint(payload_length)


def string_field(field: int, text: str) -> bytes:
    return len_field(field, text.encode("utf-8"))


def repeated_varints(field: int, values) -> bytes:
    # MindSpore's serializers write repeated scalars unpacked: one key per element.
    return b"".join(varint_field(field, v) for v in values)


@dataclass
class Field:
    number: int
    wire_type: int
    value: object  # int for VARINT/FIXED*, memoryview for LEN


def read_varint(buf, pos: int):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than ten bytes")


def as_signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def iter_fields(buf):
    """Yields the top-level fields of one serialized message, in wire order."""
    view = memoryview(buf)
    pos = 0
    while pos < len(view):
        tag, pos = read_varint(view, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            value, pos = read_varint(view, pos)
        elif wire_type == LEN:
            length, pos = read_varint(view, pos)
            if pos + length > len(view):
                raise WireError(f"field {number}: length {length} overruns the buffer")
            value = view[pos:pos + length]
            pos += length
        elif wire_type == FIXED64:
            value = int.from_bytes(view[pos:pos + 8], "little")
            pos += 8
        elif wire_type == FIXED32:
            value = int.from_bytes(view[pos:pos + 4], "little")
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type} (field {number})")
        if pos > len(view):
            raise WireError("truncated field")
        yield Field(number, wire_type, value)


def repeated_ints(fields, number: int, signed: bool = True) -> list:
    """Values of a repeated integer field, accepting both unpacked and packed encodings."""
    values = []
    for f in fields:
        if f.number != number:
            continue
        if f.wire_type == VARINT:
            values.append(f.value)
        elif f.wire_type == LEN:
            pos = 0
            while pos < len(f.value):
                v, pos = read_varint(f.value, pos)
                values.append(v)
    return [as_signed64(v) for v in values] if signed else values
