// Large host buffers on transparent huge pages (see huge_pages.h).
#include "kernels/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/types.h"

namespace mt {

namespace {

constexpr const char* kThpEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled";

// The bracketed word of "always [madvise] never", or "" when there is none.
std::string selected_mode(const std::string& thp_enabled) {
    const size_t open = thp_enabled.find('['), close = thp_enabled.find(']');
    if (open == std::string::npos || close == std::string::npos || close < open) return "";
    return thp_enabled.substr(open + 1, close - open - 1);
}

}  // namespace

HugePagePolicy huge_page_policy_for(const char* env_value, const std::string& thp_enabled) {
    const std::string value = env_value ? env_value : "";
    if (!value.empty() && value != "0" && value != "1")
        throw BackendError("MT_CPU_HUGE_PAGES=" + value +
                           ": expected 1 (2 MiB transparent huge pages for the CPU backend's "
                           "buffers of 2 MiB or more, the default) or 0 (4 KiB pages only); set "
                           "one of those or unset it");
    if (value == "0") return {false, "off (MT_CPU_HUGE_PAGES=0)"};
    const std::string mode = selected_mode(thp_enabled);
    if (mode == "never")
        return {false, "off: the kernel's transparent huge pages are disabled (" +
                           std::string(kThpEnabledPath) + ": never)"};
    if (mode.empty())
        return {true,
                "advised, effect unknown (no THP mode in " + std::string(kThpEnabledPath) + ")"};
    return {true, "2 MiB pages for buffers of 2 MiB or more (THP: " + mode + ")"};
}

std::string transparent_huge_page_setting() {
    std::ifstream f(kThpEnabledPath);
    std::stringstream text;
    text << f.rdbuf();
    return f ? text.str() : "";
}

const HugePagePolicy& huge_page_policy() {
    static const HugePagePolicy policy =
        huge_page_policy_for(std::getenv("MT_CPU_HUGE_PAGES"), transparent_huge_page_setting());
    return policy;
}

void* allocate_host_buffer(size_t bytes, size_t alignment) {
    const bool huge = bytes >= kHugePageBytes && huge_page_policy().advise;
    const size_t align = huge ? std::max(alignment, kHugePageBytes) : alignment;
    const size_t rounded = std::max(align, (bytes + align - 1) / align * align);
    void* p = std::aligned_alloc(align, rounded);
#if defined(MADV_HUGEPAGE)
    // Advice only: a failure (an old kernel, a sandbox) leaves the buffer on 4 KiB pages.
    if (p && huge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

long long huge_page_resident_bytes() {
    std::ifstream f("/proc/self/smaps_rollup");
    std::string key;
    long long kib = 0;
    std::string unit;
    while (f >> key) {
        if (key == "AnonHugePages:" && f >> kib >> unit) return kib * 1024;
        f.ignore(1 << 12, '\n');
    }
    return -1;
}

}  // namespace mt
