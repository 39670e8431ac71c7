#include "read_mode.h"

namespace ckptfs::fs {

ReadMode choose_read_mode(const ReadModeInputs& in) {
  switch (in.policy) {
    case ReadModeInputs::Policy::kNever:
      return ReadMode::kGather;
    case ReadModeInputs::Policy::kAlways:
      return ReadMode::kSplice;
    case ReadModeInputs::Policy::kAuto:
      break;
  }
  // Another reader's READ served now, or a moment ago: the CPUs are busy with readers, and one
  // copy per byte beats two. A lone reader's READs come one at a time: gathering ahead wins.
  const bool busy = in.other_reader_now || in.since_other_reader_us < kOverlapWindowUs;
  return busy ? ReadMode::kSplice : ReadMode::kGather;
}

}  // namespace ckptfs::fs
