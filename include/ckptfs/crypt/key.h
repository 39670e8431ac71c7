// A decryption key and where it may come from: a file only its owner can read, or an
// environment variable the caller names. Never a command-line argument (argv is visible to every
// user in ps and /proc).
//
// Thread-safety: a Key is a value; concurrent const use is safe. read_key_file and read_key_env
// are reentrant (read_key_env reads the environment: no concurrent setenv).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ckptfs::crypt {

// 16, 24 or 32 bytes (AES-128/192/256; SM4 takes 16 only). The bytes are wiped when the key is
// destroyed or moved from; a Key is never copied implicitly.
class Key {
 public:
  Key() = default;
  // Throws Error naming `origin` when `bytes` is not 16, 24 or 32 bytes long.
  Key(std::span<const uint8_t> bytes, const std::string& origin);
  Key(Key&& other) noexcept;
  Key& operator=(Key&& other) noexcept;
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  ~Key();

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void wipe() noexcept;
  std::array<uint8_t, 32> bytes_{};
  size_t size_ = 0;
};

// The key in `path`: the file's bytes exactly (16, 24 or 32 of them, raw, as MindSpore's
// enc_key). Throws Error with one line naming the file for: a file group or others may access
// ("chmod 600 FILE"), not a regular file, a length other than 16/24/32 (a trailing newline is
// named as such), or a read error.
Key read_key_file(const std::string& path);

// The key in environment variable `name`, as hex digits (32, 48 or 64 of them; an environment
// value cannot hold every byte). Throws Error naming the variable when it is unset or not such
// hex.
Key read_key_env(const std::string& name);

}  // namespace ckptfs::crypt
