#include "ckptfs/crypt/framing.h"

#include <algorithm>
#include <cstring>

#include "ckptfs/error.h"

namespace ckptfs::crypt {
namespace {

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint32_t header_length_of(Mode mode) {
  // magic, [tag], rest length, IV length, IV, ciphertext length
  return 4 + (mode == Mode::kAesGcm ? kTagLength : 0) + 4 + 4 + kIvLength + 4;
}

struct ParsedHeader {
  Mode mode = Mode::kAesGcm;
  uint32_t cipher_length = 0;
  BlockHeader fields;
};

// One block's header at `at`; `mode` is the first block's (none for the first block).
ParsedHeader parse_header(const ReadExact& read, uint64_t size, const std::string& name,
                          uint64_t index, uint64_t at, std::optional<Mode> mode) {
  std::array<uint8_t, 48> buf{};
  if (size - at < 4)
    fail("{}: byte offset {}: file ends inside block {}'s magic (truncated?)", name, at, index);
  read(at, std::span(buf.data(), 4));
  const uint32_t magic = le32(buf.data());
  const std::optional<Mode> found = mode_from_magic(magic);
  if (!found)
    fail(
        "{}: byte offset {}: block {} starts with 0x{:08X}, not an encryption magic "
        "(damaged file?)",
        name, at, index, magic);
  if (mode && *found != *mode)
    fail("{}: byte offset {}: block {} is {}, the first block {} (damaged file?)", name, at, index,
         mode_name(*found), mode_name(*mode));
  ParsedHeader out;
  out.mode = *found;
  const uint32_t header_length = header_length_of(out.mode);
  if (size - at < header_length)
    fail("{}: byte offset {}: file ends inside block {}'s {}-byte header (truncated?)", name, at,
         index, header_length);
  read(at + 4, std::span(buf.data() + 4, header_length - 4));
  uint32_t pos = 4;
  if (out.mode == Mode::kAesGcm) {
    std::memcpy(out.fields.tag.data(), buf.data() + pos, kTagLength);
    pos += kTagLength;
  }
  const uint32_t rest = le32(buf.data() + pos);
  const uint32_t iv_length = le32(buf.data() + pos + 4);
  if (iv_length != kIvLength)
    fail("{}: byte offset {}: block {}'s IV length is {}, MindSpore writes {} (damaged file?)",
         name, at + pos + 4, index, static_cast<int32_t>(iv_length), kIvLength);
  std::memcpy(out.fields.iv.data(), buf.data() + pos + 8, kIvLength);
  const uint64_t cipher_at = at + pos + 8 + kIvLength;
  out.cipher_length = le32(buf.data() + pos + 8 + kIvLength);
  if (out.cipher_length == 0 || out.cipher_length > kMaxCipherLength)
    fail("{}: byte offset {}: block {}'s ciphertext length {} is outside 1..{} (damaged file?)",
         name, cipher_at, index, static_cast<int32_t>(out.cipher_length), kMaxCipherLength);
  if (out.mode != Mode::kAesGcm && out.cipher_length % 16 != 0)
    fail(
        "{}: byte offset {}: block {}'s {} ciphertext length {} is not a multiple of 16 "
        "(damaged file?)",
        name, cipher_at, index, mode_name(out.mode), out.cipher_length);
  if (uint64_t{rest} != uint64_t{4} + kIvLength + 4 + out.cipher_length)
    fail(
        "{}: byte offset {}: block {}'s length field {} disagrees with its IV and ciphertext "
        "({} + {} + {} + {}) (damaged file?)",
        name, at + pos, index, static_cast<int32_t>(rest), 4, kIvLength, 4, out.cipher_length);
  if (size - at - header_length < out.cipher_length)
    fail(
        "{}: byte offset {}: block {}'s {}-byte ciphertext runs past the end of the file "
        "({} bytes; truncated?)",
        name, at + header_length, index, out.cipher_length, size);
  return out;
}

}  // namespace

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::kAesGcm:
      return "AES-GCM";
    case Mode::kAesCbc:
      return "AES-CBC";
    case Mode::kSm4Cbc:
      return "SM4-CBC";
  }
  return "?";
}

