// The libfuse low-level callbacks: a thin translation from kernel requests to calls on a
// Service (service.h), which holds everything FUSE-free. Private to the fs module (mount.cc
// builds the session around it).
#pragma once

// 3.12 is the first API version with fuse_loop_cfg_*, which lets mount.cc bound the thread pool.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "service.h"

namespace ckptfs::fs::detail {

// What the INIT exchange settled about FUSE_DIRECT_IO_ALLOW_MMAP (device_io.h). Written by the
// thread that answers INIT before the kernel sends anything else.
struct DirectIoMmap {
  std::atomic<uint64_t> init_unique{0};  // the INIT request being answered (0: none pending)
  std::atomic<bool> offered{false};      // the kernel offers the flag
  std::atomic<bool> granted{false};      // our INIT reply asked for it: direct_io files map
};

// The session's userdata. `service` is set before the session starts and read-only from then
// on (it synchronizes itself); `direct_io_mmap` is settled at INIT, before any other request.
struct Server {
  std::unique_ptr<Service> service;
  DirectIoMmap direct_io_mmap;
};

const fuse_lowlevel_ops& lowlevel_ops();

}  // namespace ckptfs::fs::detail
