#include "ckptfs/crypt/decrypted_stream.h"

#include <openssl/crypto.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <new>
#include <utility>

#include "ckptfs/crypt/block_cipher.h"
#include "ckptfs/error.h"
#include "ckptfs/util/anonymous_mapping.h"

namespace ckptfs::crypt {

// One cached page: an anonymous mapping left out of core dumps, wiped before it is unmapped.
struct DecryptedStream::Slot {
  explicit Slot(size_t capacity) : bytes(capacity) {
    // Best effort: a kernel without it still works.
    ::madvise(bytes.data(), bytes.size(), MADV_DONTDUMP);
  }
  ~Slot() { OPENSSL_cleanse(bytes.data(), bytes.size()); }  // before `bytes` unmaps them
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  AnonymousMapping bytes;
  std::optional<std::pair<uint64_t, uint32_t>> page;  // (block, page in it); none: empty
  size_t length = 0;                                  // plaintext bytes held
  uint64_t used = 0;  // the tick of the last read (least recently used goes first)
};

// The pages of every stream in the process, charged to one bound. `mutex` guards all but
// `clock` and `waiting`; under it a stream's mutex is only try-locked.
struct DecryptedStream::Budget {
  std::mutex mutex;
  std::condition_variable freed;  // a read ended, or pages were given back
  uint64_t max = kDefaultDecryptBudget;
  uint64_t held = 0;
  std::vector<DecryptedStream*> members;  // the streams alive
  std::atomic<uint64_t> clock{0};
  std::atomic<unsigned> waiting{0};

