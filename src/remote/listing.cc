#include "ckptfs/remote/listing.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <charconv>
#include <memory>

#include "ckptfs/error.h"

namespace ckptfs::remote {

namespace {

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

// No network, no entity substitution, no DTD loading: a listing is data.
Doc read_doc(std::string_view xml) {
  if (xml.size() > static_cast<size_t>(INT32_MAX)) return nullptr;
  return Doc(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "s3.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
}

bool named(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE && xmlStrcmp(node->name, BAD_CAST name) == 0;
}

std::string text_of(const xmlNode* node) {
  std::string out;
  for (const xmlNode* c = node->children; c != nullptr; c = c->next)
    if ((c->type == XML_TEXT_NODE || c->type == XML_CDATA_SECTION_NODE) && c->content != nullptr)
      out += reinterpret_cast<const char*>(c->content);
  return out;
}

ObjectInfo parse_contents(const xmlNode* contents, const std::string& what) {
  ObjectInfo info;
  bool has_key = false, has_size = false, has_etag = false;
  for (const xmlNode* c = contents->children; c != nullptr; c = c->next) {
    if (named(c, "Key")) {
      info.key = text_of(c);
      has_key = true;
    } else if (named(c, "Size")) {
      const std::string s = text_of(c);
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), info.size);
      if (ec != std::errc() || end != s.data() + s.size() || s.empty())
        fail("{}: the listing gives object size \"{}\", not a byte count", what, s);
      has_size = true;
    } else if (named(c, "ETag")) {
      info.etag = text_of(c);
      has_etag = true;
    }
  }
  if (!has_key || !has_size || !has_etag || info.etag.empty())
    fail("{}: a listing entry lacks its Key, Size or ETag", what);
  if (info.etag.starts_with("W/"))
    fail(
        "{}: the listing gives {} the weak ETag {}, which names no bytes (list the store itself, "
        "not through a proxy that rewrites ETags)",
        what, info.key, info.etag);
  return info;
}

}  // namespace

ListPage parse_list_page(std::string_view xml, const std::string& what) {
  const Doc doc = read_doc(xml);
  const xmlNode* root = doc ? xmlDocGetRootElement(doc.get()) : nullptr;
  if (root == nullptr || !named(root, "ListBucketResult"))
    fail("{}: the answer is not an S3 object listing (ListBucketResult)", what);
  ListPage page;
  for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
    if (named(c, "Contents")) {
      page.objects.push_back(parse_contents(c, what));
    } else if (named(c, "IsTruncated")) {
      page.truncated = text_of(c) == "true";
    } else if (named(c, "NextContinuationToken")) {
      page.next_token = text_of(c);
    }
  }
  if (page.truncated && page.next_token.empty())
    fail("{}: the listing is truncated but gives no continuation token", what);
  return page;
}

std::optional<std::string> parse_error_body(std::string_view xml) {
  const Doc doc = read_doc(xml);
  const xmlNode* root = doc ? xmlDocGetRootElement(doc.get()) : nullptr;
  if (root == nullptr || !named(root, "Error")) return std::nullopt;
  std::string code, message;
  for (const xmlNode* c = root->children; c != nullptr; c = c->next) {
    if (named(c, "Code")) code = text_of(c);
    if (named(c, "Message")) message = text_of(c);
  }
  return message.empty() ? code : code + ": " + message;
}

}  // namespace ckptfs::remote
