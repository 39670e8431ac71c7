// Decrypting files MindSpore 2.7.2 encrypted: the plaintext must be exactly the file MindSpore
// wrote unencrypted from the same parameters (its oracle), and the checkpoint scanner must see
// in it what MindSpore saved (scripts/enc_fixture.py).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/crypt/block_cipher.h"
#include "ckptfs/crypt/decrypted_stream.h"
#include "crypt/crypt_support.h"

namespace ckptfs::crypt {
namespace {

using testing::error_of;
using testing::load;
using testing::MemoryFile;
using testing::read_all;
using testing::test_key;
using testing::wrong_key;

struct Fixture {
  const char* file;
  Mode mode;
  size_t key_length;
};
const Fixture kSingle[] = {
    {"single/aes_gcm.ckpt", Mode::kAesGcm, 32},
    {"single/aes_gcm_oneblock.ckpt", Mode::kAesGcm, 16},
    {"single/aes_cbc.ckpt", Mode::kAesCbc, 24},
    {"single/sm4_cbc.ckpt", Mode::kSm4Cbc, 16},
};

DecryptedStream open(const MemoryFile& file, Key key, StreamOptions options = {}) {
  return DecryptedStream(file.reader(), file.bytes.size(), file.name, std::move(key), options);
}

TEST(Decrypt, EachModeGivesMindSporesUnencryptedBytes) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  for (const Fixture& fx : kSingle) {
    SCOPED_TRACE(fx.file);
    const MemoryFile file = load(fx.file);
    DecryptedStream stream = open(file, test_key(fx.key_length), {fx.mode, 4});
    EXPECT_EQ(stream.size(), oracle.size());
    stream.verify();
    EXPECT_EQ(read_all(stream, 4096), oracle);
    EXPECT_EQ(read_all(stream, 1000), oracle);  // reads across block boundaries
  }
}

TEST(Decrypt, CbcPagesGiveTheSameBytes) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  for (const Fixture& fx : {kSingle[2], kSingle[3]})
    for (uint32_t page : {16u, 48u, 1024u, 4096u}) {
      SCOPED_TRACE(std::string(fx.file) + " page " + std::to_string(page));
      const MemoryFile file = load(fx.file);
      DecryptedStream stream = open(file, test_key(fx.key_length), {fx.mode, 3, page});
      EXPECT_EQ(read_all(stream, 1000), oracle);
    }
}

TEST(Decrypt, OneCachedBlockServesAnyOrder) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  const MemoryFile file = load("single/aes_cbc.ckpt");
  DecryptedStream stream = open(file, test_key(24), {std::nullopt, 1});
  std::string out(oracle.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  for (uint64_t at = oracle.size(); at > 0;) {  // backwards, 777 bytes at a time
    const uint64_t from = at > 777 ? at - 777 : 0;
    stream.read(from, std::span(p + from, at - from));
    at = from;
  }
  EXPECT_EQ(out, oracle);
}

TEST(Decrypt, DistributedRankFilesGiveTheirOracles) {
  for (const char* mode : {"aes_gcm", "aes_cbc", "sm4_cbc"})
    for (int rank = 0; rank < 4; ++rank) {
      const std::string rel = "rank_" + std::to_string(rank) + "/checkpoint-1_1.ckpt";
      SCOPED_TRACE(std::string(mode) + "/" + rel);
      const MemoryFile file = load(std::string("dist/") + mode + "/" + rel);
      const size_t key_length = std::string(mode) == "aes_gcm" ? 32 : mode[0] == 'a' ? 24 : 16;
      DecryptedStream stream = open(file, test_key(key_length));
      stream.verify();
      EXPECT_EQ(read_all(stream, 4096), load("dist/plain/" + rel).bytes);
    }
}

