#include <sys/stat.h>

#include <span>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/crypt/session_key.h"
#include "ckptfs/error.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::ckpt {

namespace {

bool claims_encrypted(std::string_view, std::string_view head) {
  return crypt::looks_encrypted(
      std::span(reinterpret_cast<const uint8_t*>(head.data()), head.size()));
}

scan::FileScan scan_encrypted(int fd, const std::string& name, const scan::ReadOptions& options) {
  // Without a key, the .ckpt scanner's own refusal: it names the mode and the options to use.
  if (crypt::session_key() == nullptr) return scan_checkpoint_fd(fd, name);
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", name, errno_text(errno));
  crypt::DecryptedStream stream(read_exact_from(fd, name), static_cast<uint64_t>(st.st_size), name,
                                crypt::session_key_for(name));
  // Once, at index time: a wrong key or a tampered block is refused before anything is served.
  stream.verify();
  scan::FileScan scan = scan_checkpoint_bytes(stream.reader(), stream.size(), name,
                                              ScanOptions{.verify_crc = options.verify_crc});
  scan.encrypted = true;
  return scan;
}

}  // namespace

const scan::FileReader kEncryptedReader{scan::SourceFormat::Ckpt, claims_encrypted, scan_encrypted};

}  // namespace ckptfs::ckpt
