#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ckptfs/dcp/dcp.h"
#include "ckptfs/error.h"
#include "ckptfs/torchzip/torch_file.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/util/shape_text.h"

namespace ckptfs::dcp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One item of the file being scanned: a tensor chunk or an object.
struct Item {
  const Tensor* tensor = nullptr;  // null: an object
  const Chunk* chunk = nullptr;
  const Object* object = nullptr;
  const Storage* storage = nullptr;

  std::string what() const {
    return tensor ? fmt::format("tensor {} chunk at {}", file_text(tensor->fqn),
                                shape_text(chunk->offsets))
                  : fmt::format("object {}", file_text(object->fqn));
  }
};

// The parsed .metadata of the directory last scanned file by file. The index scans a
// checkpoint's data files one by one (a few threads at once) and each needs the whole metadata:
// it is parsed once per directory, not once per file. Kept while the file's identity, size and
// mtime stay the same.
std::shared_ptr<const Metadata> metadata_beside(const fs::path& dir) {
  struct Cached {
    std::string path;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    timespec mtime{};
    std::shared_ptr<const Metadata> metadata;
    bool same(const std::string& p, const struct stat& st) const {
      return metadata && p == path && st.st_dev == dev && st.st_ino == ino && st.st_size == size &&
             st.st_mtim.tv_sec == mtime.tv_sec && st.st_mtim.tv_nsec == mtime.tv_nsec;
    }
  };
  static std::mutex mu;
  static Cached cached;
  const std::string path = (dir / kMetadataName).string();
  struct stat st {};
  const bool known = ::stat(path.c_str(), &st) == 0;
  if (known) {
    std::lock_guard lock(mu);
    if (cached.same(path, st)) return cached.metadata;
  }
  auto md = std::make_shared<const Metadata>(read_metadata(dir));
  if (known) {
    std::lock_guard lock(mu);
    cached = {path, st.st_dev, st.st_ino, st.st_size, st.st_mtim, md};
  }
  return md;
}

}  // namespace

scan::FileScan scan_data_file(int fd, const std::string& name, const Metadata& md, uint32_t file) {
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("{}: cannot stat: {}", name, errno_text(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);

  std::vector<Item> items;
  for (const Tensor& t : md.tensors)
    for (const Chunk& c : t.chunks)
      if (c.storage.file == file) items.push_back({&t, &c, nullptr, &c.storage});
  for (const Object& o : md.objects)
    if (o.storage.file == file) items.push_back({nullptr, nullptr, &o, &o.storage});
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.storage->offset < b.storage->offset; });
  for (size_t i = 0; i < items.size(); ++i) {
    const Storage& s = *items[i].storage;
    if (s.offset > file_size || s.length > file_size - s.offset)
      fail(
          "{}: the item of {} (bytes [{}, +{}) per the metadata) lies past the end of the "
          "{}-byte file: the file is truncated or not this checkpoint's",
          name, items[i].what(), s.offset, s.length, file_size);
    if (i > 0) {
      const Storage& prev = *items[i - 1].storage;
      if (prev.offset + prev.length > s.offset)
        fail("{}: the items of {} and {} overlap (byte offsets {} and {}): the metadata is damaged",
             name, items[i - 1].what(), items[i].what(), prev.offset, s.offset);
    }
  }

  scan::FileScan scan;
  scan.format = scan::SourceFormat::Dcp;
  scan.file_size = scan.body_size = file_size;
  json chunks = json::array(), objects = json::array();
  for (const Item& item : items) {
    const Storage& s = *item.storage;
    if (!item.tensor) {
      objects.push_back({{"fqn", item.object->fqn}, {"offset", s.offset}, {"length", s.length}});
      continue;
    }
    const Tensor& t = *item.tensor;
    const Chunk& c = *item.chunk;
    const std::string item_name =
        fmt::format("{} (item of {} at byte offset {})", name, item.what(), s.offset);
    scan::FileScan inner = torchzip::scan_torch_at(fd, item_name, s.offset, s.length);
    if (inner.params.size() != 1 || !inner.params[0].name.empty())
      fail("{}: the item of {} holds {} tensors, not one tensor: the metadata is damaged", name,
           item.what(), inner.params.size());
    scan::Param& p = inner.params[0];
    if (p.dtype != t.code)
      fail("{}: the item of {} holds a {} tensor where the metadata says {}", name, item.what(),
           p.dtype, t.code);
    if (p.shape != c.sizes)
      fail("{}: the item of {} holds a tensor of shape {} where the chunk's is {}", name,
           item.what(), shape_text(p.shape), shape_text(c.sizes));
    // FileSystemWriter saves each chunk with minimal storage (it clones otherwise): a record of
    // another size is not what DCP wrote.
    const unsigned __int128 need = static_cast<unsigned __int128>(c.elements()) * t.element_size;
    if (p.content[0].length != need)
      fail(
          "{}: the item of {} has a data/0 record of {} bytes where the chunk's {} elements of {} "
          "take {}",
          name, item.what(), p.content[0].length, c.elements(), t.code,
          static_cast<uint64_t>(need));
    p.name = t.fqn;
    scan.params.push_back(std::move(p));
    chunks.push_back({{"fqn", t.fqn}, {"offsets", c.offsets}, {"shape", t.shape}});
  }
  scan.tree = json{{"metadata", {{"bytes", md.bytes}, {"digest", md.digest}}},
                   {"chunks", std::move(chunks)},
                   {"objects", std::move(objects)}}
                  .dump();
  return scan;
}

bool claims_data_file(std::string_view name, std::string_view head) {
  return name.ends_with(kDataSuffix) &&
         (head.empty() || head.starts_with(std::string_view("PK\x03\x04", 4)));
}

scan::FileScan scan_data_file_beside(int fd, const std::string& name) {
  const fs::path path(name);
  const std::shared_ptr<const Metadata> shared = metadata_beside(path.parent_path());
  const Metadata& md = *shared;
  const std::string file = path.filename().string();
  const auto it = std::lower_bound(md.files.begin(), md.files.end(), file);
  if (it == md.files.end() || *it != file)
    fail("{}: no item of the checkpoint's {} is in this file", name, kMetadataName);
  return scan_data_file(fd, name, md, static_cast<uint32_t>(it - md.files.begin()));
}

std::optional<fs::path> detect(const fs::path& dir, const std::string&) {
  if (is_dcp_dir(dir)) return dir;
  std::error_code ec;
  if (fs::is_regular_file(dir / "__0.metadata", ec))
    fail(
        "{}: a rank-local DCP checkpoint (__<rank>.metadata files, saved without collectives): "
        "ckptfs reads only checkpoints with one global .metadata",
        dir.string());
  return std::nullopt;
}

std::vector<fs::path> index_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const std::string& file : read_metadata(dir).files) out.push_back(dir / file);
  return out;
}

Checkpoint read_checkpoint(const fs::path& dir) {
  Checkpoint ckpt;
  ckpt.metadata = read_metadata(dir);
  for (uint32_t i = 0; i < ckpt.metadata.files.size(); ++i) {
    const fs::path path = dir / ckpt.metadata.files[i];
    const UniqueFd fd = util::open_regular(path, "DCP data file");
    ckpt.scans.push_back(scan_data_file(fd.get(), path.string(), ckpt.metadata, i));
  }
  return ckpt;
}

}  // namespace ckptfs::dcp
