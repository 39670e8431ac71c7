// The body of an S3 ListObjectsV2 answer (or of an S3 error answer) as plain values, parsed with
// libxml2. Network access and entity expansion are off: the body is data, never a document that
// may pull in others. Stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::remote {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as listed (quoted or not, never weak); If-Match sends it quoted
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};

// The page in `xml`; throws Error naming `what` (the request) when it is not a well-formed
// ListBucketResult, or when a Contents entry lacks its Key, Size or ETag or has a bad Size.
ListPage parse_list_page(std::string_view xml, const std::string& what);

// "Code: Message" of an S3 <Error> body, nullopt when `xml` is not one.
std::optional<std::string> parse_error_body(std::string_view xml);

}  // namespace ckptfs::remote
