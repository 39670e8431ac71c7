#include "ckptfs/remote/s3_client.h"

#include <curl/curl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

namespace ckptfs::remote {

namespace {

std::atomic<uint64_t> g_requests{0}, g_bytes{0}, g_retries{0};

// SHA-256 of the empty body: GETs sign no payload.
constexpr const char* kEmptySha256 =
    "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// RFC 3986 percent-encoding of everything but unreserved characters (and '/' when `keep_slash`):
// what SigV4's canonical request expects of a path and of a query value.
std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

bool starts_with_nocase(std::string_view line, std::string_view prefix) {
  if (line.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) != prefix[i]) return false;
  return true;
}

std::string header_value(std::string_view line, size_t name_len) {
  std::string v(line.substr(name_len));
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
  while (!v.empty() && v.front() == ' ') v.erase(v.begin());
  return v;
}

// One request's answer as it arrives. Body bytes go to `out` (bounded by its size) once the
// status says they are the object's (200 or 206), else (an error answer) to `body`: an error
// body never lands in the caller's buffer, and its S3 code reaches the message.
struct Answer {
  std::span<uint8_t> out;
  int file = -1;  // Get::file: the body goes there, at file_offset
  uint64_t file_offset = 0;
  size_t received = 0;
  bool overflow = false;
  std::string write_error;  // the file's, when the body could not be written there
  std::string body;         // listings and error answers (bounded)
  bool want_body = false;
  long status = 0;  // of the answer whose headers came last
  std::string content_range, etag;
  char errbuf[CURL_ERROR_SIZE] = {};

  void reset() {
    received = 0;
    overflow = false;
    write_error.clear();
    status = 0;
    body.clear();
    content_range.clear();
    etag.clear();
    errbuf[0] = 0;
  }
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* a = static_cast<Answer*>(user);
  const std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a 100 or a redirect)
    a->content_range.clear();
    a->etag.clear();
    const auto space = line.find(' ');
    a->status = space == std::string_view::npos
                    ? 0
                    : std::atol(std::string(line.substr(space + 1, 3)).c_str());
  } else if (starts_with_nocase(line, "content-range:")) {
    a->content_range = header_value(line, 14);
  } else if (starts_with_nocase(line, "etag:")) {
    a->etag = header_value(line, 5);
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* a = static_cast<Answer*>(user);
  const size_t len = size * n;
  if (a->want_body) {
    if (a->body.size() + len > (64u << 20)) return 0;
    a->body.append(data, len);
    return len;
  }
  if (a->status != 200 && a->status != 206) {  // an error answer: its head is enough
    a->body.append(data, std::min(len, (64u << 10) - std::min<size_t>(a->body.size(), 64u << 10)));
    return len;
  }
  if (a->received + len > a->out.size()) {
    a->overflow = true;
    return 0;
  }
  if (a->file < 0) {
    std::memcpy(a->out.data() + a->received, data, len);
  } else {
    for (size_t done = 0; done < len;) {
      const ssize_t wrote = ::pwrite(a->file, data + done, len - done,
                                     static_cast<off_t>(a->file_offset + a->received + done));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        a->write_error =
            "writing the spool: " + (wrote < 0 ? errno_text(errno) : std::string("no progress"));
        return 0;  // the transfer fails (the range is EIO, never a hole in its bytes)
      }
      done += static_cast<size_t>(wrote);
    }
  }
  a->received += len;
  return len;
}

