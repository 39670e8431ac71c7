// The block framing of an encrypted MindSpore checkpoint (docs/FORMATS.md, "Encrypted
// checkpoints"). Parsing needs no key: it reads each block's header, never its ciphertext.
//
// Thread-safety: parse_framing is reentrant; a Framing is an immutable value.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ckptfs/util/pread.h"

namespace ckptfs::crypt {

enum class Mode { kAesGcm, kAesCbc, kSm4Cbc };

// The little-endian uint32 every block starts with, one per mode.
inline constexpr uint32_t kAesGcmMagic = 0x7F3A5ED8;
inline constexpr uint32_t kAesCbcMagic = 0x7F3A5ED9;
inline constexpr uint32_t kSm4CbcMagic = 0x7F3A5EDA;
// MindSpore's decryptor reads a block's rest into a buffer of 64 MiB + 50 bytes: a longer block
// is one it cannot read either (and one we must not allocate for).
inline constexpr uint32_t kMaxCipherLength = 64u * 1024 * 1024 + 16;
// The writer cuts the plaintext into blocks of a whole number of KiB: every block but the last
// holds at least this much. It bounds the number of headers a file of a given size can have.
inline constexpr uint32_t kMinFullPlainLength = 1024;
inline constexpr uint32_t kIvLength = 16;
inline constexpr uint32_t kTagLength = 16;
// AES-GCM uses the first 12 bytes of the 16-byte IV field as its nonce (found on files written
// by MindSpore 2.7.2: the tag verifies with those 12 bytes and no additional data).
inline constexpr uint32_t kGcmNonceLength = 12;

// "AES-GCM", "AES-CBC", "SM4-CBC": MindSpore's enc_mode names.
std::string_view mode_name(Mode mode);
std::optional<Mode> mode_from_name(std::string_view name);
std::optional<Mode> mode_from_magic(uint32_t magic);
// True when the first four bytes of a file are one of the three magics.
bool looks_encrypted(std::span<const uint8_t> head);

// Where one block lies in the file. Plaintext lengths are not here: in CBC they depend on the
// padding, which only the key reveals (DecryptedStream learns them).
struct BlockPlace {
  uint64_t index = 0;
  uint64_t header_offset = 0;  // the block's magic
  uint64_t cipher_offset = 0;
  uint32_t cipher_length = 0;
};

// The header fields of one block as read from the file.
struct BlockHeader {
  std::array<uint8_t, kIvLength> iv{};
  std::array<uint8_t, kTagLength> tag{};  // AES-GCM only; zeros otherwise
};

// A file's blocks. MindSpore writes every block but the last with the same plaintext length,
// so all blocks but the last have the first one's length and the table is four numbers: memory
// does not depend on the file's size.
struct Framing {
  Mode mode = Mode::kAesGcm;
  uint64_t file_size = 0;
  uint64_t block_count = 0;
  uint32_t header_length = 0;       // magic, [tag], rest length, IV length, IV, cipher length
  uint32_t full_cipher_length = 0;  // every block but the last
  uint32_t last_cipher_length = 0;

  uint64_t stride() const { return uint64_t{header_length} + full_cipher_length; }
  BlockPlace block(uint64_t index) const;
};

// Walks every block header of `size` bytes read through `read` (one pread per block). Throws
// Error naming `name` and the byte offset for: a magic that is not an encryption magic or
// differs from the first block's, a rest length that disagrees with the IV and ciphertext
// lengths, an IV length other than 16, an empty or too long ciphertext, a CBC ciphertext that
// is not whole 16-byte blocks, a block before the last whose length differs from the first's,
// a block running past the end of the file, and bytes after the last block.
Framing parse_framing(const ReadExact& read, uint64_t size, const std::string& name);

// Reads block `place`'s header again and checks it still matches the framing (the file may have
// changed since it was parsed). Throws Error naming `name` and the offset otherwise.
BlockHeader read_block_header(const ReadExact& read, const Framing& framing,
                              const BlockPlace& place, const std::string& name);

}  // namespace ckptfs::crypt