  static Budget& get() {
    static Budget budget;
    return budget;
  }
};

void set_decrypt_budget(uint64_t max_bytes) {
  DecryptedStream::Budget& b = DecryptedStream::Budget::get();
  {
    std::lock_guard lock(b.mutex);
    b.max = max_bytes;
  }
  b.freed.notify_all();
}

uint64_t decrypt_budget_held() {
  DecryptedStream::Budget& b = DecryptedStream::Budget::get();
  std::lock_guard lock(b.mutex);
  return b.held;
}

DecryptedStream::DecryptedStream(ReadExact read, uint64_t file_size, std::string name, Key key,
                                 StreamOptions options)
    : source_(std::move(read)), name_(std::move(name)), key_(std::move(key)) {
  framing_ = parse_framing(source_, file_size, name_);
  if (options.mode && *options.mode != framing_.mode)
    fail("{}: byte offset 0: the file is encrypted with {}, the key was given for {}", name_,
         mode_name(framing_.mode), mode_name(*options.mode));
  check_key_for_mode(framing_.mode, key_, name_);
  const uint64_t last = framing_.block_count - 1;
  full_plain_length_ = framing_.full_cipher_length;
  last_plain_length_ = framing_.last_cipher_length;
  if (framing_.mode != Mode::kAesGcm) {
    if (last > 0) full_plain_length_ -= cbc_padding(source_, framing_, key_, 0, name_);
    last_plain_length_ -= cbc_padding(source_, framing_, key_, last, name_);
  }
  plain_size_ = last * full_plain_length_ + last_plain_length_;
  // CBC decrypts any 16-byte-aligned part of a block alone, so its cache holds pages, not whole
  // 64 MiB blocks: a read costs about its own length, which matters at SM4's ~90 MB/s.
  page_length_ =
      framing_.mode == Mode::kAesGcm
          ? framing_.full_cipher_length
          : std::min(std::max(options.cbc_page_length / 16 * 16, 16u), framing_.full_cipher_length);
  max_slots_ = std::max<size_t>(options.cache_pages, 1);
  Budget& b = Budget::get();
  std::lock_guard lock(b.mutex);
  b.members.push_back(this);
}

DecryptedStream::~DecryptedStream() {
  Budget& b = Budget::get();
  {
    // Once out of the list no other stream can reach this one; its pages are freed below.
    std::lock_guard lock(b.mutex);
    std::erase(b.members, this);
    b.held -= charged_;
    charged_ = 0;
  }
  b.freed.notify_all();
}

uint64_t DecryptedStream::drop_pages() {
  slots_.clear();  // each Slot wipes and unmaps its page
  const uint64_t n = charged_;
  charged_ = 0;
  return n;
}

bool DecryptedStream::charge_page(bool wait) {
  Budget& b = Budget::get();
  std::unique_lock lock(b.mutex);
  for (;;) {
    if (b.held == 0 || b.held + page_length_ <= b.max) {
      b.held += page_length_;
      charged_ += page_length_;
      return true;
    }
    if (!wait) return false;
    // Take back every page of the stream read least recently whose reads are not under way.
    std::vector<DecryptedStream*> others;
    for (DecryptedStream* s : b.members)
      if (s != this && s->charged_ > 0) others.push_back(s);
    std::sort(others.begin(), others.end(), [](const DecryptedStream* x, const DecryptedStream* y) {
      return x->last_read_.load(std::memory_order_relaxed) <
             y->last_read_.load(std::memory_order_relaxed);
    });
    bool took = false;
    for (DecryptedStream* s : others) {
      std::unique_lock other(s->mutex_, std::try_to_lock);
      if (!other.owns_lock()) continue;
      b.held -= s->drop_pages();
      took = true;
      break;
    }
    if (took) continue;
    // Every page is in a read under way, and a stream reading reuses its own pages: one ends
    // soon and its pages can then be taken back.
    ++b.waiting;
    b.freed.wait_for(lock, std::chrono::milliseconds(10));
    --b.waiting;
  }
}

uint32_t DecryptedStream::plain_length(uint64_t index) const {
  return index + 1 == framing_.block_count ? last_plain_length_ : full_plain_length_;
}

namespace {

// The IVs of at most this many blocks are compared (24 bytes each): MindSpore's 64 MiB blocks
// reach it at 64 TiB, and a hostile file of tiny blocks cannot make the check grow past 24 MiB.
constexpr uint64_t kMaxComparedIvs = uint64_t{1} << 20;

// Refuses a file two of whose blocks have the same nonce: MindSpore draws a fresh random IV for
// every block, so that is a block copied over another, which every tag would pass (nothing binds
// a block to its place). AES-GCM's nonce is the IV's first 12 bytes (the other 4 are unused, so
// not compared: changing them does not hide a copy); CBC uses all 16.
void refuse_repeated_ivs(const ReadExact& read, const Framing& framing, const std::string& name) {
  const size_t used = framing.mode == Mode::kAesGcm ? kGcmNonceLength : kIvLength;
  std::vector<std::pair<std::array<uint8_t, kIvLength>, uint64_t>> ivs;
  const uint64_t n = std::min(framing.block_count, kMaxComparedIvs);
  ivs.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::array<uint8_t, kIvLength> iv = read_block_header(read, framing, framing.block(i), name).iv;
    std::fill(iv.begin() + static_cast<std::ptrdiff_t>(used), iv.end(), uint8_t{0});
    ivs.emplace_back(iv, i);
  }
  std::sort(ivs.begin(), ivs.end());
  for (size_t k = 1; k < ivs.size(); ++k)
    if (ivs[k].first == ivs[k - 1].first)
      fail(
          "{}: block {} at byte offset {}: its IV repeats block {}'s; MindSpore draws a new "
          "random IV for every block, so a block was copied over another: damaged or tampered "
          "file",
          name, ivs[k].second, framing.block(ivs[k].second).header_offset, ivs[k - 1].second);
}

}  // namespace

void DecryptedStream::verify() const {
  refuse_repeated_ivs(source_, framing_, name_);
  for (uint64_t i = 0; i < framing_.block_count; ++i) {
    if (framing_.mode == Mode::kAesGcm) {
      verify_block(source_, framing_, key_, i, name_);
      continue;
    }
    // A CBC block whose padding differs from the geometry learnt at open would fail at read time.
    const BlockPlace place = framing_.block(i);
    const uint32_t length = place.cipher_length - cbc_padding(source_, framing_, key_, i, name_);
    if (length != plain_length(i)) refuse_length(place, length);
  }
}

