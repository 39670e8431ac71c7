#include "ckptfs/crypt/key.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "ckptfs/error.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::crypt {
namespace {

bool valid_length(size_t n) { return n == 16 || n == 24 || n == 32; }

// A stack buffer wiped on every way out: key bytes pass through it.
struct Scratch {
  std::array<uint8_t, 64> bytes{};
  ~Scratch() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Key::Key(std::span<const uint8_t> bytes, const std::string& origin) {
  if (!valid_length(bytes.size()))
    fail("{}: the key is {} bytes; AES keys are 16, 24 or 32 bytes, SM4 keys 16", origin,
         bytes.size());
  std::memcpy(bytes_.data(), bytes.data(), bytes.size());
  size_ = bytes.size();
}

Key::Key(Key&& other) noexcept : bytes_(other.bytes_), size_(other.size_) { other.wipe(); }

Key& Key::operator=(Key&& other) noexcept {
  if (this != &other) {
    bytes_ = other.bytes_;
    size_ = other.size_;
    other.wipe();
  }
  return *this;
}

Key::~Key() { wipe(); }

void Key::wipe() noexcept {
  OPENSSL_cleanse(bytes_.data(), bytes_.size());
  size_ = 0;
}

Key read_key_file(const std::string& path) {
  const UniqueFd fd = util::open_regular(path, "key file");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    fail("{}: cannot stat the key file: {}", path, errno_text(errno));
  // The mode of the file itself (open followed any symlink, as a mounted secret's is).
  if ((st.st_mode & 077) != 0)
    fail("{}: the key file's mode {:04o} lets group or others access it; run: chmod 600 {}", path,
         st.st_mode & 07777, path);
  if (st.st_size == 17 || st.st_size == 25 || st.st_size == 33) {
    Scratch last;
    pread_exact(fd.get(), path, static_cast<uint64_t>(st.st_size) - 1,
                std::span(last.bytes.data(), 1));
    if (last.bytes[0] == '\n')
      fail(
          "{}: the key file is {} bytes and ends with a newline; the key is the file's raw bytes "
          "(write it with printf or head -c, not echo)",
          path, st.st_size);
  }
  if (!valid_length(static_cast<size_t>(st.st_size)))
    fail("{}: the key file is {} bytes; it must hold the raw key: 16, 24 or 32 bytes", path,
         st.st_size);
  Scratch raw;
  const size_t n = static_cast<size_t>(st.st_size);
  pread_exact(fd.get(), path, 0, std::span(raw.bytes.data(), n));
  return Key(std::span<const uint8_t>(raw.bytes.data(), n), path);
}

Key read_key_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr)
    fail("environment variable {}: not set (it should hold the key as hex)", name);
  const size_t digits = std::strlen(value);
  if (digits != 32 && digits != 48 && digits != 64)
    fail(
        "environment variable {}: {} characters; the key must be 32, 48 or 64 hex digits "
        "(16, 24 or 32 bytes)",
        name, digits);
  Scratch raw;
  for (size_t i = 0; i < digits / 2; ++i) {
    const int high = hex_value(value[2 * i]);
    const int low = hex_value(value[2 * i + 1]);
    if (high < 0 || low < 0)
      fail("environment variable {}: character {} is not a hex digit; the key must be hex", name,
           high < 0 ? 2 * i + 1 : 2 * i + 2);
    raw.bytes[i] = static_cast<uint8_t>(high << 4 | low);
  }
  return Key(std::span<const uint8_t>(raw.bytes.data(), digits / 2),
             "environment variable " + name);
}

}  // namespace ckptfs::crypt