struct SlistFree {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Slist = std::unique_ptr<curl_slist, SlistFree>;

// This thread's curl handles, made again in a forked child (the parent's connections are not
// its own).
struct Handles {
  pid_t pid = 0;
  CURLM* multi = nullptr;
  std::vector<CURL*> easy;
  ~Handles() {
    if (pid != ::getpid()) return;
    for (CURL* e : easy) curl_easy_cleanup(e);
    if (multi) curl_multi_cleanup(multi);
  }
};

Handles& handles() {
  thread_local Handles h;
  if (h.pid != ::getpid()) {
    h.easy.clear();  // a parent's: leaked, never touched again
    h.multi = nullptr;
    h.pid = ::getpid();
  }
  return h;
}

CURL* easy_at(size_t i) {
  Handles& h = handles();
  while (h.easy.size() <= i) {
    CURL* e = curl_easy_init();
    if (e == nullptr) fail("cannot make a curl handle");
    h.easy.push_back(e);
  }
  return h.easy[i];
}

bool transient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

std::chrono::milliseconds backoff(int attempt) {
  // 100 ms, 200 ms, ... up to 3.2 s, with up to a quarter more so that many readers spread.
  const int64_t base = std::min<int64_t>(100LL << attempt, 3200);
  return std::chrono::milliseconds(base + static_cast<int64_t>(std::rand() % (base / 4 + 1)));
}

std::string describe_failure(CURLcode code, long status, const Answer& a) {
  if (!a.write_error.empty()) return a.write_error;
  if (code != CURLE_OK) return a.errbuf[0] ? a.errbuf : curl_easy_strerror(code);
  std::string out = fmt::format("HTTP {}", status);
  if (auto err = parse_error_body(a.body)) out += " (" + *err + ")";
  return out;
}

}  // namespace

S3Client::S3Client(S3Config config, int stall_seconds)
    : config_(std::move(config)),
      sigv4_("aws:amz:" + config_.region + ":s3"),
      stall_seconds_(stall_seconds) {
  global_init();
}

FetchStats S3Client::stats() { return {g_requests.load(), g_bytes.load(), g_retries.load()}; }

std::string S3Client::url(const std::string& bucket, const std::string& key) const {
  if (!config_.endpoint.empty())
    return config_.endpoint + "/" + uri_encode(bucket, false) + "/" + uri_encode(key, true);
  return "https://" + bucket + ".s3." + config_.region + ".amazonaws.com/" + uri_encode(key, true);
}

namespace {

// Sets up `e` for a signed GET of `url` with `headers`, answering into `a`.
void prepare(CURL* e, const S3Config& config, const std::string& sigv4, int stall_seconds,
             const std::string& url, curl_slist* headers, Answer& a) {
  curl_easy_reset(e);
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(e, CURLOPT_USERNAME, config.access_key.c_str());
  curl_easy_setopt(e, CURLOPT_PASSWORD, config.secret_key.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, static_cast<long>(stall_seconds));
  // Stalled: under kMinSpeed for stall_seconds. A store that drips bytes is no better than one
  // that sends none, and a floor of one byte a second would let it hold a READ for hours.
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(S3Client::kMinSpeed));
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, static_cast<long>(stall_seconds));
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, a.errbuf);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
}

Slist base_headers(const S3Config& config) {
  Slist h(curl_slist_append(nullptr, kEmptySha256));
  if (!config.session_token.empty())
    h.reset(
        curl_slist_append(h.release(), ("x-amz-security-token: " + config.session_token).c_str()));
  return h;
}

}  // namespace

