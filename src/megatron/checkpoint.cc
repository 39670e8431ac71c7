// Megatron-Core torch_dist directories: finding the iteration, stacked layers, integrity.json
// (megatron/megatron.h).
#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>

#include "ckptfs/error.h"
#include "ckptfs/megatron/megatron.h"
#include "ckptfs/util/decimal.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"

namespace ckptfs::megatron {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxSmallFile = uint64_t{64} << 20;  // metadata.json, the tracker, integrity

std::string read_small(const fs::path& path, std::string_view what) {
  std::error_code ec;
  if (const uintmax_t size = fs::file_size(path, ec); !ec && size > kMaxSmallFile)
    fail("{}: {} bytes, more than the limit of {} for a {}", path.string(), size, kMaxSmallFile,
         what);
  return util::read_regular(path, what);
}

// metadata.json's sharded_backend, or nullopt if the file is absent or not Megatron's (a
// MindFormers iteration's metadata.json has the same name).
std::optional<std::string> backend(const fs::path& dir) {
  const fs::path path = dir / kConfigName;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  const json doc = json::parse(read_small(path, "Megatron metadata.json"), nullptr, false);
  if (!doc.is_object() || !doc.contains("sharded_backend")) return std::nullopt;
  if (!doc["sharded_backend"].is_string())
    fail("{}: sharded_backend is not a string", path.string());
  return doc["sharded_backend"].get<std::string>();
}

// An iteration directory checked: backend torch_dist, and DCP's .metadata present.
fs::path checked_iteration(const fs::path& dir) {
  const std::optional<std::string> b = backend(dir);
  if (!b)
    fail(
        "{}: no {} with a sharded_backend there (the iteration was not saved, or not "
        "completely)",
        dir.string(), kConfigName);
  if (*b != "torch_dist")
    fail(
        "{}: sharded_backend {}: ckptfs reads Megatron-Core's torch_dist checkpoints only (save "
        "with --ckpt-format torch_dist)",
        (dir / kConfigName).string(), file_text(*b));
  if (!dcp::is_dcp_dir(dir))
    fail("{}: a torch_dist checkpoint without {} (the save did not finish)", dir.string(),
         dcp::kMetadataName);
  return dir;
}

bool is_iteration_name(const std::string& name) {
  if (name == "release") return true;
  return name.size() >= 12 && name.starts_with("iter_") &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool holds_iterations(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_iteration_name(it->path().filename().string()) && backend(it->path())) return true;
  return false;
}

std::string hex(const unsigned char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

std::string sha256_file(const fs::path& path) {
  const UniqueFd fd = util::open_regular(path, "checkpoint file");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    fail("{}: cannot start a SHA-256 digest", path.string());
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("{}: read failed: {}", path.string(), std::strerror(errno));
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return hex(md, len);
}

}  // namespace

std::optional<fs::path> find_iteration(const fs::path& dir, const std::string& step) {
  if (backend(dir)) {
    if (step != "latest")
      fail("{}: an iteration directory is one checkpoint; give its parent with --step {}",
           dir.string(), step);
    return checked_iteration(dir);
  }
  if (!holds_iterations(dir)) return std::nullopt;
  const fs::path tracker = dir / kTrackerName;
  std::string name;
  if (step == "latest") {
    std::error_code ec;
    if (!fs::exists(tracker, ec))
      fail("{}: no {} to say which iteration is the latest; give --step ITERATION", dir.string(),
           kTrackerName);
    const std::string text = read_small(tracker, "Megatron tracker file");
    if (const std::optional<uint64_t> n = util::parse_decimal(text))
      name = fmt::format("iter_{:07d}", *n);
    else if (text.find_first_not_of(" \t\r\n") != std::string::npos &&
             text.substr(text.find_first_not_of(" \t\r\n"), 7) == "release")
      name = "release";
    else
      fail("{}: expected a decimal iteration number or release; give --step ITERATION",
           tracker.string());
  } else if (const std::optional<uint64_t> n = util::parse_decimal(step)) {
    name = fmt::format("iter_{:07d}", *n);
  } else {
    fail("--step {}: a Megatron-Core checkpoint ({}) takes latest or an iteration number", step,
         dir.string());
  }
  return checked_iteration(dir / name);
}

bool is_optimizer(std::string_view fqn) { return fqn.starts_with(kOptimizerPrefix); }

std::optional<std::string> layer_name(std::string_view fqn, int64_t i) {
  for (size_t at = 0; (at = fqn.find("layers.", at)) != std::string_view::npos; at += 7) {
    if (at != 0 && fqn[at - 1] != '.') continue;
    const size_t next = at + 7;
    if (next >= fqn.size() || (fqn[next] >= '0' && fqn[next] <= '9')) return std::nullopt;
    return fmt::format("{}{}.{}", fqn.substr(0, next), i, fqn.substr(next));
  }
  return std::nullopt;
}

void unstack_layers(dcp::Metadata& md, std::vector<index::IndexedSource>& files) {
  std::map<std::string, const dcp::Tensor*> stacked;
  std::vector<dcp::Tensor> tensors;
  for (const dcp::Tensor& t : md.tensors) {
    if (t.shape.empty() || !layer_name(t.fqn, 0)) {
      tensors.push_back(t);
      continue;
    }
    stacked[t.fqn] = &t;
    const std::vector<int64_t> rest(t.shape.begin() + 1, t.shape.end());
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      dcp::Tensor& layer = tensors.emplace_back();
      layer.fqn = *layer_name(t.fqn, i);
      layer.code = t.code;
      layer.element_size = t.element_size;
      layer.shape = rest;
      for (const dcp::Chunk& c : t.chunks)
        if (c.offsets[0] <= i && i < c.offsets[0] + c.sizes[0])
          layer.chunks.push_back({{c.offsets.begin() + 1, c.offsets.end()},
                                  {c.sizes.begin() + 1, c.sizes.end()},
                                  c.storage});
    }
  }
  // Each stored chunk [n, ...] at layer a: n chunks, layer a + j's starting j strides in.
  for (index::IndexedSource& f : files) {
    json tree = json::parse(f.scan.tree, nullptr, false);
    if (!tree.is_object() || !tree.contains("chunks") || !tree["chunks"].is_array() ||
        tree["chunks"].size() != f.scan.params.size())
      fail("{}: its scan does not list its chunks; remove the index cache entry and mount again",
           f.file.path.string());
    std::vector<scan::Param> params;
    json chunks = json::array();
    for (size_t k = 0; k < f.scan.params.size(); ++k) {
      const scan::Param& p = f.scan.params[k];
      const json& c = tree["chunks"][k];
      const auto it = stacked.find(p.name);
      if (it == stacked.end() || p.shape.empty() || !p.view || !c.contains("offsets") ||
          c["offsets"].size() != p.shape.size()) {
        params.push_back(p);
        chunks.push_back(c);
        continue;
      }
      const auto offsets = c["offsets"].get<std::vector<int64_t>>();
      const std::vector<int64_t>& shape = it->second->shape;
      for (int64_t j = 0; j < p.shape[0]; ++j) {
        scan::Param layer = p;
        layer.name = *layer_name(p.name, offsets[0] + j);
        layer.shape.erase(layer.shape.begin());
        layer.strides.erase(layer.strides.begin());
        layer.storage_offset = p.storage_offset + static_cast<uint64_t>(j * p.strides[0]);
        params.push_back(std::move(layer));
        chunks.push_back({{"fqn", params.back().name},
                          {"offsets", std::vector<int64_t>(offsets.begin() + 1, offsets.end())},
                          {"shape", std::vector<int64_t>(shape.begin() + 1, shape.end())}});
      }
    }
    f.scan.params = std::move(params);
    tree["chunks"] = std::move(chunks);
    f.scan.tree = tree.dump();
  }
  md.tensors = std::move(tensors);
}

