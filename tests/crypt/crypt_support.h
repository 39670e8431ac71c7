// Shared by the crypt tests: the fixtures MindSpore 2.7.2 wrote (tests/data/encrypted/README.md)
// and in-memory files to damage.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/crypt/key.h"
#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::crypt::testing {

inline const std::filesystem::path kData = std::filesystem::path(CKPTFS_TEST_DATA) / "encrypted";
// The fixture script's test key (scripts/enc_fixture.py); shorter keys are its prefixes.
inline const std::string kTestKey = "ckptfs-TEST-KEY-not-a-secret-32B";

inline Key test_key(size_t length) {
  return Key(std::span(reinterpret_cast<const uint8_t*>(kTestKey.data()), length), "test key");
}

// The same key with every byte changed.
inline Key wrong_key(size_t length) {
  std::vector<uint8_t> bytes(kTestKey.begin(), kTestKey.begin() + static_cast<long>(length));
  for (uint8_t& b : bytes) b ^= 0x5A;
  return Key(bytes, "wrong key");
}

// A fixture's bytes, held in memory so that a test may change them.
struct MemoryFile {
  std::string name;
  std::string bytes;

  ReadExact reader() const {
    return [this](uint64_t offset, std::span<uint8_t> out) {
      if (offset > bytes.size() || out.size() > bytes.size() - offset)
        fail("{}: byte offset {}: file ended early (was it truncated?)", name, offset);
      std::copy_n(bytes.data() + offset, out.size(), reinterpret_cast<char*>(out.data()));
    };
  }
};

inline MemoryFile load(const std::filesystem::path& relative) {
  MemoryFile file{relative.string(), testsupport::read_file(kData / relative)};
  if (file.bytes.empty()) ADD_FAILURE() << "missing fixture " << (kData / relative);
  return file;
}

// The whole decrypted stream, read in `chunk`-byte pieces.
inline std::string read_all(DecryptedStream& stream, size_t chunk) {
  std::string out(stream.size(), '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  for (uint64_t at = 0; at < out.size(); at += chunk) {
    const size_t n = std::min<uint64_t>(chunk, out.size() - at);
    stream.read(at, std::span(p + at, n));
  }
  return out;
}

// The message of the Error `body` throws, or "" (and a test failure) if it throws none.
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

}  // namespace ckptfs::crypt::testing