std::vector<ObjectInfo> S3Client::list(const std::string& bucket, const std::string& prefix) const {
  std::vector<ObjectInfo> all;
  std::string token;
  std::set<std::string> tokens;  // every token followed: a store that repeats one loops for good
  const std::string where = "s3://" + bucket + "/" + prefix;
  for (;;) {
    // Query parameters in SigV4's canonical (sorted) order.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + uri_encode(token, false) + "&";
    query += "list-type=2&prefix=" + uri_encode(prefix, false);
    const std::string request = url(bucket, "") + "?" + query;
    Slist headers = base_headers(config_);
    Answer a;
    a.want_body = true;
    long status = 0;
    for (int attempt = 0;; ++attempt) {
      a.reset();
      CURL* e = easy_at(0);
      prepare(e, config_, sigv4_, stall_seconds_, request, headers.get(), a);
      const CURLcode code = curl_easy_perform(e);
      g_requests.fetch_add(1, std::memory_order_relaxed);
      curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
      if (code == CURLE_OK && status == 200) break;
      const bool retry = code != CURLE_OK ? transient(code) : status >= 500 || status == 429;
      if (!retry || attempt + 1 >= config_.attempts)
        fail("{}: listing failed: {} (keys from {}, endpoint {})", where,
             describe_failure(code, status, a), config_.keys_from,
             config_.endpoint.empty() ? "AWS" : config_.endpoint);
      g_retries.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(backoff(attempt));
    }
    ListPage page = parse_list_page(a.body, where);
    for (ObjectInfo& o : page.objects) all.push_back(std::move(o));
    if (!page.truncated) break;
    token = page.next_token;
    if (!tokens.insert(token).second)
      fail(
          "{}: the listing gives continuation token \"{}\" a second time (the store would list "
          "for good); check the endpoint is an S3 store",
          where, token);
  }
  return all;
}

namespace {

// The outcome of one finished GET.
enum class Verdict { kDone, kRetry, kChanged, kFailed, kLocal };

struct Check {
  Verdict verdict;
  std::string why;
};

// An entity tag without its quotes: some stores list `abc` and answer GETs with `"abc"`, one
// version named twice.
std::string_view opaque(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  return etag;
}

Check judge(const Get& g, CURLcode code, long status, const Answer& a) {
  const ObjectRef& o = *g.object;
  if (!a.write_error.empty()) return {Verdict::kLocal, a.write_error};
  if (code != CURLE_OK && !a.overflow)
    return {transient(code) ? Verdict::kRetry : Verdict::kFailed,
            describe_failure(code, status, a)};
  if (status == 412 || status == 404)
    return {Verdict::kChanged,
            status == 412 ? "its ETag is no longer " + o.info.etag : "it no longer exists"};
  if (status >= 500 || status == 429) return {Verdict::kRetry, describe_failure(code, status, a)};
  if (status != 206 && status != 200) return {Verdict::kFailed, describe_failure(code, status, a)};
  // Without an ETag nothing shows that these are the scanned object's bytes: a store that also
  // ignores If-Match would serve a rewritten object's.
  if (a.etag.empty())
    return {Verdict::kFailed,
            "the answer carries no ETag, so nothing shows the object is the one scanned (ckptfs "
            "reads only from stores that send ETags)"};
  // A weak tag (a proxy's, made when it re-encodes the body) names no bytes.
  if (a.etag.starts_with("W/"))
    return {Verdict::kFailed, "the answer's ETag " + a.etag +
                                  " is weak, so nothing shows the bytes are the object scanned "
                                  "(read from the store itself, not through a proxy that rewrites "
                                  "ETags)"};
  if (opaque(a.etag) != opaque(o.info.etag))
    return {Verdict::kChanged, "its ETag is now " + a.etag + ", was " + o.info.etag};
  if (status == 206) {
    // "bytes FIRST-LAST/TOTAL"
    unsigned long long first = 0, last = 0, total = 0;
    if (std::sscanf(a.content_range.c_str(), "bytes %llu-%llu/%llu", &first, &last, &total) != 3)
      return {Verdict::kFailed, "the answer has no Content-Range: \"" + a.content_range + "\""};
    if (total != o.info.size)
      return {Verdict::kChanged, fmt::format("its size is now {}, was {}", total, o.info.size)};
    if (first != g.offset || last + 1 != g.offset + g.out.size())
      return {Verdict::kFailed, "the server answered another range: " + a.content_range};
  } else if (g.offset != 0 || g.out.size() != o.info.size) {
    return {Verdict::kFailed, "the server ignored the byte range"};
  }
  if (a.overflow) return {Verdict::kFailed, "the server sent more bytes than asked"};
  if (a.received != g.out.size())
    return {Verdict::kRetry,
            fmt::format("the answer ended after {} of {} bytes", a.received, g.out.size())};
  return {Verdict::kDone, {}};
}

}  // namespace

