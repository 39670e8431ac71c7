#include "tensor_shapes.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckptfs/error.h"
#include "ckptfs/util/json_int.h"
#include "ckptfs/util/open_path.h"
#include "ckptfs/util/quote.h"
#include "ckptfs/view/model_tensors.h"

namespace ckptfs::cli {

namespace {

namespace fs = std::filesystem;

// Only tensors of one dimension or more are laid out; a scalar or a string has nothing to
// split, and is copied whole to every rank as an entry no strategy names.
void add(TensorList& out, const std::string& name, const std::vector<int64_t>& shape,
         bool tensor = true) {
  if (!tensor || shape.empty()) {
    ++out.left_out;
    return;
  }
  out.tensors.push_back({name, shape});
}

// A JSON file {"name": [dim, ...], ...}, for models whose files ckptfs does not read.
TensorList from_json(const std::string& path) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(util::read_regular(path, "shapes file"));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a JSON shapes file: {}", path, json_error_text(e.what()));
  }
  if (!doc.is_object())
    fail("{}: expected a JSON object of tensor name -> shape, e.g. {{\"w\": [1024, 512]}}", path);
  TensorList out;
  out.what = fmt::format("{} ({} shapes)", path, doc.size());
  for (const auto& item : doc.items()) {
    // A named variable, not a structured binding: clang 14 cannot capture one in the lambda.
    const std::string& name = item.key();
    const std::vector<int64_t> dims = util::json_ints(
        item.value(), 0, std::numeric_limits<int64_t>::max(), [&](std::string_view why) {
          fail("{}: tensor {}: the shape {} (expected a list of sizes)", path, file_text(name),
               why);
        });
    add(out, name, dims);
  }
  return out;
}

bool is_json_name(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

}  // namespace

TensorList tensor_shapes(const std::string& src, const std::string& src_strategy,
                         const std::string& step, const std::string& rename, bool unstack_layers) {
  if (is_json_name(src)) {
    if (!src_strategy.empty())
      fail("{}: a shapes file gives global shapes already; omit --src-strategy", src);
    if (!rename.empty())
      fail("{}: a shapes file names the tensors as a strategy will; omit --rename", src);
    if (unstack_layers)
      fail("{}: a shapes file names the tensors as a strategy will; omit --unstack-layers", src);
    return from_json(src);
  }
  view::ViewArgs args;
  args.src_dir = src;
  args.src_strategy = src_strategy;
  args.step = step;
  args.rename = rename;
  args.unstack_layers = unstack_layers;
  args.quiet = true;
  family::ModelTensors model = view::model_tensors(args);
  TensorList out;
  out.what = std::move(model.what);
  for (family::ModelTensor& t : model.tensors) add(out, t.name, t.shape, t.tensor);
  return out;
}

}  // namespace ckptfs::cli
