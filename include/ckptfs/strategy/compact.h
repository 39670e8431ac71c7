// A parsed strategy's parameter layouts in a compact binary form, so that a shipped index can
// carry them and a mount decodes them instead of parsing the strategy files (a JSON strategy of
// 10^5 parameters is 25 MB and takes a second to parse; its compact form decodes in a few tens
// of milliseconds). Only what planning reads is kept: the origin, the device count, the stages
// and every parameter's layouts, not the operator strategy items. Pure functions, thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ckptfs/strategy/strategy.h"

namespace ckptfs::strategy {

std::string encode_compact(const Strategy& strategy);

// The strategy encode_compact was given (without its operators, with `origin` as given here);
// nullopt for bytes it did not write (damaged, truncated or of another version).
std::optional<Strategy> decode_compact(std::string_view bytes, std::string origin);

}  // namespace ckptfs::strategy
