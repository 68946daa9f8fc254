// The fuzz targets' input file: libFuzzer hands a target bytes, the parsers read paths. The bytes
// go into one anonymous in-memory file (memfd) per process, rewritten for every input and named
// by /proc/self/fd/N, so no input touches the disk and nothing is left behind.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mt::fuzz {

// The path of a file holding exactly `data` (valid until the next call).
inline const std::string& input_file(const uint8_t* data, size_t size) {
    static const int fd = [] {
        const int d = memfd_create("mt-fuzz-input", MFD_CLOEXEC);
        if (d < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        return d;
    }();
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (ftruncate(fd, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
        const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
        if (n <= 0) std::abort();
        done += static_cast<size_t>(n);
    }
    return path;
}

}  // namespace mt::fuzz
