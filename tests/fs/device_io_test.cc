// The INIT handshake of the device hook, over pipes standing in for /dev/fuse: the reply asks
// for FUSE_DIRECT_IO_ALLOW_MMAP exactly when the kernel's INIT offered it, and nothing else
// changes. (tests/fs/mount_test.cc checks a real mount.) And over a real /dev/fuse: a read the
// kernel fails with ECONNABORTED reaches libfuse as ENODEV.
#include "../../src/fs/device_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fuse.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace ckptfs::fs::detail {
namespace {

constexpr uint32_t kInitExt = 1u << 30;
constexpr uint32_t kAllowMmap2 = 1u << 4;  // FUSE_DIRECT_IO_ALLOW_MMAP (bit 36) in flags2

template <typename T>
void put(std::vector<char>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
template <typename T>
T get(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

struct Pipe {
  int fds[2];
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  std::string drain(size_t n) {
    std::string out(n, '\0');
    EXPECT_EQ(::read(fds[0], out.data(), n), static_cast<ssize_t>(n));
    return out;
  }
};

// An INIT request (fuse_in_header + fuse_init_in) as the kernel writes it.
std::vector<char> init_request(uint64_t unique, uint32_t flags, uint32_t flags2) {
  std::vector<char> b(40 + 64, '\0');
  put<uint32_t>(b, 0, static_cast<uint32_t>(b.size()));
  put<uint32_t>(b, 4, 26);  // FUSE_INIT
  put<uint64_t>(b, 8, unique);
  put<uint32_t>(b, 40, 7);
  put<uint32_t>(b, 44, 45);
  put<uint32_t>(b, 40 + 12, flags);
  put<uint32_t>(b, 40 + 16, flags2);
  return b;
}

// Feeds `request` through device_read, then a reply (fuse_out_header + 64-byte fuse_init_out
// with flags/flags2 as libfuse fills them) through device_writev; returns the bytes written.
std::string handshake(Server& s, const std::vector<char>& request, uint64_t reply_unique,
                      int32_t error, uint32_t out_flags, uint32_t out_flags2) {
  Pipe in, out;
  EXPECT_EQ(::write(in.fds[1], request.data(), request.size()),
            static_cast<ssize_t>(request.size()));
  std::vector<char> buf(4096);
  EXPECT_EQ(device_read(in.fds[0], buf.data(), buf.size(), &s),
            static_cast<ssize_t>(request.size()));
  std::vector<char> header(16, '\0'), payload(64, '\0');
  put<uint32_t>(header, 0, 16 + 64);
  put<int32_t>(header, 4, error);
  put<uint64_t>(header, 8, reply_unique);
  put<uint32_t>(payload, 12, out_flags);
  put<uint32_t>(payload, 32, out_flags2);
  struct iovec iov[2] = {{header.data(), header.size()}, {payload.data(), payload.size()}};
  EXPECT_EQ(device_writev(out.fds[1], iov, 2, &s), 80);
  // libfuse's own copy of the reply is left as it was.
  EXPECT_EQ(std::memcmp(payload.data() + 32, &out_flags2, 4), 0);
  return out.drain(80);
}

TEST(DeviceIoTest, AsksForMmapOfDirectIoFilesWhenOffered) {
  Server s;
  const std::string reply =
      handshake(s, init_request(7, kInitExt, kAllowMmap2 | 1), 7, 0, kInitExt | 5, 0x100);
  EXPECT_EQ(get<uint32_t>(reply, 16 + 32), 0x100 | kAllowMmap2);
  EXPECT_EQ(get<uint32_t>(reply, 16 + 12), kInitExt | 5);  // the rest as libfuse wrote it
  EXPECT_TRUE(s.direct_io_mmap.offered);
  EXPECT_TRUE(s.direct_io_mmap.granted);
}

TEST(DeviceIoTest, LeavesTheReplyAloneWhenNotOffered) {
  for (const auto& [flags, flags2] : {std::pair<uint32_t, uint32_t>{kInitExt, 0},
                                      // flags2 without FUSE_INIT_EXT means nothing
                                      std::pair<uint32_t, uint32_t>{0, kAllowMmap2}}) {
    Server s;
    const std::string reply =
        handshake(s, init_request(7, flags, flags2), 7, 0, kInitExt | 5, 0x100);
    EXPECT_EQ(get<uint32_t>(reply, 16 + 32), 0x100u);
    EXPECT_FALSE(s.direct_io_mmap.granted);
  }
}

TEST(DeviceIoTest, LeavesErrorsAndOtherRepliesAlone) {
  {
    Server s;  // INIT refused by libfuse
    const std::string reply =
        handshake(s, init_request(7, kInitExt, kAllowMmap2), 7, -EPROTO, kInitExt, 0);
    EXPECT_EQ(get<uint32_t>(reply, 16 + 32), 0u);
    EXPECT_FALSE(s.direct_io_mmap.granted);
  }
  {
    Server s;  // a reply to another request
    const std::string reply =
        handshake(s, init_request(7, kInitExt, kAllowMmap2), 8, 0, kInitExt, 0);
    EXPECT_EQ(get<uint32_t>(reply, 16 + 32), 0u);
    EXPECT_FALSE(s.direct_io_mmap.granted);
  }
  {
    Server s;  // a reply without FUSE_INIT_EXT has no flags2 the kernel would read
    const std::string reply = handshake(s, init_request(7, kInitExt, kAllowMmap2), 7, 0, 5, 0);
    EXPECT_EQ(get<uint32_t>(reply, 16 + 32), 0u);
    EXPECT_FALSE(s.direct_io_mmap.granted);
  }
}

// The kernel answers ECONNABORTED when the connection is shut down as it hands a reader a
// request, which no test can time. It answers the same to every read once the connection is
// aborted through fusectl, if INIT's reply asked for FUSE_ABORT_ERROR: this test mounts a bare
// connection, answers INIT so, aborts it, and reads.
TEST(DeviceIoTest, AReadOfAShutDownConnectionFailsWithEnodev) {
  if (::geteuid() != 0 || ::access("/dev/fuse", R_OK | W_OK) != 0)
    GTEST_SKIP() << "needs root and /dev/fuse";
  const testsupport::TempDir dir;
  const std::filesystem::path mnt = dir.path() / "mnt", ctl = dir.path() / "ctl";
  std::filesystem::create_directory(mnt);
  std::filesystem::create_directory(ctl);
  const int dev = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
  ASSERT_GE(dev, 0);
  const std::string options = "fd=" + std::to_string(dev) + ",rootmode=40000,user_id=0,group_id=0";
  ASSERT_EQ(::mount("ckptfs-test", mnt.c_str(), "fuse.ckptfs-test", MS_RDONLY | MS_NOSUID,
                    options.c_str()),
            0)
      << std::strerror(errno);

  std::vector<char> buf(size_t{1} << 20);
  ASSERT_GE(::read(dev, buf.data(), buf.size()), static_cast<ssize_t>(sizeof(fuse_in_header)));
  fuse_in_header in;
  std::memcpy(&in, buf.data(), sizeof in);
  ASSERT_EQ(in.opcode, static_cast<uint32_t>(FUSE_INIT));
  struct {
    fuse_out_header header;
    fuse_init_out init;
  } reply{};
  reply.header = {sizeof reply, 0, in.unique};
  reply.init.major = 7;
  reply.init.minor = 31;
  reply.init.flags = FUSE_ABORT_ERROR;
  reply.init.max_write = 4096;
  ASSERT_EQ(::write(dev, &reply, sizeof reply), static_cast<ssize_t>(sizeof reply));

  // The connection's number is the minor of the mount's device (mountinfo's third field).
  std::string id;
  std::ifstream mountinfo("/proc/self/mountinfo");
  for (std::string line; std::getline(mountinfo, line);) {
    std::istringstream fields(line);
    std::string mount_id, parent, device, root, path;
    fields >> mount_id >> parent >> device >> root >> path;
    if (path == mnt.native()) id = device.substr(device.find(':') + 1);
  }
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(::mount("fusectl", ctl.c_str(), "fusectl", 0, nullptr), 0) << std::strerror(errno);
  std::ofstream(ctl / id / "abort") << "1";
  ::umount2(ctl.c_str(), MNT_DETACH);

  errno = 0;
  EXPECT_EQ(::read(dev, buf.data(), buf.size()), -1);
  EXPECT_EQ(errno, ECONNABORTED) << "the kernel no longer answers as this test assumes";
  Server s;
  errno = 0;
  EXPECT_EQ(device_read(dev, buf.data(), buf.size(), &s), -1);
  EXPECT_EQ(errno, ENODEV);

  EXPECT_EQ(::umount2(mnt.c_str(), MNT_DETACH), 0);
  ::close(dev);
}

}  // namespace
}  // namespace ckptfs::fs::detail