void S3Client::stream(GetFeed& feed, const std::atomic<bool>* cancel) const {
  using Clock = std::chrono::steady_clock;
  struct Slot {
    Get get;
    uint64_t tag = 0;
    int attempt = 0;
    Answer answer;
    Slist headers;
    std::string url;
    bool busy = false;
  };
  struct Waiting {  // a get to send again once its backoff is over
    Get get;
    uint64_t tag;
    int attempt;
    Clock::time_point at;
  };
  Handles& h = handles();
  if (h.multi == nullptr) h.multi = curl_multi_init();
  CURLM* multi = h.multi;
  std::vector<Slot> slots(kInFlight);
  std::deque<Waiting> waiting;
  size_t running = 0;
  bool fed = true;  // the feed gave a get when last asked
  auto start = [&](size_t s, const Get& g, uint64_t tag, int attempt) {
    Slot& slot = slots[s];
    slot.get = g;
    slot.tag = tag;
    slot.attempt = attempt;
    slot.answer.reset();
    slot.answer.out = g.out;
    slot.answer.file = g.file;
    slot.answer.file_offset = g.file_offset;
    slot.headers = base_headers(config_);
    slot.headers.reset(curl_slist_append(
        slot.headers.release(),
        fmt::format("Range: bytes={}-{}", g.offset, g.offset + g.out.size() - 1).c_str()));
    slot.headers.reset(
        curl_slist_append(slot.headers.release(),
                          fmt::format("If-Match: \"{}\"", opaque(g.object->info.etag)).c_str()));
    slot.url = url(g.object->bucket, g.object->info.key);
    CURL* e = easy_at(s);
    prepare(e, config_, sigv4_, stall_seconds_, slot.url, slot.headers.get(), slot.answer);
    curl_easy_setopt(e, CURLOPT_PRIVATE, reinterpret_cast<void*>(s));
    curl_multi_add_handle(multi, e);
    slot.busy = true;
    ++running;
    g_requests.fetch_add(1, std::memory_order_relaxed);
  };
  auto abort_all = [&] {
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].busy) curl_multi_remove_handle(multi, easy_at(s));
  };
  // The gets in flight and waiting, given up when the caller stops.
  auto give_up = [&] {
    abort_all();
    auto tell = [&](const Get& g, uint64_t tag) {
      feed.done(tag,
                fmt::format("{}: byte offset {}: given up, the mount is stopping", g.object->url(),
                            g.offset),
                GetFeed::Failure::kStore);
    };
    for (Slot& slot : slots)
      if (std::exchange(slot.busy, false)) tell(slot.get, slot.tag);
    for (const Waiting& w : waiting) tell(w.get, w.tag);
  };
  try {
    for (;;) {
      if (cancel && cancel->load(std::memory_order_relaxed)) return give_up();
      const auto now = Clock::now();
      for (size_t s = 0; s < slots.size(); ++s) {
        if (slots[s].busy) continue;
        // First the retries whose backoff is over, then the feed's next.
        auto it = std::find_if(waiting.begin(), waiting.end(),
                               [&](const Waiting& w) { return w.at <= now; });
        if (it != waiting.end()) {
          const Waiting w = *it;
          waiting.erase(it);
          start(s, w.get, w.tag, w.attempt);
          continue;
        }
        Get g;
        uint64_t tag = 0;
        fed = false;
        while (feed.next(g, tag)) {
          if (!g.out.empty()) {
            fed = true;
            break;
          }
          feed.done(tag, {}, GetFeed::Failure::kStore);  // nothing to read
        }
        if (!fed) break;
        start(s, g, tag, 0);
      }
      if (running == 0 && waiting.empty()) return;
      int still = 0;
      curl_multi_perform(multi, &still);
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi, &queued)) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL* e = msg->easy_handle;
        const CURLcode code = msg->data.result;
        void* priv = nullptr;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv);
        const auto s = reinterpret_cast<size_t>(priv);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(multi, e);
        Slot& slot = slots[s];
        slot.busy = false;
        --running;
        g_bytes.fetch_add(slot.answer.received, std::memory_order_relaxed);
        const Get& g = slot.get;
        const Check check = judge(g, code, status, slot.answer);
        if (check.verdict == Verdict::kDone) {
          feed.done(slot.tag, {}, GetFeed::Failure::kStore);
          continue;
        }
        const std::string where =
            fmt::format("{}: byte offset {} ({} bytes)", g.object->url(), g.offset, g.out.size());
        if (check.verdict == Verdict::kChanged) {
          feed.done(slot.tag,
                    fmt::format("{}: changed since it was scanned: {}; mount it again to serve "
                                "its new contents",
                                g.object->url(), check.why),
                    GetFeed::Failure::kChanged);
          continue;
        }
        if (check.verdict == Verdict::kLocal) {
          feed.done(slot.tag, fmt::format("{}: {}", where, check.why), GetFeed::Failure::kLocal);
          continue;
        }
        if (check.verdict == Verdict::kRetry && slot.attempt + 1 < config_.attempts) {
          g_retries.fetch_add(1, std::memory_order_relaxed);
          spdlog::debug("{}: {}; retrying", where, check.why);
          // First in line once its backoff is over: behind hundreds of first tries, a range the
          // store keeps failing would fail the call only after all of them had had their turns.
          waiting.push_front(
              {slot.get, slot.tag, slot.attempt + 1, Clock::now() + backoff(slot.attempt)});
          continue;
        }
        feed.done(slot.tag,
                  fmt::format("{}: GET failed{}: {}", where,
                              slot.attempt > 0 ? fmt::format(" {} times", slot.attempt + 1) : "",
                              check.why),
                  GetFeed::Failure::kStore);
      }
      // A free slot and a feed that had nothing: asked again soon, for gets queued meanwhile.
      const bool free_slot = running < slots.size();
      if (running > 0) {
        curl_multi_poll(multi, nullptr, 0, free_slot && !fed ? kFeedPollMs : 100, nullptr);
      } else if (!waiting.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kFeedPollMs));
      }
    }
  } catch (...) {
    abort_all();
    throw;
  }
}

