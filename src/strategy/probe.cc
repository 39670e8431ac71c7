#include "ckptfs/strategy/probe.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "strategy.pb.h"

namespace ckptfs::strategy {

bool looks_like_strategy(const std::filesystem::path& path) noexcept {
  try {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return false;
    std::ifstream in(path, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) return false;
    if (path.extension() == ".json") {
      const nlohmann::json doc = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
      if (!doc.is_object()) return false;
      const auto items = doc.find("parallel_layout_item");
      return items != doc.end() && items->is_object() && !items->empty();
    }
    mindspore::straspb::ParallelStrategyMap map;
    return map.ParsePartialFromString(bytes) && map.IsInitialized() &&
           map.parallel_layout_item_size() > 0;
  } catch (...) {
    return false;  // out of memory reading it: not worth a hint
  }
}

}  // namespace ckptfs::strategy
