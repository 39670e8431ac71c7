// Hand-built torch.save files for the torchzip tests: a stored-zip writer (sparse offsets and
// zip64 fields when asked) and pickle snippets.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::torchtest {

inline std::string u16(uint64_t v) {
  std::string s(2, '\0');
  s[0] = static_cast<char>(v);
  s[1] = static_cast<char>(v >> 8);
  return s;
}
inline std::string u32(uint64_t v) {
  std::string s = u16(v);
  s += u16(v >> 16);
  return s;
}
inline std::string u64(uint64_t v) {
  std::string s = u32(v);
  s += u32(v >> 32);
  return s;
}

struct ZipEntry {
  std::string name;  // full name, folder included
  std::string data;
  uint64_t skip = 0;  // hole left before this entry's local header (sparse files)
};

// Writes a stored zip as torch does (zip64 end records), with zip64 extras in the central
// directory for offsets or sizes past 32 bits.
inline void write_zip(const std::filesystem::path& path, const std::vector<ZipEntry>& entries) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  uint64_t at = 0;
  auto put = [&](const std::string& s) {
    if (::pwrite(fd, s.data(), s.size(), static_cast<off_t>(at)) != static_cast<ssize_t>(s.size()))
      throw std::runtime_error("pwrite");
    at += s.size();
  };
  std::string cd;
  for (const ZipEntry& e : entries) {
    at += e.skip;
    const uint64_t header = at;
    put("PK\x03\x04" + u16(0) + u16(0x0808) + u16(0) + u32(0) + u32(0) + u32(0) + u32(0) +
        u16(e.name.size()) + u16(0) + e.name);
    put(e.data);
    std::string extra;
    const bool big = header >= 0xFFFFFFFF;
    if (big) extra = u16(1) + u16(8) + u64(header);
    cd += "PK\x01\x02" + u16(0) + u16(0) + u16(0x0808) + u16(0) + u32(0) + u32(0) +
          u32(e.data.size()) + u32(e.data.size()) + u16(e.name.size()) + u16(extra.size()) +
          u16(0) + u16(0) + u16(0) + u32(0) + u32(big ? 0xFFFFFFFF : header) + e.name + extra;
  }
  const uint64_t cd_at = at;
  put(cd);
  const uint64_t z = at;
  put("PK\x06\x06" + u64(44) + u16(0x031E) + u16(0x2D) + u32(0) + u32(0) + u64(entries.size()) +
      u64(entries.size()) + u64(cd.size()) + u64(cd_at));
  put("PK\x06\x07" + u32(0) + u64(z) + u32(1));
  put("PK\x05\x06" + u16(0) + u16(0) + u16(entries.size()) + u16(entries.size()) + u32(cd.size()) +
      u32(cd_at >= 0xFFFFFFFF ? 0xFFFFFFFF : cd_at) + u16(0));
  ::close(fd);
}

// Pickle pieces (protocol 2). Built by appending: GCC 12 takes `"literal" + std::string` for
// possibly overlapping copies (-Wrestrict, a false positive).
inline std::string str(std::string_view s) {
  std::string out = "X";
  out += u32(s.size());
  out += s;
  return out;
}
inline std::string global(std::string_view module, std::string_view name) {
  std::string out = "c";
  out += module;
  out += '\n';
  out += name;
  out += '\n';
  return out;
}
inline std::string int1(int v) {
  std::string out = "K";
  out += static_cast<char>(v);
  return out;
}
inline std::string ints_tuple(const std::vector<int>& v) {
  std::string s = "(";
  for (int x : v) {
    s += 'J';
    s += u32(static_cast<uint32_t>(x));
  }
  return s + "t";
}
// _rebuild_tensor_v2(storage(key, FloatStorage, numel), offset, size, stride, False, OrderedDict())
inline std::string tensor(std::string_view key, int64_t numel, int offset,
                          const std::vector<int>& size, const std::vector<int>& stride,
                          std::string_view storage_class = "FloatStorage") {
  return global("torch._utils", "_rebuild_tensor_v2") + "((" + str("storage") +
         global("torch", storage_class) + str(key) + str("cpu") + "\x8A\x08" +
         u64(static_cast<uint64_t>(numel)) + "tQ" + "J" + u32(static_cast<uint32_t>(offset)) +
         ints_tuple(size) + ints_tuple(stride) + "\x89" + global("collections", "OrderedDict") +
         ")RtR";
}
// A dict {name: value_pickle, ...} as a whole protocol-2 pickle.
inline std::string dict_pickle(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = "\x80\x02}(";
  for (const auto& [k, v] : items) s += str(k) + v;
  return s + "u.";
}

// A torch.save file in folder "archive" with data.pkl, the given storages and version 3.
inline void write_torch(const std::filesystem::path& path, const std::string& pickle,
                        const std::vector<std::pair<std::string, std::string>>& storages = {}) {
  std::vector<ZipEntry> e{{"archive/data.pkl", pickle}};
  for (const auto& [key, bytes] : storages) e.push_back({"archive/data/" + key, bytes});
  e.push_back({"archive/version", "3\n"});
  write_zip(path, e);
}

}  // namespace ckptfs::torchtest
