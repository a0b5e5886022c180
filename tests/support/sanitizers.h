#pragma once
// Whether this test binary runs under AddressSanitizer or ThreadSanitizer: their runtimes reserve
// terabytes of address space, so tests that cap RLIMIT_AS skip themselves there.

namespace cpf::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace cpf::testing