TEST(Decrypt, ScannerSeesWhatMindSporeSaved) {
  const MemoryFile plain = load("single/plain.ckpt");
  const scan::FileScan oracle =
      ckpt::scan_checkpoint_bytes(plain.reader(), plain.bytes.size(), plain.name);
  // What scripts/enc_fixture.py saved.
  const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> saved = {
      {"layer.weight", "Float32", {48, 64}},  {"layer.bias", "Float16", {64}},
      {"embed.weight", "BFloat16", {32, 32}}, {"token_ids", "Int32", {16}},
      {"learning_rate", "Float32", {}},       {"global_step", "Int64", {}}};
  for (const Fixture& fx : kSingle) {
    SCOPED_TRACE(fx.file);
    const MemoryFile file = load(fx.file);
    DecryptedStream stream = open(file, test_key(fx.key_length));
    const scan::FileScan got = ckpt::scan_checkpoint_bytes(stream.reader(), stream.size(), fx.file);
    ASSERT_EQ(got.params.size(), saved.size());
    ASSERT_EQ(oracle.params.size(), saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_EQ(got.params[i].name, std::get<0>(saved[i]));
      EXPECT_EQ(got.params[i].dtype, std::get<1>(saved[i]));
      EXPECT_EQ(got.params[i].shape, std::get<2>(saved[i]));
      EXPECT_EQ(got.params[i].name, oracle.params[i].name);
      EXPECT_EQ(got.params[i].dtype, oracle.params[i].dtype);
      EXPECT_EQ(got.params[i].shape, oracle.params[i].shape);
    }
  }
}

TEST(Decrypt, WrongKeyGcmIsRefusedAtVerifyAndRead) {
  const MemoryFile file = load("single/aes_gcm.ckpt");
  DecryptedStream stream = open(file, wrong_key(32));  // GCM needs no key to open
  const std::string expected = file.name +
                               ": block 0 at byte offset 0: the AES-GCM tag does not match: "
                               "wrong key or damaged file";
  EXPECT_EQ(error_of([&] { stream.verify(); }), expected);
  std::vector<uint8_t> out(16);
  EXPECT_EQ(error_of([&] { stream.read(0, out); }), expected);
}

TEST(Decrypt, WrongKeyCbcIsRefusedAtOpenByItsPadding) {
  // MindSpore itself refuses these: EVP_DecryptFinal_ex fails on the padding, load_checkpoint
  // raises ValueError (tests/data/encrypted/README.md). CBC has no tag: a wrong key passes the
  // padding check about once in 256 blocks, then the checkpoint scanner refuses the plaintext.
  for (const Fixture& fx : {kSingle[2], kSingle[3]}) {
    SCOPED_TRACE(fx.file);
    const MemoryFile file = load(fx.file);
    EXPECT_EQ(error_of([&] { open(file, wrong_key(fx.key_length)); }),
              file.name + ": block 0 at byte offset 0: the " + std::string(mode_name(fx.mode)) +
                  " padding is not valid: wrong key or damaged file");
  }
}

TEST(Decrypt, FlippedGcmCiphertextByteIsRefusedInItsBlockOnly) {
  MemoryFile file = load("single/aes_gcm.ckpt");
  file.bytes[8288 + 48 + 100] ^= 0x01;  // block 2's ciphertext
  DecryptedStream stream = open(file, test_key(32), {std::nullopt, 1});
  const std::string expected = file.name +
                               ": block 2 at byte offset 8288: the AES-GCM tag does not match: "
                               "wrong key or damaged file";
  EXPECT_EQ(error_of([&] { stream.verify(); }), expected);
  std::vector<uint8_t> out(100);
  stream.read(0, out);  // block 0 is intact
  EXPECT_EQ(std::string(out.begin(), out.end()), load("single/plain.ckpt").bytes.substr(0, 100));
  EXPECT_EQ(error_of([&] { stream.read(2 * 4096 + 50, out); }), expected);
  EXPECT_EQ(error_of([&] { stream.read(2 * 4096 + 50, out); }), expected);  // not cached
}

