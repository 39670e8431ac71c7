// The encrypted-checkpoint framing and decrypting stream on arbitrary bytes: parsing either
// throws ckptfs::Error or gives blocks that tile the file exactly; decrypting with the fixtures'
// test key either throws Error (wrong key, damaged block) or gives exactly size() bytes.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/crypt/framing.h"
#include "ckptfs/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptfs;
  using namespace ckptfs::crypt;
  fuzz::MemFile file(data, size);
  const ReadExact read = read_exact_from(file.fd(), "input");
  Framing framing;
  try {
    framing = parse_framing(read, size, "input");
  } catch (const Error&) {
    return 0;
  }
  if (framing.block_count == 0) std::abort();
  const BlockPlace last = framing.block(framing.block_count - 1);
  if (last.cipher_offset + last.cipher_length != size) std::abort();
  if (framing.last_cipher_length > framing.full_cipher_length) std::abort();
  // The seeds' key lengths (tests/data/encrypted/README.md): GCM 32, AES-CBC 24, SM4-CBC 16.
  static constexpr std::string_view kKey = "ckptfs-TEST-KEY-not-a-secret-32B";
  const size_t key_length = framing.mode == Mode::kAesGcm   ? 32
                            : framing.mode == Mode::kAesCbc ? 24
                                                            : 16;
  try {
    DecryptedStream stream(
        read, size, "input",
        Key(std::span(reinterpret_cast<const uint8_t*>(kKey.data()), key_length), "key"),
        StreamOptions{std::nullopt, 2, 64});
    if (stream.size() > size) std::abort();
    try {
      stream.verify();
    } catch (const Error&) {
    }
    std::vector<uint8_t> out(stream.size());
    for (uint64_t at = 0; at < out.size(); at += 3000) {
      const size_t n = std::min<uint64_t>(3000, out.size() - at);
      stream.read(at, std::span(out.data() + at, n));
    }
  } catch (const Error&) {
  }
  return 0;
}
