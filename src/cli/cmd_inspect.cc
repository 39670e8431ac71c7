// `ckptfs inspect FILE [--json] [--verify-crc]`: the parameters of one .ckpt file as the scanner
// sees them, or the tensors and metadata of a .safetensors file, with the file offsets of their
// content. Nothing but headers is read (unless the CRC is verified), so it answers at once even
// for very large files.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckptfs/ckpt/scanner.h"
#include "ckptfs/crypt/session_key.h"
#include "ckptfs/error.h"
#include "ckptfs/remote/objects.h"
#include "ckptfs/safetensors/scanner.h"
#include "ckptfs/strategy/probe.h"
#include "ckptfs/torchzip/torch_file.h"
#include "ckptfs/util/fd.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/out_of_memory.h"
#include "ckptfs/util/printable.h"
#include "ckptfs/util/shape_text.h"
#include "ckptfs/view/families.h"
#include "ckptfs/view/view.h"
#include "commands.h"
#include "s3_source.h"

namespace ckptfs::cli {

namespace {

struct InspectOptions {
  std::string file;
  std::string name;  // in messages: an S3 object's URL (never its placeholder's path), else file
  bool json = false;
  bool verify_crc = false;
  std::string dec_key_file;
  std::string dec_key_env;
};

const char* kind_name(scan::EntryKind kind) {
  switch (kind) {
    case scan::EntryKind::Tensor:
      return "tensor";
    case scan::EntryKind::String:
      return "string";
    case scan::EntryKind::MapTensor:
      return "maptensor";
    case scan::EntryKind::Opaque:
      return "opaque";
  }
  return "unknown";
}

std::string extents_text(const scan::Extents& extents) {
  std::vector<std::string> parts;
  parts.reserve(extents.size());
  for (const scan::Extent& e : extents) parts.push_back(fmt::format("{}+{}", e.offset, e.length));
  return fmt::format("{}", fmt::join(parts, ","));
}

nlohmann::json extents_json(const scan::Extents& extents) {
  nlohmann::json out = nlohmann::json::array();
  for (const scan::Extent& e : extents) out.push_back({e.offset, e.length});
  return out;
}

// The text of dumping the whole array with indent 2, one element at a time: a JSON document of
// millions of parameters would take several times the scan's memory.
void print_json(const scan::FileScan& scan) {
  if (scan.params.empty()) {
    fmt::print("[]\n");
    return;
  }
  fmt::print("[\n");
  for (size_t i = 0; i < scan.params.size(); ++i) {
    const scan::Param& p = scan.params[i];
    const nlohmann::json item = {
        {"name", p.name},
        {"dtype", p.dtype},
        {"shape", p.shape},
        {"nbytes", p.nbytes()},
        {"offsets", extents_json(p.content)},
        {"kind", kind_name(p.kind)},
        {"dims_zero", p.dims_zero},
        {"records", extents_json(p.records)},
    };
    std::string text = item.dump(2);  // strings are escaped: every '\n' ends a line
    for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 3))
      text.insert(at + 1, "  ");
    fmt::print("  {}{}\n", text, i + 1 < scan.params.size() ? "," : "");
  }
  fmt::print("]\n");
}

// Non-tensor values of a torch.save object, one "path = value" line per leaf, in order.
void print_values(const nlohmann::json& node, const std::string& path) {
  auto child = [&](const std::string& key) { return path.empty() ? key : path + "/" + key; };
  auto key_text = [](const nlohmann::json& key) {
    return key.is_string() ? key.get<std::string>() : key.dump();
  };
  if (node.is_object() && node.contains("$dict")) {
    for (const auto& pair : node["$dict"]) print_values(pair[1], child(key_text(pair[0])));
  } else if (node.is_array() || (node.is_object() && node.contains("$tuple"))) {
    const nlohmann::json& items = node.is_array() ? node : node["$tuple"];
    for (size_t i = 0; i < items.size(); ++i) print_values(items[i], child(std::to_string(i)));
  } else if (!(node.is_object() && node.contains("$tensor"))) {
    fmt::print("{} = {}\n", path.empty() ? "(object)" : printable(path), node.dump());
  }
}

