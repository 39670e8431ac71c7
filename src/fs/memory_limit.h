// The memory this process may use: the machine's, or less where a control group limits it (a
// container's memory.max): sizing a cache from the machine's memory alone got a daemon in a
// 4 GiB container a bound of 1 GiB of a 256 GiB host's. Thread-safe; never throws.
#pragma once

#include <cstdint>
#include <filesystem>

namespace ckptfs::fs {

// The least of the machine's memory and the limits of this process's memory group and of every
// group above it (cgroup v2 memory.max, v1 memory.limit_in_bytes); 0 if the machine's memory
// cannot be read. `proc_cgroup` and `cgroup_root` are the files the kernel shows, or a test's.
uint64_t memory_limit(const std::filesystem::path& proc_cgroup = "/proc/self/cgroup",
                      const std::filesystem::path& cgroup_root = "/sys/fs/cgroup");

}  // namespace ckptfs::fs
