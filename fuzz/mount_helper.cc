// mount(8)'s helper call turned into a ckptfs command line (src/cli/mount_helper.cc): the
// arguments and -o lists come from fstab lines and mount commands, so from anyone who can write
// one. Input: the arguments after argv[0], one per line; a single line is an -o list for
// "SRC MNT". Checked: the result is a `ckptfs [--log-level L] mount SRC MNT ...` line whose -o
// values are single non-empty options, and every own flag has its value.
#include "mount_helper.h"

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/error.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> lines = ckptfs::fuzz::lines_of(data, size);
  std::vector<std::string> in = {"mount.fuse.ckptfs"};
  if (lines.size() == 1)
    in.insert(in.end(), {"SRC", "MNT", "-o", std::string(lines[0])});
  else
    in.insert(in.end(), lines.begin(), lines.end());
  bool fake = false;
  std::vector<std::string> out;
  try {
    out = ckptfs::cli::mount_helper_args(in, fake);
  } catch (const ckptfs::Error&) {
    return 0;
  }
  size_t at = 1;
  if (out.size() > at && out[at] == "--log-level") at += 2;
  // argv[0] kept, then "mount SRC MNT".
  if (out.empty() || out[0] != in[0] || out.size() < at + 3 || out[at] != "mount") std::abort();
  for (size_t i = at + 3; i < out.size(); i += 2) {
    const std::string& flag = out[i];
    if (i + 1 >= out.size()) std::abort();  // a flag without its value
    if (flag == "-o") {
      const std::string& o = out[i + 1];
      if (o.empty() || o.find(',') != std::string::npos) std::abort();
    } else if (!flag.starts_with("--")) {
      std::abort();
    }
  }
  return 0;
}
