// Where a key may come from: a file only its owner can access, or a named environment variable.
#include "ckptfs/crypt/key.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <string>

#include "crypt/crypt_support.h"

namespace ckptfs::crypt {
namespace {

using testing::error_of;
using testing::kTestKey;
using testsupport::TempDir;
using testsupport::write_file;

std::string key_text(const Key& key) { return std::string(key.bytes().begin(), key.bytes().end()); }

std::string key_file(const TempDir& dir, const std::string& bytes, mode_t mode) {
  const std::string path = write_file(dir.path() / "key", bytes).string();
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(KeyFile, OwnerOnlyFileGivesItsRawBytes) {
  const TempDir dir;
  for (size_t length : {16u, 24u, 32u}) {
    const std::string path = key_file(dir, kTestKey.substr(0, length), 0600);
    EXPECT_EQ(key_text(read_key_file(path)), kTestKey.substr(0, length));
  }
  EXPECT_EQ(key_text(read_key_file(key_file(dir, kTestKey, 0400))), kTestKey);
}

TEST(KeyFile, GroupOrOthersAccessIsRefusedWithTheChmodToRun) {
  const TempDir dir;
  for (mode_t mode : {0644, 0640, 0604, 0620}) {
    const std::string path = key_file(dir, kTestKey, mode);
    EXPECT_EQ(error_of([&] { read_key_file(path); }),
              fmt::format("{}: the key file's mode {:04o} lets group or others access it; run: "
                          "chmod 600 {}",
                          path, mode, path));
  }
}

TEST(KeyFile, WrongLengthsAndATrailingNewlineAreRefused) {
  const TempDir dir;
  std::string path = key_file(dir, kTestKey.substr(0, 16) + "\n", 0600);
  EXPECT_EQ(error_of([&] { read_key_file(path); }),
            path +
                ": the key file is 17 bytes and ends with a newline; the key is the file's raw "
                "bytes (write it with printf or head -c, not echo)");
  path = key_file(dir, kTestKey.substr(0, 20), 0600);
  EXPECT_EQ(error_of([&] { read_key_file(path); }),
            path + ": the key file is 20 bytes; it must hold the raw key: 16, 24 or 32 bytes");
  EXPECT_THROW(read_key_file((dir.path() / "absent").string()), Error);
  EXPECT_THROW(read_key_file(dir.path().string()), Error);  // a directory
}

TEST(KeyEnv, HexDigitsGiveTheKey) {
  ::setenv("CKPTFS_TEST_KEY_HEX", "00112233445566778899aabbccddeeFF", 1);
  const Key key = read_key_env("CKPTFS_TEST_KEY_HEX");
  ASSERT_EQ(key.size(), 16u);
  EXPECT_EQ(key.bytes()[0], 0x00);
  EXPECT_EQ(key.bytes()[1], 0x11);
  EXPECT_EQ(key.bytes()[15], 0xFF);
  ::unsetenv("CKPTFS_TEST_KEY_HEX");
}

TEST(KeyEnv, UnsetShortAndNonHexAreRefused) {
  ::unsetenv("CKPTFS_TEST_KEY_HEX");
  EXPECT_EQ(error_of([] { read_key_env("CKPTFS_TEST_KEY_HEX"); }),
            "environment variable CKPTFS_TEST_KEY_HEX: not set (it should hold the key as hex)");
  ::setenv("CKPTFS_TEST_KEY_HEX", "0011", 1);
  EXPECT_EQ(error_of([] { read_key_env("CKPTFS_TEST_KEY_HEX"); }),
            "environment variable CKPTFS_TEST_KEY_HEX: 4 characters; the key must be 32, 48 or "
            "64 hex digits (16, 24 or 32 bytes)");
  ::setenv("CKPTFS_TEST_KEY_HEX", "00112233445566778899aabbccddeeXX", 1);
  EXPECT_EQ(error_of([] { read_key_env("CKPTFS_TEST_KEY_HEX"); }),
            "environment variable CKPTFS_TEST_KEY_HEX: character 31 is not a hex digit; the key "
            "must be hex");
  ::unsetenv("CKPTFS_TEST_KEY_HEX");
}

TEST(Key, MovedFromKeyIsEmpty) {
  Key a = testing::test_key(32);
  Key b = std::move(a);
  EXPECT_EQ(b.size(), 32u);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): wiping it is the point
  EXPECT_THROW(Key(std::span<const uint8_t>(), "nothing"), Error);
}

TEST(KeyFile, KeyFromFileDecryptsMindSporesFile) {
  const TempDir dir;
  const Key key = read_key_file(key_file(dir, kTestKey.substr(0, 16), 0600));
  const testing::MemoryFile file = testing::load("single/sm4_cbc.ckpt");
  DecryptedStream stream(file.reader(), file.bytes.size(), file.name, Key(key.bytes(), "copy"));
  EXPECT_EQ(testing::read_all(stream, 4096), testing::load("single/plain.ckpt").bytes);
}

}  // namespace
}  // namespace ckptfs::crypt
