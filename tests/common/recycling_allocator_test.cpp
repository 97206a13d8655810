#include <gtest/gtest.h>

#include <boost/beast/http/fields.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sluice/common/recycling_allocator.hpp"

namespace sluice {
namespace {

TEST(BlockCache, AFreedBlockIsReusedForTheSameSizeClass) {
  BlockCache cache;
  void* first = cache.allocate(40);
  cache.deallocate(first, 40);
  EXPECT_EQ(cache.kept(), 1u);
  // 33..64 bytes share a class.
  EXPECT_EQ(cache.allocate(60), first);
  EXPECT_EQ(cache.kept(), 0u);
  cache.deallocate(first, 60);
}

TEST(BlockCache, SizeClassesAreKeptApart) {
  BlockCache cache;
  void* small = cache.allocate(16);
  cache.deallocate(small, 16);
  void* larger = cache.allocate(100);
  EXPECT_NE(larger, small);
  EXPECT_EQ(cache.kept(), 1u);
  cache.deallocate(larger, 100);
  EXPECT_EQ(cache.kept(), 2u);
}

TEST(BlockCache, LargeBlocksAreNotKept) {
  BlockCache cache;
  void* large = cache.allocate(BlockCache::kLargestBlock + 1);
  std::memset(large, 0xab, BlockCache::kLargestBlock + 1);
  cache.deallocate(large, BlockCache::kLargestBlock + 1);
  EXPECT_EQ(cache.kept(), 0u);
}

TEST(BlockCache, KeepsABoundedNumberPerClass) {
  BlockCache cache;
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < 3 * BlockCache::kKeptPerClass; ++i)
    blocks.push_back(cache.allocate(48));
  for (void* block : blocks) cache.deallocate(block, 48);
  EXPECT_EQ(cache.kept(), BlockCache::kKeptPerClass);
}

TEST(BlockCache, BlocksAreUsableToTheirFullSize) {
  BlockCache cache;
  std::vector<std::pair<char*, std::size_t>> blocks;
  for (std::size_t size = 1; size <= BlockCache::kLargestBlock; size += 7) {
    auto* block = static_cast<char*>(cache.allocate(size));
    std::memset(block, static_cast<int>(size & 0xff), size);
    blocks.emplace_back(block, size);
  }
  for (auto [block, size] : blocks) {
    for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(block[i], static_cast<char>(size & 0xff));
    cache.deallocate(block, size);
  }
}

TEST(RecyclingAllocator, HoldsBeastHeaderFields) {
  using Fields = boost::beast::http::basic_fields<RecyclingAllocator<char>>;
  const auto kept_before = BlockCache::local().kept();
  {
    Fields fields;
    fields.set("Content-Type", "application/json");
    fields.set("x-request-id", std::string(300, 'r'));
    fields.insert("Set-Cookie", "a=1");
    fields.insert("Set-Cookie", "b=2");
    EXPECT_EQ(fields["content-type"], "application/json");
    EXPECT_EQ(fields.count("set-cookie"), 2u);
    EXPECT_EQ(fields["x-request-id"].size(), 300u);
    fields.erase("x-request-id");
    EXPECT_EQ(fields.count("x-request-id"), 0u);
  }
  // Every field's block went back to this thread's cache.
  EXPECT_GT(BlockCache::local().kept(), kept_before);
}

TEST(RecyclingAllocator, EachThreadHasItsOwnCache) {
  BlockCache* main_cache = &BlockCache::local();
  BlockCache* other_cache = nullptr;
  std::thread([&] {
    other_cache = &BlockCache::local();
    RecyclingAllocator<char> allocator;
    char* block = allocator.allocate(64);
    allocator.deallocate(block, 64);
    EXPECT_EQ(BlockCache::local().kept(), 1u);
  }).join();
  EXPECT_NE(other_cache, main_cache);
}

}  // namespace
}  // namespace sluice