std::optional<Mode> mode_from_name(std::string_view name) {
  for (Mode mode : {Mode::kAesGcm, Mode::kAesCbc, Mode::kSm4Cbc})
    if (mode_name(mode) == name) return mode;
  return std::nullopt;
}

std::optional<Mode> mode_from_magic(uint32_t magic) {
  switch (magic) {
    case kAesGcmMagic:
      return Mode::kAesGcm;
    case kAesCbcMagic:
      return Mode::kAesCbc;
    case kSm4CbcMagic:
      return Mode::kSm4Cbc;
    default:
      return std::nullopt;
  }
}

bool looks_encrypted(std::span<const uint8_t> head) {
  return head.size() >= 4 && mode_from_magic(le32(head.data())).has_value();
}

BlockPlace Framing::block(uint64_t index) const {
  BlockPlace place;
  place.index = index;
  place.header_offset = index * stride();
  place.cipher_offset = place.header_offset + header_length;
  place.cipher_length = index + 1 == block_count ? last_cipher_length : full_cipher_length;
  return place;
}

Framing parse_framing(const ReadExact& read, uint64_t size, const std::string& name) {
  if (size == 0) fail("{}: byte offset 0: empty file, not an encrypted checkpoint", name);
  Framing framing;
  framing.file_size = size;
  const ParsedHeader first = parse_header(read, size, name, 0, 0, std::nullopt);
  framing.mode = first.mode;
  framing.header_length = header_length_of(first.mode);
  framing.full_cipher_length = first.cipher_length;
  framing.last_cipher_length = first.cipher_length;
  framing.block_count = 1;
  uint64_t at = framing.stride();
  while (at < size) {
    const ParsedHeader next = parse_header(read, size, name, framing.block_count, at, framing.mode);
    // A block follows, so the one before was not the last: it must be a full one. (The new
    // header is parsed first: bytes after the last block are named as such.)
    const uint64_t previous = framing.block_count - 1;
    if (framing.last_cipher_length != framing.full_cipher_length)
      fail(
          "{}: byte offset {}: block {} is shorter than block 0 ({} against {} bytes of "
          "ciphertext) but is not the last (damaged file?)",
          name, framing.block(previous).header_offset, previous, framing.last_cipher_length,
          framing.full_cipher_length);
    if (previous == 0 && framing.full_cipher_length < kMinFullPlainLength)
      fail(
          "{}: byte offset {}: block 0 holds {} bytes of ciphertext and is not the last; "
          "MindSpore's blocks before the last hold at least {} (damaged file?)",
          name, framing.header_length, framing.full_cipher_length, kMinFullPlainLength);
    if (next.cipher_length > framing.full_cipher_length)
      fail(
          "{}: byte offset {}: block {} holds {} bytes of ciphertext, more than block 0's {} "
          "(damaged file?)",
          name, at, framing.block_count, next.cipher_length, framing.full_cipher_length);
    framing.last_cipher_length = next.cipher_length;
    ++framing.block_count;
    at += framing.header_length + next.cipher_length;
  }
  return framing;  // parse_header saw each block end inside the file: `at` is its end
}

BlockHeader read_block_header(const ReadExact& read, const Framing& framing,
                              const BlockPlace& place, const std::string& name) {
  const ParsedHeader header =
      parse_header(read, framing.file_size, name, place.index, place.header_offset, framing.mode);
  if (header.cipher_length != place.cipher_length)
    fail(
        "{}: byte offset {}: block {} now holds {} bytes of ciphertext, {} when the file was "
        "opened (was it changed?)",
        name, place.header_offset, place.index, header.cipher_length, place.cipher_length);
  return header.fields;
}

}  // namespace ckptfs::crypt
