// Signed S3 requests through libcurl (CURLOPT_AWS_SIGV4): object listings and ranged GETs of an
// object whose identity (size, ETag) was recorded at scan time. Each GET carries If-Match with
// that ETag and its answer is checked (status, Content-Range start and total size, ETag, byte
// count; an answer without an ETag is refused), so a changed object is a Changed error, never
// other bytes. Stalls (under kMinSpeed for stall_seconds), dropped connections, short bodies,
// 5xx and 429 answers are retried with exponential backoff (S3Config::attempts in all).
//
// Thread-safety: an S3Client is immutable once made and may be used from any number of threads
// at once; each thread keeps its own curl handles (remade after a fork).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckptfs/error.h"
#include "ckptfs/remote/credentials.h"
#include "ckptfs/remote/listing.h"

namespace ckptfs::remote {

// The object is no longer the one scanned (412, another ETag or size): the read fails with EIO.
class Changed : public Error {
 public:
  using Error::Error;
};

// One object as scanned: where it is and the identity its bytes are checked against.
struct ObjectRef {
  std::string bucket;
  ObjectInfo info;
  std::string url() const { return "s3://" + bucket + "/" + info.key; }
};

// out.size() bytes at `offset` of `object` (which outlives the fetch), into `out`. With `file`
// >= 0, `out` is a shared mapping of that file from `file_offset`, and the bytes are written
// to the file (pwrite): its page cache then takes them as they come, where a store through the
// mapping first faulted in each page zeroed (a fifth of a spooled S3 mount's CPU).
struct Get {
  const ObjectRef* object = nullptr;
  uint64_t offset = 0;
  std::span<uint8_t> out;
  int file = -1;
  uint64_t file_offset = 0;
};

// Where S3Client::stream() takes its GETs from and tells how each ended. Called on the
// streaming thread only, never during a transfer.
class GetFeed {
 public:
  virtual ~GetFeed() = default;
  // The next get to send (its bytes' owner keeps them until done() is called for `tag`); false
  // when there is none now.
  virtual bool next(Get& get, uint64_t& tag) = 0;
  // Why a get was not read: the store (after the retries), the object is no longer the one
  // scanned, or its bytes could not be stored here (Get::file could not be written).
  enum class Failure { kStore, kChanged, kLocal };
  // The get of `tag` ended: read (`error` empty), or not, for `why`. Thrown exceptions end
  // stream() (every GET in flight is dropped, not told).
  virtual void done(uint64_t tag, std::string error, Failure why) = 0;
};

struct FetchStats {
  uint64_t requests = 0;  // GETs sent, retries included
  uint64_t bytes = 0;     // body bytes received
  uint64_t retries = 0;
};

class S3Client {
 public:
  // Concurrent GETs of one fetch() call.
  static constexpr size_t kInFlight = 16;
  // How often stream() asks a feed that had nothing again while a slot is free.
  static constexpr int kFeedPollMs = 5;
  // Bytes a second under which a request, over its stall_seconds, counts as stalled (retried).
  static constexpr long kMinSpeed = 16 << 10;

  explicit S3Client(S3Config config, int stall_seconds = 10);

  // Every object under `prefix` (ListObjectsV2, following continuation tokens; a token given
  // twice is an Error, not a loop).
  std::vector<ObjectInfo> list(const std::string& bucket, const std::string& prefix) const;

  // Reads every get, up to kInFlight at a time. Throws Changed when an object changed, Error
  // (naming s3://bucket/key and the offset) when a get still fails after its attempts. With
  // `errors` (resized to gets.size()), nothing is thrown for a get: its reason goes to its
  // slot (empty: read) and the other gets go on. Once `cancel` is set, the gets not yet read are
  // given up (their slots say so; without `errors`, Error), within a tenth of a second.
  void fetch(std::span<const Get> gets, std::vector<std::string>* errors = nullptr,
             const std::atomic<bool>* cancel = nullptr) const;

  // Keeps up to kInFlight GETs of `feed` in flight, sending the next one as soon as one ends (a
  // GET that ends early does not wait for the slowest), with the retries and checks of fetch(),
  // until the feed has none left and none is in flight. A feed that has none now but may have
  // later is asked again every few milliseconds while GETs are in flight. Once `cancel` is set,
  // the gets in flight and waiting for a retry end with "given up" (within a tenth of a second)
  // and the feed is asked for no more.
  void stream(GetFeed& feed, const std::atomic<bool>* cancel = nullptr) const;

  const S3Config& config() const { return config_; }
  // Counters of this process since it started (all clients).
  static FetchStats stats();

 private:
  std::string url(const std::string& bucket, const std::string& key) const;
  S3Config config_;
  std::string sigv4_;  // "aws:amz:REGION:s3"
  int stall_seconds_;
};

}  // namespace ckptfs::remote
