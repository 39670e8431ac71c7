// Decrypting one block of an encrypted MindSpore checkpoint with OpenSSL's libcrypto: AES-GCM
// (AES-128/192/256 by the key's length), AES-CBC (the same), SM4-CBC (16-byte keys). Plaintext
// is written only into the caller's buffer (or a scratch buffer wiped before returning).
//
// Thread-safety: every function is reentrant (each call has its own cipher context); `read`
// must be safe to call concurrently if the functions are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ckptfs/crypt/framing.h"
#include "ckptfs/crypt/key.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::crypt {

// Throws Error naming `name` when `key`'s length does not fit `mode` (SM4 takes 16 bytes only).
void check_key_for_mode(Mode mode, const Key& key, const std::string& name);

// Reads block `index` (its header again, then its ciphertext) into `buf` and decrypts it in
// place; returns the plaintext length (the first bytes of `buf`). `buf` must hold the block's
// ciphertext length. Throws Error naming `name`, the block and its byte offset when the AES-GCM
// tag does not match or the CBC padding is not valid PKCS#7: "wrong key or damaged file". On a
// throw `buf` holds nothing decrypted.
size_t decrypt_block(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                     std::span<uint8_t> buf, const std::string& name);

// CBC only: decrypts ciphertext bytes [from, from + buf.size()) of block `index` in place into
// `buf` (`from` and the size multiples of 16; CBC needs only the 16 ciphertext bytes before a
// range, so any part of a block decrypts alone). Returns the plaintext bytes of the range: all
// of them, less the padding when the range ends the block (Error as decrypt_block when that
// padding is not valid PKCS#7).
size_t decrypt_cbc_range(const ReadExact& read, const Framing& framing, const Key& key,
                         uint64_t index, uint32_t from, std::span<uint8_t> buf,
                         const std::string& name);

// The CBC padding length of block `index` (1..16), from its last 16 bytes of ciphertext alone.
// Throws Error like decrypt_block when the padding is not valid. A wrong key passes this check
// about once in 256 blocks: CBC has no tag, so the caller's own checks on the plaintext matter.
uint32_t cbc_padding(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                     const std::string& name);

// Checks block `index` without keeping its plaintext: AES-GCM decrypts it through a 1 MiB
// scratch buffer and checks the tag, CBC checks the padding. Throws as decrypt_block.
void verify_block(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                  const std::string& name);

}  // namespace ckptfs::crypt
