// readbench: times pread() over a list of files the way a checkpoint loader reads them, and
// checksums what it read, so scripts/bench.sh can compare a mount with the materialized files.
//
//   readbench [-t THREADS] [-s range|files] [-b BLOCK] [-e] [-x] [-q] FILE...
//   readbench -F [-b BLOCK] FILE          time to first byte: open + one pread of BLOCK (4 KiB)
//
//   -t N       reader threads (default 1)
//   -s range   every file is cut into N contiguous, block-aligned ranges; thread i reads range i
//              of each file in turn (default: works for a single merged file too)
//   -s files   whole files are dealt to threads, largest first onto the least loaded thread
//   -b BLOCK   bytes per pread (default 1M; K/M/G suffixes)
//   -e         posix_fadvise(DONTNEED) every file before the timed part. On a FUSE file this
//              drops the FUSE inode's page cache (so the read goes to the daemon), not the cache
//              of the daemon's source files
//   -x         checksum every file (64-bit, see block_hash) and print "sum HEX FILE" lines. The
//              hash runs inside the read loop, so a -x run is a verification run, not a figure
//   -q         print only the MB/s figure
//   -m         read through a shared read-only mmap of each file instead of pread: each block is
//              copied out of the mapping (what a safetensors/numpy loader does), so page faults
//              bring the bytes in
//
// Output: "bytes=B seconds=S mbps=M" (MB = 10^6 bytes). The clock covers the first open to the
// last pread of all threads (thread start included, buffer allocation and page faults not: the
// buffers are touched before the clock starts).
#include <fcntl.h>
#include <getopt.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// 64-bit hash of one block, four independent multiply-rotate lanes (the xxHash64 round) so the
// CPU can overlap them: about 10 GB/s, enough that a verification pass costs seconds, not
// minutes. Not cryptographic; it only has to catch misplaced or wrong bytes.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round64(uint64_t acc, uint64_t w) { return rotl(acc + w * kP2, 31) * kP1; }
inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t block_hash(const unsigned char* p, size_t n) {
  uint64_t a = kP1, b = kP2, c = 0, d = kP3;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, sizeof w);
    a = round64(a, w[0]);
    b = round64(b, w[1]);
    c = round64(c, w[2]);
    d = round64(d, w[3]);
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + n;
  for (; i < n; ++i) h = (h ^ p[i]) * kP1;
  return avalanche(h);
}

// A file's checksum is the sum over its BLOCK-aligned blocks of hash(block) mixed with the
// block's index. The sum does not depend on which thread read which block or in what order, so
// a 2-thread read through the mount and a 1-thread read of the reference file agree, while a
// block moved to another offset still changes it. Blocks are aligned to absolute offsets, and
// a thread's range always starts on a block boundary.
uint64_t place(uint64_t block_index, uint64_t h) {
  return avalanche(h ^ (block_index * kP3 + kP2));
}

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024;
      break;
    case 'm':
    case 'M':
      v *= 1 << 20;
      break;
    case 'g':
    case 'G':
      v *= 1 << 30;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

struct Piece {  // a byte range of one file assigned to one thread
  size_t file;
  uint64_t begin, end;
};

struct Worker {
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
  std::vector<uint64_t> sums;  // per file, partial sums of this thread
  int err = 0;
  std::string what;
};

struct Buffer {  // page-aligned, touched before the clock starts
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data;
  explicit Buffer(size_t size) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, (size + 4095) / 4096 * 4096) != 0) throw std::bad_alloc();
    std::memset(p, 0, size);
    data.reset(static_cast<unsigned char*>(p));
  }
};

void run_worker(Worker& w, const std::vector<std::string>& paths, unsigned char* buf, size_t block,
                bool checksum, bool mapped) {
  for (const Piece& p : w.pieces) {
    const int fd = ::open(paths[p.file].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      w.err = errno;
      w.what = "open " + paths[p.file];
      return;
    }
    const unsigned char* map = nullptr;
    size_t map_len = 0;
    if (mapped && p.end > 0) {
      map_len = static_cast<size_t>(p.end);
      void* m = ::mmap(nullptr, map_len, PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) {
        w.err = errno;
        w.what = "mmap " + paths[p.file];
        ::close(fd);
        return;
      }
      map = static_cast<const unsigned char*>(m);
    }
    uint64_t off = p.begin;
    while (off < p.end) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(block, p.end - off));
      ssize_t r;
      if (map != nullptr) {
        std::memcpy(buf, map + off, want);
        r = static_cast<ssize_t>(want);
      } else {
        r = ::pread(fd, buf, want, static_cast<off_t>(off));
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        w.err = errno;
        w.what = "pread " + paths[p.file] + " at " + std::to_string(off);
        break;
      }
      if (r == 0) {
        w.err = EIO;
        w.what = "short file " + paths[p.file] + " at " + std::to_string(off);
        break;
      }
      // A short read (allowed by POSIX, rare on a FUSE direct_io mount) would misalign blocks
      // for the checksum, so it is an error in checksum mode and simply continued otherwise.
      if (checksum) {
        if (static_cast<size_t>(r) != want) {
          w.err = EIO;
          w.what = "short pread " + paths[p.file] + " at " + std::to_string(off);
          break;
        }
        w.sums[p.file] += place(off / block, block_hash(buf, want));
      }
      w.bytes += static_cast<uint64_t>(r);
      off += static_cast<uint64_t>(r);
    }
    if (map != nullptr) ::munmap(const_cast<unsigned char*>(map), map_len);
    ::close(fd);
    if (w.err) return;
  }
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  // posix_fadvise returns the error number instead of setting errno.
  const int err = fd < 0 ? errno : posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (err != 0)
    std::fprintf(stderr, "readbench: fadvise %s: %s\n", path.c_str(), std::strerror(err));
  if (fd >= 0) ::close(fd);
}

