// Large host buffers on 2 MiB pages: Linux's transparent huge pages, asked for by madvise.
//
// Why: a page-table entry covers 4 KiB, and the CPU caches a few thousand of them (Zen 4: 72 in
// the L1 TLB, 3072 in the L2 TLB). The packed GEMM reads its operands with large strides: the LM
// head's backward packs dlogits (N, Vp), 206 MB at gpt2-mini B4 T256, whose rows are 201 KB apart,
// so every row of a panel is a new page, a few hundred per panel; the forward's logits, the
// activations and the optimizer's sweeps over 64 MB of parameters and moments touch a new 4 KiB
// page every 1024 floats. A 2 MiB page takes 512 times fewer entries and page walks. Measured
// on the 2-core EPYC VM (bench/README.md, "Huge pages"): the gpt2-mini step 3-5 % faster on the
// avx2 level and 1-3 % on avx512, for 11 MiB more peak resident memory.
//
// How: a buffer of 2 MiB or more is aligned to 2 MiB and marked MADV_HUGEPAGE; the kernel backs
// it with huge pages when THP is "madvise" (Debian's and Ubuntu's default) or "always", and
// ignores the advice when it is "never". Nothing is reserved (no hugetlbfs, nothing to
// configure); a buffer the kernel cannot back with huge pages gets 4 KiB pages, as without it.
// MT_CPU_HUGE_PAGES=0 turns the advice off (to measure what it buys); results.json's
// `environment.huge_pages` says what ran.
#pragma once

#include <cstddef>
#include <string>

namespace mt {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64's 2 MiB page

struct HugePagePolicy {
    bool advise = false;  // mark buffers of kHugePageBytes or more MADV_HUGEPAGE
    std::string text;     // for the report, e.g. "2 MiB pages for buffers >= 2 MiB (THP: madvise)"
};

// The policy for an MT_CPU_HUGE_PAGES value (nullptr or "": unset) and the content of
// /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never"; "" when unreadable).
// Throws BackendError for a value other than 0 or 1, naming the variable and both values.
HugePagePolicy huge_page_policy_for(const char* env_value, const std::string& thp_enabled);

// The kernel's THP setting: the content of /sys/kernel/mm/transparent_hugepage/enabled, or ""
// when it cannot be read.
std::string transparent_huge_page_setting();

// This process's policy, read once from its environment and the kernel.
const HugePagePolicy& huge_page_policy();

// `bytes` (rounded up to `alignment`, a power of two) aligned to `alignment`, or to
// kHugePageBytes and advised when the policy says so and bytes >= kHugePageBytes. nullptr when
// out of memory; std::free() releases it.
void* allocate_host_buffer(size_t bytes, size_t alignment);

// Bytes of this process's anonymous memory on huge pages now (AnonHugePages of
// /proc/self/smaps_rollup), or -1 when the kernel does not say: what the advice obtained.
long long huge_page_resident_bytes();

}  // namespace mt
