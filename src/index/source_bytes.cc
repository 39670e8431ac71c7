#include "ckptfs/index/source_bytes.h"

#include <memory>

#include "ckptfs/crypt/decrypted_stream.h"
#include "ckptfs/crypt/session_key.h"

namespace ckptfs::index {

ReadExact source_reader(const IndexedSource& source) {
  const std::string name = source.file.path.string();
  ReadExact file = read_exact_from(source.file.fd.get(), name);
  if (!source.scan.encrypted) return file;
  // One page of cache: the callers read a few scalars, once.
  auto stream = std::make_shared<crypt::DecryptedStream>(
      std::move(file), source.file.fingerprint.size, name, crypt::session_key_for(name),
      crypt::StreamOptions{.mode = std::nullopt, .cache_pages = 1});
  return [stream](uint64_t offset, std::span<uint8_t> out) { stream->read(offset, out); };
}

}  // namespace ckptfs::index
