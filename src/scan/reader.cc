#include "ckptfs/scan/reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/util/eintr.h"

namespace ckptfs::scan {

const FileReader& pick_reader(Readers readers, int fd, const std::string& name) {
  char head[kHeadBytes] = {};
  const ssize_t got = retry_eintr([&] { return remote::pread(fd, head, sizeof head, 0); });
  if (got < 0) fail("{}: cannot read: {}", name, remote::read_failure(errno));
  const std::string_view first(head, static_cast<size_t>(got));
  for (const FileReader* reader : readers)
    if (reader->claims(name, first)) return *reader;
  fail("{}: not a file of any format this source holds", name);
}

}  // namespace ckptfs::scan