// A whole block copied over another passes every tag (or padding) check, and would serve the
// copied plaintext where the overwritten block's was: plausible, wrong bytes. Its IV, which
// MindSpore draws at random for every block, gives it away.
TEST(Decrypt, BlockCopiedOverAnotherIsRefusedByItsRepeatedIv) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  for (const Fixture& fx : {kSingle[0], kSingle[2], kSingle[3]}) {
    SCOPED_TRACE(fx.file);
    MemoryFile file = load(fx.file);
    const uint64_t stride = fx.mode == Mode::kAesGcm ? 48 + 4096 : 32 + 4112;
    file.bytes.replace(2 * stride, stride, file.bytes.substr(stride, stride));  // 1 over 2
    DecryptedStream stream = open(file, test_key(fx.key_length), {fx.mode, 1});
    std::vector<uint8_t> out(4096);
    stream.read(2 * 4096, out);  // what would be served: block 1's bytes in block 2's place
    EXPECT_EQ(std::string(out.begin(), out.end()), oracle.substr(4096, 4096));
    EXPECT_EQ(error_of([&] { stream.verify(); }),
              file.name + ": block 2 at byte offset " + std::to_string(2 * stride) +
                  ": its IV repeats block 1's; MindSpore draws a new random IV for every block, "
                  "so a block was copied over another: damaged or tampered file");
  }
}

// The 4 IV bytes AES-GCM does not use (its nonce is the first 12) cannot hide such a copy.
TEST(Decrypt, GcmBlockCopyWithOtherUnusedIvBytesIsRefused) {
  MemoryFile file = load("single/aes_gcm.ckpt");
  const uint64_t stride = 48 + 4096;
  file.bytes.replace(2 * stride, stride, file.bytes.substr(stride, stride));
  file.bytes[2 * stride + 28 + 13] ^= 0x5A;  // IV byte 13: outside the nonce
  DecryptedStream stream = open(file, test_key(32));
  EXPECT_NE(error_of([&] { stream.verify(); }).find("its IV repeats block 1's"), std::string::npos);
}

TEST(Decrypt, FlippedGcmTagByteIsRefused) {
  MemoryFile file = load("single/aes_gcm_oneblock.ckpt");
  file.bytes[4 + 15] ^= 0x80;
  DecryptedStream stream = open(file, test_key(16));
  EXPECT_EQ(error_of([&] { stream.verify(); }),
            file.name +
                ": block 0 at byte offset 0: the AES-GCM tag does not match: wrong key or "
                "damaged file");
}

TEST(Decrypt, CbcBlockWithAnotherValidPaddingIsRefusedByVerify) {
  // Flipping the last byte of block 1's second-to-last ciphertext block turns its last plaintext
  // byte 0x10 (a whole padding block) into 0x01: valid padding, one plaintext byte too many.
  MemoryFile file = load("single/aes_cbc.ckpt");
  file.bytes[4144 + 32 + 4112 - 17] ^= 0x11;
  DecryptedStream stream = open(file, test_key(24));  // blocks 0 and 3 are intact
  const std::string expected = file.name +
                               ": block 1 at byte offset 4144: decrypts to 4111 bytes, 4096 "
                               "expected from the padding seen when the file was opened (damaged "
                               "file?)";
  EXPECT_EQ(error_of([&] { stream.verify(); }), expected);
  std::vector<uint8_t> out(10);
  EXPECT_EQ(error_of([&] { stream.read(4096 + 5, out); }), expected);
}

