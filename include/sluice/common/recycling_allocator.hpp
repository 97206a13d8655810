#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

// Small blocks recycled per thread, for the header fields of the messages a
// request parses. Beast allocates one block per field, about 18 for a
// proxied request and its response; glibc's per-thread cache keeps only 7
// blocks of a size, so most of those went through its slower general free
// path. A connection and its upstream exchanges stay on one worker thread,
// so the blocks are nearly always returned to the cache they came from.
namespace sluice {

class BlockCache {
 public:
  // Blocks are rounded up to a multiple of kGranule; larger ones than
  // kLargestBlock go to the global allocator directly.
  static constexpr std::size_t kGranule = 32;
  static constexpr std::size_t kLargestBlock = 512;
  // Per size class: beyond this many, freed blocks go back to the global
  // allocator, so an idle thread keeps at most about 68 KiB.
  static constexpr std::size_t kKeptPerClass = 16;

  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache();

  void* allocate(std::size_t bytes);
  void deallocate(void* block, std::size_t bytes) noexcept;

  // Blocks held for reuse, over all classes.
  std::size_t kept() const;

  // The calling thread's cache.
  static BlockCache& local();

 private:
  static constexpr std::size_t kClasses = kLargestBlock / kGranule;
  struct FreeBlock {
    FreeBlock* next;
  };
  std::array<FreeBlock*, kClasses> heads_{};
  std::array<std::uint8_t, kClasses> counts_{};
};

// A stateless allocator over the calling thread's BlockCache.
template <class T>
class RecyclingAllocator {
 public:
  using value_type = T;

  RecyclingAllocator() noexcept = default;
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>&) noexcept {}

  T* allocate(std::size_t count) {
    return static_cast<T*>(BlockCache::local().allocate(count * sizeof(T)));
  }
  void deallocate(T* block, std::size_t count) noexcept {
    BlockCache::local().deallocate(block, count * sizeof(T));
  }

  template <class U>
  bool operator==(const RecyclingAllocator<U>&) const noexcept {
    return true;
  }
};

// A base for objects made and destroyed once per request (an upstream
// exchange, an attempt): they come from the calling thread's BlockCache, so
// a steady stream of requests takes none from the global allocator, whose
// slower path the many sizes of a request's coroutine frames keep it on.
struct PerThreadRecycled {
  static void* operator new(std::size_t bytes) { return BlockCache::local().allocate(bytes); }
  static void operator delete(void* block, std::size_t bytes) noexcept {
    BlockCache::local().deallocate(block, bytes);
  }
};

}  // namespace sluice