void DecryptedStream::refuse_length(const BlockPlace& place, size_t length) const {
  fail(
      "{}: block {} at byte offset {}: decrypts to {} bytes, {} expected from the padding seen "
      "when the file was opened (damaged file?)",
      name_, place.index, place.header_offset, length, plain_length(place.index));
}

DecryptedStream::Slot& DecryptedStream::slot_for(uint64_t index, uint32_t page) {
  ++tick_;
  const std::pair<uint64_t, uint32_t> wanted{index, page};
  for (const auto& slot : slots_)
    if (slot->page == wanted) {
      slot->used = tick_;
      return *slot;
    }
  Slot* slot = nullptr;
  // A stream holding no page waits for the budget; one holding a page adds another only if
  // the budget has room, and otherwise reuses its least recently read page.
  if (slots_.size() < max_slots_ && charge_page(slots_.empty())) {
    try {
      slots_.push_back(std::make_unique<Slot>(page_length_));
    } catch (...) {
      Budget& b = Budget::get();
      std::lock_guard lock(b.mutex);
      b.held -= page_length_;
      charged_ -= page_length_;
      throw;
    }
    slot = slots_.back().get();
  } else {
    slot = std::min_element(slots_.begin(), slots_.end(), [](const auto& a, const auto& b) {
             return a->used < b->used;
           })->get();
  }
  slot->page.reset();  // the decryption functions wipe what they wrote if they throw
  const BlockPlace place = framing_.block(index);
  size_t length = 0;
  if (framing_.mode == Mode::kAesGcm) {
    length = decrypt_block(source_, framing_, key_, index,
                           std::span(slot->bytes.data(), slot->bytes.size()), name_);
    if (length != plain_length(index)) refuse_length(place, length);
  } else {
    const uint32_t from = page * page_length_;
    const uint32_t n = std::min(page_length_, place.cipher_length - from);
    length = decrypt_cbc_range(source_, framing_, key_, index, from,
                               std::span(slot->bytes.data(), n), name_);
    if (from + n == place.cipher_length && from + length != plain_length(index)) {
      OPENSSL_cleanse(slot->bytes.data(), n);
      refuse_length(place, from + length);
    }
  }
  slot->page = wanted;
  slot->length = length;
  slot->used = tick_;
  return *slot;
}

void DecryptedStream::read(uint64_t offset, std::span<uint8_t> out) {
  if (offset > plain_size_ || out.size() > plain_size_ - offset)
    fail("{}: decrypted byte offset {}: reading {} bytes past the end of the {}-byte plaintext",
         name_, offset, out.size(), plain_size_);
  Budget& b = Budget::get();
  last_read_.store(++b.clock, std::memory_order_relaxed);
  struct Ended {  // wakes the streams waiting for pages once this read lets its own go
    Budget& b;
    ~Ended() {
      if (b.waiting.load() > 0) b.freed.notify_all();
    }
  } ended{b};
  std::lock_guard lock(mutex_);
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t at = offset + done;
    const uint64_t index =
        full_plain_length_ == 0 ? 0 : std::min(at / full_plain_length_, framing_.block_count - 1);
    const uint64_t in_block = at - plain_offset(index);
    const auto page = static_cast<uint32_t>(in_block / page_length_);
    const Slot& slot = slot_for(index, page);
    const uint64_t within = in_block - uint64_t{page} * page_length_;
    const size_t n = std::min<uint64_t>(out.size() - done, slot.length - within);
    std::memcpy(out.data() + done, slot.bytes.data() + within, n);
    done += n;
  }
}

ReadExact DecryptedStream::reader() {
  return [this](uint64_t offset, std::span<uint8_t> out) { read(offset, out); };
}

}  // namespace ckptfs::crypt
