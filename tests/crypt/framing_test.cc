// The block framing of files MindSpore 2.7.2 wrote. The expected geometry was read off the files
// by an independent Python walk of the layout in docs/FORMATS.md (tests/data/encrypted/README.md).
#include "ckptfs/crypt/framing.h"

#include <gtest/gtest.h>

#include <string>

#include "crypt/crypt_support.h"

namespace ckptfs::crypt {
namespace {

using testing::error_of;
using testing::load;
using testing::MemoryFile;

Framing parse(const MemoryFile& file) {
  return parse_framing(file.reader(), file.bytes.size(), file.name);
}

TEST(Framing, AesGcmFourBlocks) {
  const Framing f = parse(load("single/aes_gcm.ckpt"));
  EXPECT_EQ(f.mode, Mode::kAesGcm);
  EXPECT_EQ(f.block_count, 4u);
  EXPECT_EQ(f.header_length, 48u);
  EXPECT_EQ(f.full_cipher_length, 4096u);
  EXPECT_EQ(f.last_cipher_length, 2439u);
  EXPECT_EQ(f.block(3).header_offset, 12432u);
  EXPECT_EQ(f.block(3).cipher_offset, 12480u);
  EXPECT_EQ(f.block(3).cipher_length, 2439u);
}

TEST(Framing, AesGcmOneBlockAtMindSporesDefaultBlockSize) {
  const Framing f = parse(load("single/aes_gcm_oneblock.ckpt"));
  EXPECT_EQ(f.block_count, 1u);
  EXPECT_EQ(f.last_cipher_length, 14727u);  // the oracle's size: GCM adds no padding
}

TEST(Framing, CbcModesPadEveryBlock) {
  for (const char* name : {"single/aes_cbc.ckpt", "single/sm4_cbc.ckpt"}) {
    SCOPED_TRACE(name);
    const Framing f = parse(load(name));
    EXPECT_EQ(f.mode,
              std::string(name).find("sm4") != std::string::npos ? Mode::kSm4Cbc : Mode::kAesCbc);
    EXPECT_EQ(f.block_count, 4u);
    EXPECT_EQ(f.header_length, 32u);
    EXPECT_EQ(f.full_cipher_length, 4112u);  // 4096 bytes and a whole block of padding
    EXPECT_EQ(f.last_cipher_length, 2448u);  // 2439 bytes and 9 of padding
  }
}

TEST(Framing, HeaderFieldsAreTheFilesBytes) {
  const MemoryFile file = load("single/aes_gcm.ckpt");
  const Framing f = parse(file);
  const BlockHeader h = read_block_header(file.reader(), f, f.block(1), file.name);
  EXPECT_EQ(std::string(h.tag.begin(), h.tag.end()), file.bytes.substr(4144 + 4, 16));
  EXPECT_EQ(std::string(h.iv.begin(), h.iv.end()), file.bytes.substr(4144 + 28, 16));
}

TEST(Framing, MagicDetection) {
  const MemoryFile file = load("single/sm4_cbc.ckpt");
  const auto* p = reinterpret_cast<const uint8_t*>(file.bytes.data());
  EXPECT_TRUE(looks_encrypted(std::span(p, 4)));
  const MemoryFile plain = load("single/plain.ckpt");
  EXPECT_FALSE(looks_encrypted(std::span(reinterpret_cast<const uint8_t*>(plain.bytes.data()), 4)));
  EXPECT_EQ(mode_from_name("SM4-CBC"), Mode::kSm4Cbc);
  EXPECT_FALSE(mode_from_name("AES-CTR").has_value());
}

TEST(Framing, EveryCutThatIsNotABlockBoundaryIsRefused) {
  const MemoryFile whole = load("single/aes_gcm.ckpt");
  for (size_t size = 0; size < whole.bytes.size(); ++size) {
    MemoryFile cut{whole.name, whole.bytes.substr(0, size)};
    if (size == 4144 || size == 8288 || size == 12432) {
      EXPECT_EQ(parse(cut).block_count, size / 4144);  // whole blocks: see docs/FORMATS.md
      continue;
    }
    EXPECT_THROW(parse(cut), Error) << size;
  }
}

TEST(Framing, RefusalsNameFileAndOffset) {
  const MemoryFile whole = load("single/aes_gcm.ckpt");
  const std::string n = whole.name;
  auto message = [&](std::string bytes) {
    MemoryFile f{n, std::move(bytes)};
    return error_of([&] { parse(f); });
  };
  EXPECT_EQ(message(whole.bytes.substr(0, 4144 + 20)),
            n + ": byte offset 4144: file ends inside block 1's 48-byte header (truncated?)");
  EXPECT_EQ(message(whole.bytes.substr(0, 14000)),
            n + ": byte offset 12480: block 3's 2439-byte ciphertext runs past the end of the "
                "file (14000 bytes; truncated?)");
  EXPECT_EQ(message(whole.bytes + "XXXX"),
            n + ": byte offset 14919: block 4 starts with 0x58585858, not an encryption magic "
                "(damaged file?)");
  EXPECT_EQ(message(whole.bytes + "X"),
            n + ": byte offset 14919: file ends inside block 4's magic (truncated?)");
  std::string other_magic = whole.bytes;
  other_magic[4144] = static_cast<char>(0xD9);
  EXPECT_EQ(message(other_magic),
            n + ": byte offset 4144: block 1 is AES-CBC, the first block AES-GCM (damaged file?)");
  std::string iv_length = whole.bytes;
  iv_length[24] = 12;
  EXPECT_EQ(message(iv_length),
            n + ": byte offset 24: block 0's IV length is 12, MindSpore writes 16 (damaged file?)");
  std::string rest = whole.bytes;
  rest[20] = 0;
  EXPECT_EQ(message(rest), n + ": byte offset 20: block 0's length field 4096 disagrees with its "
                               "IV and ciphertext (4 + 16 + 4 + 4096) (damaged file?)");
  EXPECT_EQ(message(""), n + ": byte offset 0: empty file, not an encrypted checkpoint");
  EXPECT_EQ(message(load("single/plain.ckpt").bytes),
            n + ": byte offset 0: block 0 starts with 0x0A60A10A, not an encryption magic "
                "(damaged file?)");
}

}  // namespace
}  // namespace ckptfs::crypt
