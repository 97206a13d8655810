#include "sluice/common/recycling_allocator.hpp"

#include <new>

namespace sluice {

static_assert(alignof(std::max_align_t) <= BlockCache::kGranule);

namespace {

// 0 for 1..32 bytes, 1 for 33..64, ...
std::size_t class_of(std::size_t bytes) { return (bytes - 1) / BlockCache::kGranule; }

}  // namespace

BlockCache::~BlockCache() {
  for (auto* head : heads_) {
    while (head != nullptr) {
      auto* next = head->next;
      ::operator delete(head);
      head = next;
    }
  }
}

void* BlockCache::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > kLargestBlock) return ::operator new(bytes);
  const auto size_class = class_of(bytes);
  if (auto* block = heads_[size_class]) {
    heads_[size_class] = block->next;
    --counts_[size_class];
    return block;
  }
  return ::operator new((size_class + 1) * kGranule);
}

void BlockCache::deallocate(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  if (bytes == 0 || bytes > kLargestBlock) {
    ::operator delete(block);
    return;
  }
  const auto size_class = class_of(bytes);
  if (counts_[size_class] >= kKeptPerClass) {
    ::operator delete(block);
    return;
  }
  heads_[size_class] = new (block) FreeBlock{heads_[size_class]};
  ++counts_[size_class];
}

std::size_t BlockCache::kept() const {
  std::size_t total = 0;
  for (auto count : counts_) total += count;
  return total;
}

BlockCache& BlockCache::local() {
  thread_local BlockCache cache;
  return cache;
}

}  // namespace sluice
