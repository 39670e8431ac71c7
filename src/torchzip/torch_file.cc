#include "ckptfs/torchzip/torch_file.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "ckptfs/error.h"
#include "ckptfs/torchzip/pickle.h"
#include "ckptfs/torchzip/zip.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "io.h"

namespace ckptfs::torchzip {

namespace {

std::string small_record(int fd, const std::string& name, const ZipRecord& r) {
  if (r.size > 64)
    fail("{}: record {} is {} bytes, expected a few", name, file_text(r.name), r.size);
  std::string s(r.size, '\0');
  read_exact(fd, name, r.data_offset, s.data(), s.size());
  return s;
}

}  // namespace

bool looks_like_torch(std::string_view head) {
  return head.substr(0, 4) == std::string_view("PK\x03\x04", 4) ||
         head.substr(0, 3) == std::string_view("\x80\x02\x8A", 3);
}

namespace {

scan::FileScan scan_archive(int fd, const std::string& name, const ZipArchive& zip) {
  for (const ZipRecord& r : zip.records)
    if (r.name == "constants.pkl" || r.name.rfind("code/", 0) == 0)
      fail("{}: a TorchScript archive (record {}), not a torch.save state: save the state_dict",
           name, file_text(r.name));
  const ZipRecord* version = zip.find("version");
  if (!version) version = zip.find(".data/version");
  if (!version) fail("{}: no version record in the archive", name);
  {
    std::string text = small_record(fd, name, *version);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    int v = 0;
    for (char c : text) v = (c >= '0' && c <= '9' && v < 100) ? v * 10 + (c - '0') : 1000;
    if (text.empty() || v < 1 || v > 10)
      fail("{}: record {} holds {}, not a version from 1 to 10", name, file_text(version->name),
           file_text(text));
  }
  if (const ZipRecord* order = zip.find("byteorder")) {
    const std::string text = small_record(fd, name, *order);
    if (text != "little")
      fail("{}: storages are stored {}-endian (record byteorder); only little-endian is read", name,
           text == "big" ? text : file_text(text));
  }
  const ZipRecord* pickle = zip.find("data.pkl");
  if (!pickle) fail("{}: no data.pkl record in the archive", name);
  if (pickle->size > kMaxPickleBytes)
    fail("{}: data.pkl is {} bytes, more than the limit of {}", name, pickle->size,
         kMaxPickleBytes);
  std::string data(pickle->size, '\0');
  read_exact(fd, name, pickle->data_offset, data.data(), data.size());

  std::unordered_map<std::string_view, const ZipRecord*> storages;
  for (const ZipRecord& r : zip.records)
    if (r.name.rfind("data/", 0) == 0) storages.emplace(std::string_view(r.name).substr(5), &r);
  const Unpickled object =
      unpickle(data, name, [&](std::string_view key) -> std::optional<uint64_t> {
        auto it = storages.find(key);
        return it == storages.end() ? std::nullopt : std::optional<uint64_t>(it->second->size);
      });

  scan::FileScan scan;
  scan.format = scan::SourceFormat::TorchZip;
  scan.file_size = scan.body_size = zip.file_size;
  scan.tree = object.tree.dump();
  scan.params.reserve(object.tensors.size());
  for (const PickledTensor& t : object.tensors) {
    const ZipRecord& r = *storages.at(t.storage_key);
    scan::Param& p = scan.params.emplace_back();
    p.name = t.path;
    p.dtype = std::string(t.dtype->code);
    p.shape = t.shape;
    p.kind = scan::EntryKind::Tensor;
    p.element_size = t.dtype->element_size;
    p.content = {{r.data_offset, r.size}};
    p.view = true;
    p.storage_offset = t.storage_offset;
    p.strides = t.stride;
  }
  return scan;
}

}  // namespace

scan::FileScan scan_torch_fd(int fd, const std::string& name) {
  return scan_archive(fd, name, read_zip(fd, name));
}

scan::FileScan scan_torch_at(int fd, const std::string& name, uint64_t base, uint64_t size) {
  return scan_archive(fd, name, read_zip_at(fd, name, base, size));
}

scan::FileScan scan_torch(const std::string& path) {
  const UniqueFd fd = util::open_regular(path, "checkpoint file");
  return scan_torch_fd(fd.get(), path);
}

}  // namespace ckptfs::torchzip
