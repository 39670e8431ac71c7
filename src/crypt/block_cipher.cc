#include "ckptfs/crypt/block_cipher.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "ckptfs/error.h"

namespace ckptfs::crypt {
namespace {

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }  // wipes the schedule
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

const EVP_CIPHER* cipher_for(Mode mode, size_t key_length) {
  switch (mode) {
    case Mode::kAesGcm:
      return key_length == 16   ? EVP_aes_128_gcm()
             : key_length == 24 ? EVP_aes_192_gcm()
                                : EVP_aes_256_gcm();
    case Mode::kAesCbc:
      return key_length == 16   ? EVP_aes_128_cbc()
             : key_length == 24 ? EVP_aes_192_cbc()
                                : EVP_aes_256_cbc();
    case Mode::kSm4Cbc:
      return EVP_sm4_cbc();
  }
  return nullptr;
}

[[noreturn]] void openssl_failed(const std::string& name, const BlockPlace& place,
                                 const char* what) {
  fail("{}: block {} at byte offset {}: OpenSSL {} failed", name, place.index, place.header_offset,
       what);
}

[[noreturn]] void refuse_block(const std::string& name, const Framing& framing,
                               const BlockPlace& place) {
  fail("{}: block {} at byte offset {}: the {} {}: wrong key or damaged file", name, place.index,
       place.header_offset, mode_name(framing.mode),
       framing.mode == Mode::kAesGcm ? "tag does not match" : "padding is not valid");
}

// A context ready to decrypt with `iv`. CBC padding is checked by hand (padded_length) so that
// OpenSSL writes exactly the ciphertext's length, all of it into the caller's buffer.
Ctx start(const Framing& framing, const Key& key, const uint8_t* iv, const std::string& name,
          const BlockPlace& place) {
  Ctx ctx(EVP_CIPHER_CTX_new());
  if (!ctx) openssl_failed(name, place, "EVP_CIPHER_CTX_new");
  const EVP_CIPHER* cipher = cipher_for(framing.mode, key.size());
  if (EVP_DecryptInit_ex(ctx.get(), cipher, nullptr, nullptr, nullptr) != 1)
    openssl_failed(name, place, "EVP_DecryptInit_ex");
  if (framing.mode == Mode::kAesGcm) {
    if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kGcmNonceLength, nullptr) != 1)
      openssl_failed(name, place, "EVP_CTRL_GCM_SET_IVLEN");
  } else if (EVP_CIPHER_CTX_set_padding(ctx.get(), 0) != 1) {
    openssl_failed(name, place, "EVP_CIPHER_CTX_set_padding");
  }
  if (EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, key.bytes().data(), iv) != 1)
    openssl_failed(name, place, "EVP_DecryptInit_ex");
  return ctx;
}

// Decrypts `data` in place (OpenSSL allows the output to be the input exactly).
void update(EVP_CIPHER_CTX* ctx, std::span<uint8_t> data, const std::string& name,
            const BlockPlace& place) {
  int written = 0;
  if (EVP_DecryptUpdate(ctx, data.data(), &written, data.data(), static_cast<int>(data.size())) !=
          1 ||
      static_cast<size_t>(written) != data.size())
    openssl_failed(name, place, "EVP_DecryptUpdate");
}

// GCM: checks the tag. CBC without padding: nothing is held back, nothing more is written.
bool finish(EVP_CIPHER_CTX* ctx, const Framing& framing, const BlockHeader& header) {
  if (framing.mode == Mode::kAesGcm &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTagLength,
                          const_cast<uint8_t*>(header.tag.data())) != 1)
    return false;
  std::array<uint8_t, 32> tail{};
  int written = 0;
  const bool ok = EVP_DecryptFinal_ex(ctx, tail.data(), &written) == 1 && written == 0;
  OPENSSL_cleanse(tail.data(), tail.size());
  return ok;
}

// PKCS#7: the last byte n (1..16) and the n bytes before the end all equal n. Returns n, or 0.
uint32_t padding_of(std::span<const uint8_t> last16) {
  const uint8_t n = last16[15];
  if (n == 0 || n > 16) return 0;
  uint8_t diff = 0;
  for (size_t i = 16 - n; i < 16; ++i) diff |= static_cast<uint8_t>(last16[i] ^ n);
  return diff == 0 ? n : 0;
}

}  // namespace