int first_byte(const std::string& path, size_t block) {
  Buffer buf(block);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::perror(path.c_str());
    return 1;
  }
  const ssize_t r = ::pread(fd, buf.data.get(), block, 0);
  const auto t1 = Clock::now();
  ::close(fd);
  if (r <= 0) {
    std::fprintf(stderr, "readbench: first pread of %s failed\n", path.c_str());
    return 1;
  }
  std::printf("ttfb_ms=%.3f bytes=%zd\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(), r);
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: readbench [-t N] [-s range|files] [-b BLOCK] [-e] [-x] [-q] [-m] FILE...\n"
               "       readbench -F [-b BLOCK] FILE\n");
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 1;
  size_t block = 1 << 20;
  bool split_files = false, do_evict = false, checksum = false, quiet = false, ttfb = false;
  bool mapped = false;
  bool block_given = false;
  int opt;
  while ((opt = getopt(argc, argv, "t:s:b:exqFm")) != -1) {
    switch (opt) {
      case 't':
        threads = static_cast<unsigned>(std::atoi(optarg));
        break;
      case 's':
        if (std::strcmp(optarg, "files") == 0)
          split_files = true;
        else if (std::strcmp(optarg, "range") != 0) {
          usage();
          return 2;
        }
        break;
      case 'b':
        block = parse_size(optarg);
        block_given = true;
        break;
      case 'e':
        do_evict = true;
        break;
      case 'x':
        checksum = true;
        break;
      case 'm':
        mapped = true;
        break;
      case 'q':
        quiet = true;
        break;
      case 'F':
        ttfb = true;
        break;
      default:
        usage();
        return 2;
    }
  }
  std::vector<std::string> paths(argv + optind, argv + argc);
  if (paths.empty() || threads < 1 || block < 1) {
    usage();
    return 2;
  }
  if (ttfb) return first_byte(paths[0], block_given ? block : 4096);

  std::vector<uint64_t> sizes;
  for (const std::string& p : paths) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) {
      std::perror(p.c_str());
      return 1;
    }
    sizes.push_back(static_cast<uint64_t>(st.st_size));
  }

  std::vector<Worker> workers(threads);
  for (Worker& w : workers) w.sums.assign(paths.size(), 0);
  if (split_files) {
    std::vector<size_t> order(paths.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
    std::vector<uint64_t> load(threads, 0);
    for (size_t f : order) {
      const size_t t = std::min_element(load.begin(), load.end()) - load.begin();
      workers[t].pieces.push_back({f, 0, sizes[f]});
      load[t] += sizes[f];
    }
    // Each thread reads its files in path order, like a loader walking rank directories.
    for (Worker& w : workers)
      std::sort(w.pieces.begin(), w.pieces.end(),
                [](const Piece& a, const Piece& b) { return a.file < b.file; });
  } else {
    for (size_t f = 0; f < paths.size(); ++f) {
      const uint64_t blocks = (sizes[f] + block - 1) / block;
      const uint64_t per = (blocks + threads - 1) / threads * block;
      for (unsigned t = 0; t < threads; ++t) {
        const uint64_t b = std::min<uint64_t>(per * t, sizes[f]);
        const uint64_t e = std::min<uint64_t>(per * (t + 1), sizes[f]);
        if (b < e) workers[t].pieces.push_back({f, b, e});
      }
    }
  }

  if (do_evict)
    for (const std::string& p : paths) evict(p);

  std::vector<Buffer> buffers;
  for (unsigned t = 0; t < threads; ++t) buffers.emplace_back(block);

  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back(run_worker, std::ref(workers[t]), std::cref(paths), buffers[t].data.get(),
                      block, checksum, mapped);
  for (std::thread& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  uint64_t bytes = 0;
  for (const Worker& w : workers) {
    if (w.err) {
      std::fprintf(stderr, "readbench: %s: %s\n", w.what.c_str(), std::strerror(w.err));
      return 1;
    }
    bytes += w.bytes;
  }
  uint64_t want = 0;
  for (uint64_t s : sizes) want += s;
  if (bytes != want) {
    std::fprintf(stderr, "readbench: read %" PRIu64 " bytes, files hold %" PRIu64 "\n", bytes,
                 want);
    return 1;
  }
  const double mbps = static_cast<double>(bytes) / seconds / 1e6;
  if (quiet) {
    std::printf("%.1f\n", mbps);
  } else {
    std::printf("bytes=%" PRIu64 " seconds=%.4f mbps=%.1f threads=%u split=%s\n", bytes, seconds,
                mbps, threads, split_files ? "files" : "range");
  }
  if (checksum) {
    for (size_t f = 0; f < paths.size(); ++f) {
      uint64_t s = 0;
      for (const Worker& w : workers) s += w.sums[f];
      // The size goes in too: an empty tail or a truncated file must not match.
      std::printf("sum %016" PRIx64 " %s\n", avalanche(s ^ sizes[f]), paths[f].c_str());
    }
  }
  return 0;
}
