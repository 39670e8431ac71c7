// The plaintext of an encrypted MindSpore checkpoint as a byte stream that decrypts only what a
// read touches, keeping the last few pieces in a small cache: whole blocks in AES-GCM (the tag
// covers the block, and every read checks it), 1 MiB pages in the CBC modes (a CBC range
// decrypts alone). The plaintext is exactly the
// bytes MindSpore would have written unencrypted, so ckpt::scan_checkpoint_bytes runs on
// reader() unchanged.
//
// Memory: at most `cache_pages` buffers of one page per stream: in AES-GCM a block's ciphertext
// length (MindSpore's blocks are 64 MiB), in CBC 1 MiB; mapped with MADV_DONTDUMP so that no core
// dump holds plaintext, and wiped (OPENSSL_cleanse) on destruction, as is the key. And the pages
// of all streams of the process together stay within one budget (set_decrypt_budget, 256 MiB by
// default): a stream that holds no page and finds the budget spent takes back every page of the
// stream read least recently that is not being read, or waits for a read to end; a stream that
// holds a page reuses its own. One page may always be held, so a budget below one page means one
// page at a time. Many open sources thus cost at most the budget, not their number of pages.
//
// Thread-safety: read() and reader()'s function may be called from many threads at once; one
// mutex guards the cache and is held while a missing page is decrypted (concurrent reads of one
// file are served one decryption at a time). verify() takes no lock and may run
// concurrently with reads. `read` (the source file's bytes) must be safe to call concurrently.
// The budget's lock is taken under a stream's mutex; under it another stream's mutex is only
// ever try-locked (to take its pages back), so no two streams wait for each other.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/crypt/framing.h"
#include "ckptfs/crypt/key.h"
#include "ckptfs/util/pread.h"

namespace ckptfs::crypt {

struct StreamOptions {
  std::optional<Mode> mode;  // the mode the user named; none: whatever the file's magic says
  size_t cache_pages = 4;    // at least 1
  // CBC's page (rounded down to a multiple of 16, at least 16); tests make it small.
  uint32_t cbc_page_length = 1u << 20;
};

// The bytes all streams' decrypted pages may hold together (-o decrypt_max); takes effect for
// the pages taken from then on. Thread-safe.
void set_decrypt_budget(uint64_t max_bytes);
inline constexpr uint64_t kDefaultDecryptBudget = uint64_t{256} << 20;
// The bytes charged to the budget now (tests).
uint64_t decrypt_budget_held();

class DecryptedStream {
 public:
  // Parses the framing (parse_framing's refusals), checks the key's length for the file's mode
  // and, for CBC, learns the plaintext lengths from the padding of the first and last blocks
  // (a wrong key is refused there nearly always). Throws Error naming `name` and the offset.
  DecryptedStream(ReadExact read, uint64_t file_size, std::string name, Key key,
                  StreamOptions options = {});
  ~DecryptedStream();
  DecryptedStream(const DecryptedStream&) = delete;
  DecryptedStream& operator=(const DecryptedStream&) = delete;

  const Framing& framing() const { return framing_; }
  uint64_t size() const { return plain_size_; }  // plaintext bytes
  // Where block `index`'s plaintext starts in the stream, and how long it is.
  uint64_t plain_offset(uint64_t index) const { return index * full_plain_length_; }
  uint32_t plain_length(uint64_t index) const;

  // Checks every block (AES-GCM: its tag, through a 1 MiB buffer; CBC: its padding, and that
  // it gives the plaintext length the first block's padding promised) without keeping
  // plaintext: a wrong key or a tampered AES-GCM block is refused here, at index time.
  void verify() const;

  // Exactly out.size() plaintext bytes at `offset`, or Error naming the file (past the end, a
  // block that no longer decrypts: wrong key or damaged file).
  void read(uint64_t offset, std::span<uint8_t> out);
  // read() as a ReadExact; valid while this stream lives.
  ReadExact reader();

  struct Budget;  // the process's one page budget (decrypted_stream.cc)

 private:
  struct Slot;
  Slot& slot_for(uint64_t index, uint32_t page);  // with mutex_ held
  // With mutex_ held: charges one page to the budget. `wait`: until it fits (taking back other
  // streams' pages); else only if it fits now.
  bool charge_page(bool wait);
  // With the budget's lock and mutex_ held: frees every page, returns the bytes they were charged.
  uint64_t drop_pages();
  [[noreturn]] void refuse_length(const BlockPlace& place, size_t length) const;

  ReadExact source_;
  std::string name_;
  Key key_;
  Framing framing_;
  uint32_t full_plain_length_ = 0;
  uint32_t last_plain_length_ = 0;
  uint64_t plain_size_ = 0;
  uint32_t page_length_ = 0;  // the cache's unit, within a block
  std::mutex mutex_;
  size_t max_slots_ = 1;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t tick_ = 0;
  uint64_t charged_ = 0;  // guarded by the budget's lock: the bytes charged for slots_
  std::atomic<uint64_t> last_read_{0};  // the budget's clock at this stream's last read
};

}  // namespace ckptfs::crypt
