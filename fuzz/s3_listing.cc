// An S3 ListObjectsV2 answer (src/remote/listing.cc, over libxml2) and an S3 error answer: the
// bytes a server (or anything answering in its place) sends back. Checked on an accepted page:
// a truncated page has a continuation token, and every entry has a key and an ETag.
#include <cstdlib>
#include <string_view>

#include "ckptfs/error.h"
#include "ckptfs/remote/listing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  static_cast<void>(ckptfs::remote::parse_error_body(xml));
  try {
    const ckptfs::remote::ListPage page = ckptfs::remote::parse_list_page(xml, "fuzz");
    if (page.truncated && page.next_token.empty()) std::abort();
    for (const auto& o : page.objects)
      if (o.etag.empty()) std::abort();
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