void S3Client::fetch(std::span<const Get> gets, std::vector<std::string>* errors,
                     const std::atomic<bool>* cancel) const {
  if (errors) errors->assign(gets.size(), {});
  // Hands out `gets` in order; without `errors`, the first failure is thrown.
  class SpanFeed : public GetFeed {
   public:
    SpanFeed(std::span<const Get> gets, std::vector<std::string>* errors)
        : gets_(gets), errors_(errors) {}
    bool next(Get& get, uint64_t& tag) override {
      if (next_ == gets_.size()) return false;
      tag = next_;
      get = gets_[next_++];
      return true;
    }
    void done(uint64_t tag, std::string error, Failure why) override {
      if (error.empty()) return;
      if (!errors_) {
        if (why == Failure::kChanged) throw Changed(error);
        throw Error(error);
      }
      (*errors_)[tag] = std::move(error);
    }
    size_t next_ = 0;

   private:
    std::span<const Get> gets_;
    std::vector<std::string>* errors_;
  } feed(gets, errors);
  stream(feed, cancel);
  // Stopped before these were sent.
  for (size_t i = feed.next_; i < gets.size(); ++i)
    feed.done(i,
              fmt::format("{}: byte offset {}: given up, the mount is stopping",
                          gets[i].object->url(), gets[i].offset),
              GetFeed::Failure::kStore);
}

}  // namespace ckptfs::remote
