// MT_UNDER_ASAN is defined when this translation unit is built with AddressSanitizer, by GCC
// (which defines __SANITIZE_ADDRESS__) or by clang (which answers __has_feature instead): the
// asan preset builds with clang, the fuzz preset too, and a user may build either way.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define MT_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MT_UNDER_ASAN 1
#endif
#endif