TEST(Decrypt, ConcurrentReadersGetTheOraclesBytes) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  const MemoryFile file = load("single/aes_gcm.ckpt");
  DecryptedStream stream = open(file, test_key(32), {std::nullopt, 2});
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out(1500);
      for (int i = 0; i < 200; ++i) {
        const uint64_t at = (static_cast<uint64_t>(t) * 7919 + i * 3001) % (oracle.size() - 1500);
        stream.read(at, out);
        if (std::string(out.begin(), out.end()) != oracle.substr(at, out.size())) ++wrong;
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Many streams read by many threads at once hold no more pages together than the process's
// budget, and every read still gives the oracle's bytes, whichever stream's pages were taken
// back in between.
TEST(Decrypt, ManyStreamsShareOneBudget) {
  const std::string oracle = load("single/plain.ckpt").bytes;
  const MemoryFile file = load("single/aes_gcm.ckpt");  // 4 KiB blocks: a page is 4 KiB
  std::vector<std::unique_ptr<DecryptedStream>> streams;
  for (int i = 0; i < 16; ++i)
    streams.push_back(std::make_unique<DecryptedStream>(
        file.reader(), file.bytes.size(), file.name, test_key(32), StreamOptions{std::nullopt, 2}));
  const uint64_t page = streams[0]->framing().full_cipher_length;
  set_decrypt_budget(3 * page);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  std::atomic<uint64_t> most{0};
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out(1500);
      for (int i = 0; i < 300; ++i) {
        DecryptedStream& stream = *streams[static_cast<size_t>(t * 5 + i * 7) % streams.size()];
        const uint64_t at = (static_cast<uint64_t>(t) * 7919 + i * 3001) % (oracle.size() - 1500);
        stream.read(at, out);
        if (std::string(out.begin(), out.end()) != oracle.substr(at, out.size())) ++wrong;
        const uint64_t held = decrypt_budget_held();
        for (uint64_t m = most.load(); held > m && !most.compare_exchange_weak(m, held);) {
        }
      }
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(most.load(), 0u);
  EXPECT_LE(most.load(), 3 * page);
  streams.clear();
  EXPECT_EQ(decrypt_budget_held(), 0u);  // every page given back with its stream
  set_decrypt_budget(kDefaultDecryptBudget);
}

TEST(Decrypt, ModeAndKeyLengthMismatchesAreRefused) {
  const MemoryFile gcm = load("single/aes_gcm.ckpt");
  EXPECT_EQ(error_of([&] {
              open(gcm, test_key(32), {Mode::kAesCbc, 4});
            }),
            gcm.name +
                ": byte offset 0: the file is encrypted with AES-GCM, the key was given "
                "for AES-CBC");
  const MemoryFile sm4 = load("single/sm4_cbc.ckpt");
  EXPECT_EQ(error_of([&] { open(sm4, test_key(32)); }),
            sm4.name + ": SM4-CBC takes a 16-byte key, the key given is 32 bytes");
  // AES-256 file, AES-128 key: a wrong key like any other.
  DecryptedStream stream = open(gcm, test_key(16));
  EXPECT_THROW(stream.verify(), Error);
}

TEST(Decrypt, ReadingPastTheEndIsRefused) {
  const MemoryFile file = load("single/aes_gcm.ckpt");
  DecryptedStream stream = open(file, test_key(32));
  std::vector<uint8_t> out(10);
  EXPECT_EQ(error_of([&] { stream.read(14720, out); }),
            file.name +
                ": decrypted byte offset 14720: reading 10 bytes past the end of the "
                "14727-byte plaintext");
}

TEST(Decrypt, BlockIntoCallersBufferOnly) {
  const MemoryFile file = load("single/aes_cbc.ckpt");
  const Framing framing = parse_framing(file.reader(), file.bytes.size(), file.name);
  std::vector<uint8_t> small(4111);
  EXPECT_THROW(decrypt_block(file.reader(), framing, test_key(24), 0, small, file.name), Error);
  std::vector<uint8_t> buf(4112);
  EXPECT_EQ(decrypt_block(file.reader(), framing, test_key(24), 3, buf, file.name), 2439u);
  EXPECT_EQ(std::string(buf.begin(), buf.begin() + 2439),
            load("single/plain.ckpt").bytes.substr(3 * 4096));
}

}  // namespace
}  // namespace ckptfs::crypt
