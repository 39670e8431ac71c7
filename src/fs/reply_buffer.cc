#include "reply_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace ckptfs::fs::detail {

namespace {

constexpr size_t kPage = 2 * kHalfPage;

struct Page {
  char* base = nullptr;
  bool used[2] = {false, false};
  bool empty() const { return !used[0] && !used[1]; }
};

struct Pages {
  std::mutex mutex;
  std::vector<Page> list;
};
// Never destroyed: a buffer may be freed by a static destructor that runs after this one's.
Pages& state() {
  static Pages* pages = new Pages;
  return *pages;
}

// A 2 MiB region aligned to 2 MiB, so the kernel can back it with one huge page.
char* map_page() {
  void* raw =
      ::mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kPage - 1) & ~(kPage - 1);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  const uintptr_t end = begin + 2 * kPage;
  if (end > aligned + kPage)
    ::munmap(reinterpret_cast<void*>(aligned + kPage), end - aligned - kPage);
  // Without THP (or with it off) this fails harmlessly and the buffer uses small pages.
  ::madvise(reinterpret_cast<void*>(aligned), kPage, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(aligned);
}

}  // namespace

void* take_half_page() {
  auto& [mutex, pages] = state();
  std::lock_guard lock(mutex);
  // Prefer a page with its other half in use, so that free halves pair up into whole pages.
  Page* pick = nullptr;
  for (Page& page : pages) {
    if (page.used[0] && page.used[1]) continue;
    if (pick == nullptr || (pick->empty() && !page.empty())) pick = &page;
  }
  if (pick == nullptr) {
    char* base = map_page();
    if (base == nullptr) return nullptr;
    pick = &pages.emplace_back(Page{base});
  }
  const int half = pick->used[0] ? 1 : 0;
  pick->used[half] = true;
  return pick->base + half * kHalfPage;
}

void give_half_page(void* p) {
  auto& [mutex, pages] = state();
  std::lock_guard lock(mutex);
  char* base = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) & ~(kPage - 1));
  auto it =
      std::find_if(pages.begin(), pages.end(), [&](const Page& page) { return page.base == base; });
  if (it == pages.end()) return;
  it->used[static_cast<char*>(p) == base ? 0 : 1] = false;
  if (!it->empty()) return;
  // Keep a few empty pages for the next buffers; return any other.
  const auto empty =
      std::count_if(pages.begin(), pages.end(), [](const Page& page) { return page.empty(); });
  if (empty <= static_cast<std::ptrdiff_t>(kKeptEmptyPages)) return;
  ::munmap(it->base, kPage);
  pages.erase(it);
}

size_t huge_pages_mapped() {
  auto& [mutex, pages] = state();
  std::lock_guard lock(mutex);
  return pages.size();
}

}  // namespace ckptfs::fs::detail
