// MindFormers' metadata.json reader on damaged files (the whole reader is covered end to end by
// tests/integration/test_mindformers.py).
#include "ckptfs/mindformers/metadata.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ckptfs/error.h"
#include "support/test_support.h"

namespace ckptfs::mindformers {
namespace {

using ::testing::HasSubstr;

// Found by fuzz_mindformers_metadata (the long run of docs/RELIABILITY.md): a number beyond a
// double's range is valid JSON that nlohmann refuses with out_of_range, not parse_error, and
// read_iteration let it escape as an exception other than ckptfs::Error.
TEST(Metadata, NumberBeyondADoubleIsRefused) {
  testsupport::TempDir dir("ckptfs-mf-metadata");
  for (const std::string text : {"7555000000E00000789148907572e_m5", "{\"a\": 1e99999}"}) {
    testsupport::write_file(dir.path() / kMetadataFile, text);
    try {
      read_iteration(dir.path());
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(kMetadataFile)) << text;
    }
  }
}

}  // namespace
}  // namespace ckptfs::mindformers