// `format`: a torch.save file's, or a DCP data file's ("dcp": its chunks, and the tree
// locating them and its non-tensor items).
void print_torch(const scan::FileScan& scan, bool json, std::string_view format = "torch.save") {
  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const scan::Param& p : scan.params)
      tensors.push_back({{"name", p.name},
                         {"dtype", p.dtype},
                         {"shape", p.shape},
                         {"stride", p.strides},
                         {"storage_offset", p.storage_offset},
                         {"nbytes", p.nbytes()},
                         {"storage", extents_json(p.content)}});
    fmt::print("{}\n", nlohmann::json{{"format", format},
                                      {"tensors", tensors},
                                      {"object", nlohmann::json::parse(scan.tree)}}
                           .dump(2));
    return;
  }
  std::vector<std::vector<std::string>> rows{
      {"NAME", "DTYPE", "SHAPE", "STRIDE", "OFFSET", "BYTES", "STORAGE"}};
  uint64_t bytes = 0;
  for (const scan::Param& p : scan.params) {
    bytes += p.nbytes();
    rows.push_back({printable(p.name), printable(p.dtype), shape_text(p.shape),
                    fmt::format("[{}]", fmt::join(p.strides, ",")),
                    std::to_string(p.storage_offset), std::to_string(p.nbytes()),
                    extents_text(p.content)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows)
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:>{}}  {:>{}}  {}\n", r[0], width[0], r[1],
               width[1], r[2], width[2], r[3], width[3], r[4], width[4], r[5], width[5], r[6]);
  fmt::print("{} tensors, {} tensor bytes; file {} bytes ({})\n", scan.params.size(), bytes,
             scan.file_size, format);
  print_values(nlohmann::json::parse(scan.tree), "");
}

// One line of the table. Rows are formatted twice (for the column widths, then to print) rather
// than held: a file of millions of tiny records would need more for its rows than for its scan.
// Names and types are the file's bytes, escaped: a control character in them would act on the
// terminal (or start a line of its own).
struct TableRow {
  std::string name, dtype, shape, bytes, offsets;
};

TableRow table_row(const scan::Param& p) {
  // A map tensor has no single content range; its whole records are what gets copied.
  if (p.kind == scan::EntryKind::MapTensor)
    return {printable(p.name), "(maptensor)", "-", std::to_string(p.nbytes()),
            "records " + extents_text(p.records)};
  return {printable(p.name), printable(p.dtype), shape_text(p.shape), std::to_string(p.nbytes()),
          extents_text(p.content)};
}

void print_table(const scan::FileScan& scan, const InspectOptions& options) {
  const TableRow heading{"NAME", "DTYPE", "SHAPE", "BYTES", "OFFSETS"};
  size_t w_name = 0, w_dtype = 0, w_shape = 0, w_bytes = 0;
  auto widen = [&](const TableRow& r) {
    w_name = std::max(w_name, r.name.size());
    w_dtype = std::max(w_dtype, r.dtype.size());
    w_shape = std::max(w_shape, r.shape.size());
    w_bytes = std::max(w_bytes, r.bytes.size());
  };
  widen(heading);
  uint64_t content_bytes = 0;
  size_t records = 0;
  for (const scan::Param& p : scan.params) {
    content_bytes += p.nbytes();
    records += p.records.size();
    widen(table_row(p));
  }
  auto print = [&](const TableRow& r) {
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>{}}  {}\n", r.name, w_name, r.dtype, w_dtype, r.shape,
               w_shape, r.bytes, w_bytes, r.offsets);
  };
  print(heading);
  for (const scan::Param& p : scan.params) print(table_row(p));

  std::string crc = "no CRC trailer";
  if (scan.has_crc_trailer) crc = options.verify_crc ? "CRC verified" : "CRC trailer not verified";
  fmt::print("{} parameters in {} records, {} content bytes; file {} bytes, {}\n",
             scan.params.size(), records, content_bytes, scan.file_size, crc);
}

// Tensors in data-offset order (the file's own), with the dtype code as written.
void inspect_safetensors(const InspectOptions& options) {
  const UniqueFd fd = util::open_regular(options.file, "checkpoint file");
  const safetensors::Header h = safetensors::read_header(fd.get(), options.name);
  if (options.json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const safetensors::Tensor& t : h.tensors)
      tensors.push_back({{"name", t.name},
                         {"dtype", t.code},
                         {"int4", t.int4},
                         {"shape", t.shape},
                         {"nbytes", t.end - t.begin},
                         {"offset", h.data_start() + t.begin},
                         {"data_offsets", {t.begin, t.end}}});
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    for (const auto& [k, v] : h.metadata) metadata[k] = v;
    nlohmann::ordered_json out = {{"format", "safetensors"},
                                  {"file_size", h.file_size},
                                  {"header_bytes", h.header_bytes},
                                  {"metadata", metadata},
                                  {"tensors", tensors}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  std::vector<std::array<std::string, 5>> rows{{"NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"}};
  uint64_t content = 0;
  for (const safetensors::Tensor& t : h.tensors) {
    content += t.end - t.begin;
    rows.push_back({printable(t.name), t.int4 ? t.code + " (Int4)" : t.code, shape_text(t.shape),
                    std::to_string(t.end - t.begin), std::to_string(h.data_start() + t.begin)});
  }
  std::array<size_t, 4> w{};
  for (const auto& r : rows)
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  for (const auto& r : rows)
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>{}}  {}\n", r[0], w[0], r[1], w[1], r[2], w[2], r[3],
               w[3], r[4]);
  std::vector<std::string> meta;
  for (const auto& [k, v] : h.metadata)
    meta.push_back(fmt::format("{}={}", printable(k), printable(v)));
  fmt::print("{} tensors, {} data bytes; header {} bytes; file {} bytes; metadata: {}\n",
             h.tensors.size(), content, h.header_bytes, h.file_size,
             meta.empty() ? "none" : fmt::format("{}", fmt::join(meta, ", ")));
}

