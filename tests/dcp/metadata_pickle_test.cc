// The pickle machine's two allow-lists stay apart: a DCP .metadata may not use torch.save's
// globals, and torch.save's data.pkl may not use NEWOBJ or DCP's classes.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "ckptfs/error.h"
#include "ckptfs/torchzip/pickle.h"

namespace ckptfs::torchzip {
namespace {

std::string refusal(const std::string& pickle, Allow allow) {
  try {
    unpickle(
        pickle, "f", [](std::string_view) { return std::nullopt; }, allow);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

// SHORT_BINUNICODE module, SHORT_BINUNICODE name, STACK_GLOBAL. Built by appending: GCC 12
// warns (-Wrestrict) on the inlined inserts of a chain of string +.
std::string stack_global(const std::string& module, const std::string& name) {
  std::string out;
  for (const std::string* s : {&module, &name}) {
    out.push_back('\x8c');
    out.push_back(static_cast<char>(s->size()));
    out.append(*s);
  }
  out.push_back('\x93');
  return out;
}

TEST(DcpMetadataPickle, TorchSaveGlobalsAreRefused) {
  const std::string p = "\x80\x04" + stack_global("torch._utils", "_rebuild_tensor_v2") + ".";
  EXPECT_EQ(refusal(p, Allow::DcpMetadata),
            "f: pickle byte offset 36: unsupported object \"torch._utils._rebuild_tensor_v2\" (a "
            "DCP .metadata holds only DCP's metadata and save-plan classes, Megatron-Core's "
            "MCoreMetadata and MCoreSavePlan, torch.Size, dtypes, a layout and a path; nothing is "
            "executed)");
}

// Megatron-Core's torch_dist saves (spec §3.5): its Metadata and SavePlan subclasses, and the
// planner's classes all_local_plans holds, are made; a neighbour of them is refused by name.
TEST(DcpMetadataPickle, MegatronGlobalsAreAllowedAndNoOthers) {
  const std::string mcore = "megatron.core.dist_checkpointing.strategies.torch";
  const std::string planner = "torch.distributed.checkpoint.planner";
  for (const std::string& p : {
           "\x80\x04" + stack_global(mcore, "MCoreMetadata") + ")\x81}b.",
           "\x80\x04" + stack_global(mcore, "MCoreSavePlan") + ")\x81}b.",
           "\x80\x04" + stack_global(planner, "SavePlan") + ")\x81}b.",
           "\x80\x04" + stack_global(planner, "WriteItem") + ")\x81}b.",
           "\x80\x04" + stack_global(planner, "TensorWriteData") + ")\x81}b.",
           "\x80\x04" + stack_global(planner, "BytesIOWriteData") + ")\x81}b.",
           "\x80\x04" + stack_global("torch.distributed.checkpoint.filesystem", "_StoragePrefix") +
               ")\x81}b.",
           "\x80\x04" + stack_global(planner, "WriteItemType") + "K\x02\x85R.",
           "\x80\x04" + stack_global("builtins", "getattr") +
               stack_global(planner, "WriteItemType") + "\x8c\x05SHARD\x86R.",
       })
    EXPECT_EQ(refusal(p, Allow::DcpMetadata), "accepted") << p;
  EXPECT_NE(
      refusal("\x80\x04" + stack_global(mcore, "MCoreLoadPlan") + ")\x81.", Allow::DcpMetadata)
          .find("unsupported object \"" + mcore + ".MCoreLoadPlan\""),
      std::string::npos);
  EXPECT_NE(refusal("\x80\x04" + stack_global(planner, "LoadPlan") + ")\x81.", Allow::DcpMetadata)
                .find("unsupported object \"" + planner + ".LoadPlan\""),
            std::string::npos);
  // getattr of WriteItemType takes only its members' names.
  EXPECT_NE(refusal("\x80\x04" + stack_global("builtins", "getattr") +
                        stack_global(planner, "WriteItemType") + "\x8c\x06SYSTEM\x86R.",
                    Allow::DcpMetadata),
            "accepted");
}

TEST(DcpMetadataPickle, DcpClassesAreRefusedInTorchSave) {
  const std::string p =
      "\x80\x02" + stack_global("torch.distributed.checkpoint.metadata", "Metadata") + ").";
  EXPECT_NE(refusal(p, Allow::TorchSave)
                .find("f: data.pkl byte offset 51: unsupported object "
                      "\"torch.distributed.checkpoint.metadata.Metadata\""),
            std::string::npos);
  EXPECT_EQ(refusal("\x80\x02))\x81.", Allow::TorchSave),
            "f: data.pkl byte offset 4: opcode 0x81 is not accepted (nothing in a pickle is "
            "executed)");
}

TEST(DcpMetadataPickle, BuildOnlyOnceOnADataclass) {
  const std::string cls = stack_global("torch.distributed.checkpoint.metadata", "Metadata");
  EXPECT_EQ(refusal("\x80\x04" + cls + ")\x81}b}b.", Allow::DcpMetadata),
            "f: pickle byte offset 57: BUILD is only accepted once on an object of a DCP "
            "metadata class");
  const std::string ok = "\x80\x04" + cls + ")\x81}b.";
  EXPECT_EQ(unpickle(
                ok, "f", [](std::string_view) { return std::nullopt; }, Allow::DcpMetadata)
                .tree.dump(),
            R"({"$object":"torch.distributed.checkpoint.metadata.Metadata","state":{"$dict":[]}})");
}

}  // namespace
}  // namespace ckptfs::torchzip
