#include "ckptfs/remote/listing.h"

#include <gtest/gtest.h>

#include "ckptfs/error.h"

namespace ckptfs::remote {
namespace {

// The shape of AWS's documented ListObjectsV2 answer.
constexpr const char* kPage = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>ckpt</Name><Prefix>train/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents><Key>train/rank_0/a.ckpt</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>123456789012</Size>
    <StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>train/rank_1/b &amp; c.ckpt</Key><ETag>"x-2"</ETag><Size>0</Size></Contents>
</ListBucketResult>)";

TEST(Listing, ParsesKeysSizesEtagsAndToken) {
  const ListPage page = parse_list_page(kPage, "s3://ckpt/train/");
  ASSERT_EQ(page.objects.size(), 2u);
  EXPECT_EQ(page.objects[0].key, "train/rank_0/a.ckpt");
  EXPECT_EQ(page.objects[0].size, 123456789012u);
  EXPECT_EQ(page.objects[0].etag, "\"9b2cf535f27731c974343645a3985328\"");
  EXPECT_EQ(page.objects[1].key, "train/rank_1/b & c.ckpt");
  EXPECT_EQ(page.objects[1].size, 0u);
  EXPECT_TRUE(page.truncated);
  EXPECT_EQ(page.next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
}

TEST(Listing, LastPageHasNoToken) {
  const ListPage page =
      parse_list_page("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", "x");
  EXPECT_TRUE(page.objects.empty());
  EXPECT_FALSE(page.truncated);
}

TEST(Listing, RefusesWhatIsNotAListing) {
  EXPECT_THROW(parse_list_page("", "x"), Error);
  EXPECT_THROW(parse_list_page("<html>nope</html>", "x"), Error);
  EXPECT_THROW(parse_list_page("<ListBucketResult><Contents><Key>a</Key><Size>-1</Size>"
                               "<ETag>e</ETag></Contents></ListBucketResult>",
                               "x"),
               Error);
  EXPECT_THROW(parse_list_page("<ListBucketResult><Contents><Key>a</Key><Size>1</Size>"
                               "</Contents></ListBucketResult>",
                               "x"),
               Error);
  EXPECT_THROW(parse_list_page("<ListBucketResult><IsTruncated>true</IsTruncated>"
                               "</ListBucketResult>",
                               "x"),
               Error);
}

TEST(Listing, NamesTheRequestInItsError) {
  try {
    parse_list_page(
        "<ListBucketResult><Contents><Key>k</Key><Size>12x</Size><ETag>e</ETag>"
        "</Contents></ListBucketResult>",
        "s3://b/p/");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s3://b/p/"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("12x"), std::string::npos) << e.what();
  }
}

TEST(Listing, RefusesAWeakEtagNamingTheKey) {
  try {
    parse_list_page(
        "<ListBucketResult><Contents><Key>p/k.ckpt</Key><Size>12</Size><ETag>W/\"e\"</ETag>"
        "</Contents></ListBucketResult>",
        "s3://b/p/");
    FAIL() << "a weak ETag was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("s3://b/p/"), std::string::npos) << what;
    EXPECT_NE(what.find("p/k.ckpt"), std::string::npos) << what;
    EXPECT_NE(what.find("weak"), std::string::npos) << what;
  }
  // An unquoted tag is a strong one.
  EXPECT_EQ(parse_list_page("<ListBucketResult><Contents><Key>k</Key><Size>1</Size><ETag>e</ETag>"
                            "</Contents></ListBucketResult>",
                            "x")
                .objects.at(0)
                .etag,
            "e");
}

TEST(Listing, EntitiesAreNotExpanded) {
  // An external entity would read a local file; the parser must not fetch or substitute it.
  const char* xxe = R"(<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<ListBucketResult><Contents><Key>&x;</Key><Size>1</Size><ETag>e</ETag></Contents>
</ListBucketResult>)";
  try {
    const ListPage page = parse_list_page(xxe, "x");
    ASSERT_EQ(page.objects.size(), 1u);
    EXPECT_EQ(page.objects[0].key.find("root:"), std::string::npos);
  } catch (const Error&) {
    // refusing the page is fine too
  }
}

TEST(Listing, ErrorBody) {
  EXPECT_EQ(parse_error_body("<Error><Code>SignatureDoesNotMatch</Code><Message>The request "
                             "signature we calculated does not match</Message></Error>"),
            "SignatureDoesNotMatch: The request signature we calculated does not match");
  EXPECT_EQ(parse_error_body("<ListBucketResult/>"), std::nullopt);
  EXPECT_EQ(parse_error_body("not xml"), std::nullopt);
}

}  // namespace
}  // namespace ckptfs::remote