// A checkpoint the .ckpt reader refused may be a strategy file (protobuf too, and a common thing
// to pass here by mistake): said so instead of the parser's complaint.
scan::FileScan scan_ckpt(int fd, const InspectOptions& options) {
  if (!ckpt::opens_like_checkpoint(fd) && strategy::looks_like_strategy(options.file))
    fail("{}: a parallel strategy file, not a checkpoint; show it with: ckptfs strategy show {}",
         options.name, options.file);
  // An encrypted file with its key: verified and scanned through its decrypted stream, so the
  // offsets shown are plaintext offsets (the file MindSpore would have saved unencrypted).
  if (crypt::session_key() != nullptr) {
    std::array<char, scan::kHeadBytes> head{};
    const ssize_t got = remote::pread(fd, head.data(), head.size(), 0);
    if (got > 0 && ckpt::kEncryptedReader.claims(
                       options.name, std::string_view(head.data(), static_cast<size_t>(got))))
      return ckpt::kEncryptedReader.scan(fd, options.name,
                                         scan::ReadOptions{.verify_crc = options.verify_crc});
  }
  return ckpt::scan_checkpoint_fd(fd, options.name,
                                  ckpt::ScanOptions{.verify_crc = options.verify_crc});
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* command = app.add_subcommand(
      "inspect",
      "List the parameters of a MindSpore .ckpt file (name, dtype, shape, content bytes and the "
      "file offset+length of each content chunk), the tensors and metadata of a .safetensors "
      "file, or the tensors and values of a torch.save .pt file (name, dtype, shape, stride, "
      "storage offset, and its storage record). Fails on a malformed, truncated or encrypted "
      "file with the byte offset of the problem");
  command->add_option("FILE", options->file, "The checkpoint file")->required();
  add_s3_source(command, options->file);
  command->add_flag("--json", options->json,
                    "Print a JSON array of {name, dtype, shape, nbytes, offsets: [[offset, "
                    "length], ...], kind, dims_zero, records} instead of a table (for "
                    ".safetensors: {format, file_size, header_bytes, metadata, tensors: [{name, "
                    "dtype, int4, shape, nbytes, offset, data_offsets}]})");
  command->add_flag("--verify-crc", options->verify_crc,
                    "If the file ends with a CRC trailer, check it against the CRC-32 of the body "
                    "(reads the whole file)");
  command->add_option("--dec-key-file", options->dec_key_file,
                      "Key of an encrypted .ckpt file: a file of its raw bytes, mode 600 (the "
                      "offsets shown are then those of the decrypted bytes)");
  command->add_option("--dec-key-env", options->dec_key_env,
                      "Environment variable holding the key of an encrypted .ckpt file in hex");
  command->callback([options] {
    view::ViewArgs keys;
    keys.dec_key_file = options->dec_key_file;
    keys.dec_key_env = options->dec_key_env;
    view::load_key(keys);
    const remote::ObjectRef* object = remote::object_at(options->file);
    const bool staged = !s3_source_url().empty();
    options->name = object ? object->url() : staged ? s3_source_url() : options->file;
    if (staged && std::filesystem::is_directory(options->file))
      fail("{}: a prefix, not one object; inspect takes s3://BUCKET/KEY of one checkpoint file",
           options->name);
    // A file of millions of tiny records can need more memory than the process may have.
    naming_out_of_memory(options->name, "reading it", [&] {
      const UniqueFd fd = util::open_regular(options->file, "checkpoint file");
      const scan::FileReader& reader = view::reader_for_file(fd.get(), options->name);
      switch (reader.format) {
        case scan::SourceFormat::TorchZip:
          print_torch(torchzip::scan_torch_fd(fd.get(), options->name), options->json);
          return;
        case scan::SourceFormat::Safetensors:
          inspect_safetensors(*options);
          return;
        case scan::SourceFormat::Ckpt:
          break;
        default:  // a family's own format (DCP): its params are views into the file's records
          print_torch(reader.scan(fd.get(), options->name, {}), options->json,
                      scan::format_name(reader.format));
          return;
      }
      const scan::FileScan scan = scan_ckpt(fd.get(), *options);
      if (options->json)
        print_json(scan);
      else
        print_table(scan, *options);
    });
  });
}

}  // namespace ckptfs::cli