std::optional<std::vector<std::string>> check_integrity(const fs::path& dir) {
  const fs::path path = dir / kIntegrityName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const json doc = json::parse(read_small(path, "Megatron integrity manifest"), nullptr, false);
  if (!doc.is_object() || !doc.contains("files") || !doc["files"].is_object())
    fail(
        "{}: not an integrity manifest: expected {{\"algorithm\": \"sha256\", \"files\": {{name: "
        "digest}}}}",
        path.string());
  const std::string algorithm = doc.value("algorithm", std::string("sha256"));
  if (algorithm != "sha256")
    fail("{}: algorithm {}: ckptfs checks sha256 manifests only", path.string(),
         file_text(algorithm));
  std::vector<std::string> bad;
  for (const auto& [name, digest] : doc["files"].items()) {
    if (!digest.is_string() || name.empty() || name.find('/') != std::string::npos || name == "." ||
        name == "..")
      fail("{}: entry {} is not a file name with a hex digest", path.string(), file_text(name));
    const fs::path file = dir / name;
    if (!fs::is_regular_file(file, ec)) {
      bad.push_back(fmt::format("{}: missing ({} lists it)", file.string(), kIntegrityName));
      continue;
    }
    std::string want = digest.get<std::string>();
    std::transform(want.begin(), want.end(), want.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (const std::string got = sha256_file(file); got != want)
      bad.push_back(fmt::format("{}: SHA-256 {} where {} records {}", file.string(), got,
                                kIntegrityName, want));
  }
  return bad;
}

}  // namespace ckptfs::megatron