void check_key_for_mode(Mode mode, const Key& key, const std::string& name) {
  if (mode == Mode::kSm4Cbc && key.size() != 16)
    fail("{}: SM4-CBC takes a 16-byte key, the key given is {} bytes", name, key.size());
  if (key.size() != 16 && key.size() != 24 && key.size() != 32)
    fail("{}: {} takes a 16, 24 or 32-byte key, the key given is {} bytes", name, mode_name(mode),
         key.size());
}

size_t decrypt_block(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                     std::span<uint8_t> buf, const std::string& name) {
  const BlockPlace place = framing.block(index);
  if (buf.size() < place.cipher_length)
    fail("{}: block {}: a {}-byte buffer for {} bytes of ciphertext", name, index, buf.size(),
         place.cipher_length);
  if (framing.mode != Mode::kAesGcm)
    return decrypt_cbc_range(read, framing, key, index, 0, buf.first(place.cipher_length), name);
  check_key_for_mode(framing.mode, key, name);
  const BlockHeader header = read_block_header(read, framing, place, name);
  const std::span<uint8_t> data = buf.first(place.cipher_length);
  read(place.cipher_offset, data);
  const Ctx ctx = start(framing, key, header.iv.data(), name, place);
  update(ctx.get(), data, name, place);
  if (!finish(ctx.get(), framing, header)) {
    OPENSSL_cleanse(data.data(), data.size());
    refuse_block(name, framing, place);
  }
  return place.cipher_length;
}

size_t decrypt_cbc_range(const ReadExact& read, const Framing& framing, const Key& key,
                         uint64_t index, uint32_t from, std::span<uint8_t> buf,
                         const std::string& name) {
  const BlockPlace place = framing.block(index);
  if (framing.mode == Mode::kAesGcm || from % 16 != 0 || buf.size() % 16 != 0 || buf.empty() ||
      from > place.cipher_length || buf.size() > place.cipher_length - from)
    fail("{}: block {}: {} bytes at ciphertext offset {} is not a CBC range of the block", name,
         index, buf.size(), from);
  check_key_for_mode(framing.mode, key, name);
  const BlockHeader header = read_block_header(read, framing, place, name);
  // CBC: the plaintext of a 16-byte block is the decryption XOR the ciphertext block before it,
  // so a range needs only the 16 bytes before it (the IV for the first).
  std::array<uint8_t, 16> iv = header.iv;
  if (from > 0) read(place.cipher_offset + from - 16, iv);
  read(place.cipher_offset + from, buf);
  const Ctx ctx = start(framing, key, iv.data(), name, place);
  update(ctx.get(), buf, name, place);
  if (!finish(ctx.get(), framing, header)) openssl_failed(name, place, "EVP_DecryptFinal_ex");
  if (from + buf.size() < place.cipher_length) return buf.size();
  const uint32_t padding = padding_of(buf.last(16));
  if (padding == 0) {
    OPENSSL_cleanse(buf.data(), buf.size());
    refuse_block(name, framing, place);
  }
  return buf.size() - padding;
}

uint32_t cbc_padding(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                     const std::string& name) {
  std::array<uint8_t, 16> last{};
  const uint32_t from = framing.block(index).cipher_length - 16;
  const size_t kept = decrypt_cbc_range(read, framing, key, index, from, last, name);
  OPENSSL_cleanse(last.data(), last.size());
  return static_cast<uint32_t>(16 - kept);
}

void verify_block(const ReadExact& read, const Framing& framing, const Key& key, uint64_t index,
                  const std::string& name) {
  if (framing.mode != Mode::kAesGcm) {
    cbc_padding(read, framing, key, index, name);
    return;
  }
  const BlockPlace place = framing.block(index);
  check_key_for_mode(framing.mode, key, name);
  const BlockHeader header = read_block_header(read, framing, place, name);
  const Ctx ctx = start(framing, key, header.iv.data(), name, place);
  std::vector<uint8_t> scratch(std::min<size_t>(place.cipher_length, size_t{1} << 20));
  struct Wipe {
    std::vector<uint8_t>& bytes;
    ~Wipe() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
  } wipe{scratch};
  for (uint64_t done = 0; done < place.cipher_length;) {
    const size_t n = std::min<uint64_t>(scratch.size(), place.cipher_length - done);
    const std::span<uint8_t> chunk(scratch.data(), n);
    read(place.cipher_offset + done, chunk);
    update(ctx.get(), chunk, name, place);
    done += n;
  }
  if (!finish(ctx.get(), framing, header)) refuse_block(name, framing, place);
}

}  // namespace ckptfs::crypt
