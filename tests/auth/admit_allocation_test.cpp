// admit() runs for every request, so an allowed request must not touch the
// heap. This file replaces the global operator new for the whole auth test
// binary to count allocations per thread, and routes OpenSSL's allocations
// through a counter too (the hashing happens inside OpenSSL).

#include <openssl/crypto.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>

#include "sluice/auth/stage.hpp"

namespace {

thread_local std::size_t heap_allocations = 0;

void* counted_allocation(std::size_t size) {
  ++heap_allocations;
  if (void* memory = std::malloc(size == 0 ? 1 : size)) return memory;
  throw std::bad_alloc();
}

void* counted_aligned_allocation(std::size_t size, std::align_val_t alignment) {
  ++heap_allocations;
  auto align = static_cast<std::size_t>(alignment);
  std::size_t rounded = (std::max<std::size_t>(size, 1) + align - 1) / align * align;
  if (void* memory = std::aligned_alloc(align, rounded)) return memory;
  throw std::bad_alloc();
}

void* openssl_malloc(std::size_t size, const char*, int) {
  ++heap_allocations;
  return std::malloc(size);
}

void* openssl_realloc(void* memory, std::size_t size, const char*, int) {
  ++heap_allocations;
  return std::realloc(memory, size);
}

void openssl_free(void* memory, const char*, int) { std::free(memory); }

// Must run before OpenSSL allocates anything, hence a static initializer;
// false when something in the process beat us to it.
const bool kOpenSslCounted =
    CRYPTO_set_mem_functions(openssl_malloc, openssl_realloc, openssl_free) == 1;

}  // namespace

void* operator new(std::size_t size) { return counted_allocation(size); }
void* operator new[](std::size_t size) { return counted_allocation(size); }
void* operator new(std::size_t size, std::align_val_t alignment) {
  return counted_aligned_allocation(size, alignment);
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return counted_aligned_allocation(size, alignment);
}
// The nothrow forms too, so that nothing the toolchain's own operator new
// allocated is handed to free.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  ++heap_allocations;
  return std::malloc(std::max<std::size_t>(size, 1));
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* memory, const std::nothrow_t&) noexcept { std::free(memory); }
void operator delete[](void* memory, const std::nothrow_t&) noexcept { std::free(memory); }
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete[](void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete(void* memory, std::align_val_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::align_val_t) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t, std::align_val_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t, std::align_val_t) noexcept { std::free(memory); }

namespace sluice::auth {
namespace {

using namespace std::chrono_literals;

class AdmitAllocations : public testing::Test {
 protected:
  void SetUp() override {
    config_ = config::load_string(
        "auth:\n"
        "  keys:\n"
        "    - name: decoy\n"
        "      key: sk-decoy-key-0000\n"
        "    - name: busy\n"
        "      key: sk-busy-key-1234\n"
        "      models: [\"gpt-4o-mini\", \"chat-*\"]\n"
        "      rpm: 600\n"
        "      tpm: 200000\n"
        "      max_parallel: 16\n"
        "models:\n"
        "  - name: chat-fast\n"
        "    deployments:\n"
        "      - base_url: http://127.0.0.1:8000\n",
        [](const std::string&) -> std::optional<std::string> { return std::nullopt; });
    stage_ = std::make_unique<AuthStage>(*config_, nullptr);
  }

  config::ConfigPtr config_;
  std::unique_ptr<AuthStage> stage_;
};

TEST_F(AdmitAllocations, CountingWorks) {
  std::size_t before = heap_allocations;
  auto* probe = new int(1);
  EXPECT_EQ(heap_allocations, before + 1);
  delete probe;
}

TEST_F(AdmitAllocations, AllowedRequestAllocatesNothing) {
  if (!kOpenSslCounted) {
    std::cerr << "note: OpenSSL allocated before this test could count; counting operator new only"
              << std::endl;
  }
  const TimePoint now = TimePoint{} + 1h;
  const AuthRequest request{"sk-busy-key-1234", "chat-fast", 1200, now};
  // Warm-up, so one-time initialisation anywhere below does not count.
  stage_->complete(stage_->admit(request), 900, now);

  std::size_t before = heap_allocations;
  for (int round = 0; round < 100; ++round) {
    Admission admission = stage_->admit(request);
    ASSERT_TRUE(admission.allowed());
    stage_->complete(admission, 900, now + 1ms);
  }
  EXPECT_EQ(heap_allocations, before);
}

TEST_F(AdmitAllocations, RenderingIntoReservedSpaceAllocatesNothing) {
  const TimePoint now = TimePoint{} + 1h;
  Admission admission = stage_->admit({"sk-busy-key-1234", "gpt-4o-mini", 1200, now});
  ASSERT_TRUE(admission.allowed());
  std::string out;
  out.reserve(512);
  std::size_t before = heap_allocations;
  admission.append_headers(out);
  EXPECT_EQ(heap_allocations, before);
  EXPECT_FALSE(out.empty());
}

TEST_F(AdmitAllocations, ErrorsMayAllocate) {
  // The counter is not stuck at zero: building an error does allocate.
  std::size_t before = heap_allocations;
  Admission denied = stage_->admit({"sk-not-a-key-9999", "chat-fast", 10, TimePoint{}});
  EXPECT_FALSE(denied.allowed());
  EXPECT_GT(heap_allocations, before);
}

}  // namespace
}  // namespace sluice::auth
