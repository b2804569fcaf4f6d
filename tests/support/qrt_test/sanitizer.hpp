#pragma once
// Whether this test program was built with a sanitizer (tools/dev/
// sanitizers.sh: -DQRT_SANITIZE for ASan+UBSan, -DQRT_SANITIZE_THREAD for
// TSan), for the tests that must know: a check the sanitizer makes
// meaningless (mlockall, operator new), or a workload sized for the plain
// build that instrumentation makes several times slower.  GCC says so with
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang with __has_feature.
// QRT_TEST_SANITIZED is defined for code that must be left out (#ifdef).

#if defined(__SANITIZE_ADDRESS__)
#define QRT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QRT_TEST_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define QRT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QRT_TEST_TSAN 1
#endif
#endif

#if defined(QRT_TEST_ASAN) || defined(QRT_TEST_TSAN)
#define QRT_TEST_SANITIZED 1
#endif

namespace qrt::testing {

#ifdef QRT_TEST_ASAN
inline constexpr bool address_sanitized = true;
#else
inline constexpr bool address_sanitized = false;
#endif
#ifdef QRT_TEST_TSAN
inline constexpr bool thread_sanitized = true;
#else
inline constexpr bool thread_sanitized = false;
#endif
inline constexpr bool sanitized = address_sanitized || thread_sanitized;

}  // namespace qrt::testing
