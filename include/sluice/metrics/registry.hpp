#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Counters, gauges and histograms with labels, rendered in the Prometheus
// text exposition format 0.0.4.
//
// Why our own registry and not prometheus-cpp (Debian's 1.0.1)? Measured on
// the 2-core build machine: two threads updating one labelled series, CPU
// nanoseconds per operation per thread, range over 4 runs. Our figures are
// printed by tests/metrics/registry_bench_test.cpp; prometheus-cpp ran the
// same loops (on its Counter& and Histogram& references) in one process
// with ours, outside the repository.
//
//                                        prometheus-cpp    this registry
//   counter add, handle kept             8.6 - 11.5        7.0 - 8.0
//   histogram observe, handle kept       39 - 48           17 - 20
//   counter add, labels looked up        405 - 460         about 50 (with(); not for hot paths)
//
// The machine was shared with compiles (load 7-10 on 2 cores), so the two
// threads seldom ran at the same moment: the counter figures are close
// because the cost of contention barely shows here. What decides it:
// prometheus-cpp's Histogram::Observe locks a mutex that every worker would
// share (this project's data path takes no global locks), and its Counter is
// one std::atomic<double> updated by a CAS loop that all workers fight over
// once they really run in parallel. Here each worker adds to its own cells,
// so nothing is shared on the hot path at any core count; and there is no
// extra shared library or serialiser to carry.
//
// A relaxed atomic add costs about 7 ns on this machine against about
// 0.5 ns for a plain add on a thread-owned cell. The atomic is kept anyway:
// with some 10-20 updates a request it costs well under a microsecond, and
// it keeps every count exact even when two threads share a shard (a thread
// that is not a worker, a shard index out of range).
//
// - A family's label sets are resolved once (at config load or first use) to
//   a handle; the hot path never hashes labels or takes a lock.
// - Every series has one group of cells per shard (one shard per worker
//   thread). Cells of one shard live in that shard's own 64-byte aligned
//   chunks, so a worker's updates never share a cache line with another
//   worker's, and a worker's series sit packed together.
// - A scrape sums the shards. It reads while workers keep writing, so a
//   histogram's _sum may trail its buckets by an observation or two; the
//   buckets and _count always agree, because _count is their sum.
//
// Gauges are a single atomic (set/add from anywhere); values read only at
// scrape time are callback gauges. A level that every request raises and
// lowers is a sharded gauge: a cell per shard like a counter's, summed when
// scraped, so the workers do not all write one atomic twice a request.
namespace sluice::metrics {

namespace detail {

using Cell = std::atomic<std::uint64_t>;

// Storage for every series' cells, shard by shard. Allocation happens only
// when a series is created; cells are never freed before the registry.
class CellArena {
 public:
  static constexpr std::size_t kChunkCells = 512;  // 4 KiB per shard and chunk

  explicit CellArena(unsigned shards);
  ~CellArena();
  CellArena(const CellArena&) = delete;
  CellArena& operator=(const CellArena&) = delete;

  unsigned shards() const { return shards_; }
  // `count` consecutive zeroed cells in every shard; element i of the result
  // points at shard i's first cell. count <= kChunkCells.
  std::unique_ptr<Cell*[]> allocate(std::size_t count);

 private:
  struct alignas(64) Chunk {
    Cell cells[kChunkCells];
  };

  unsigned shards_;
  std::mutex mutex_;
  std::vector<std::vector<std::unique_ptr<Chunk>>> chunks_;  // [shard][chunk]
  std::size_t used_in_last_chunk_ = kChunkCells;             // the same in every shard
};

// A shard index past the last shard is folded onto the last one: sharing a
// shard only costs contention, never a lost update.
inline unsigned clamp_shard(unsigned shard, unsigned last_shard) {
  return shard < last_shard ? shard : last_shard;
}

class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  virtual std::string_view type() const = 0;
  // Appends the HELP and TYPE lines and every series.
  void render(std::string& out) const;

 protected:
  virtual void render_series(std::string& out) const = 0;
  // Throws std::invalid_argument unless there is one value per label name.
  void check_label_count(std::size_t count) const;

  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  mutable std::mutex mutex_;  // guards the series maps of derived families
};

}  // namespace detail

using LabelValues = std::vector<std::string>;
using Labels = std::vector<std::pair<std::string, std::string>>;

// 19 bounds from 100 µs to 60 s (plus +Inf): latencies of a gateway hop up to
// a long completion.
std::vector<double> default_latency_buckets();

// A handle is a small value: copy it freely. A default-constructed handle is
// unbound and ignores updates. `shard` is the calling worker's index.
class CounterHandle {
 public:
  CounterHandle() = default;
  void add(unsigned shard, std::uint64_t amount = 1) const {
    if (cells_ == nullptr) return;
    cells_[detail::clamp_shard(shard, last_shard_)]->fetch_add(amount, std::memory_order_relaxed);
  }
  // Sum over all shards, as a scrape would see it.
  std::uint64_t value() const;
  bool bound() const { return cells_ != nullptr; }

 private:
  friend class CounterFamily;
  friend class Registry;  // the cells of a sharded gauge
  CounterHandle(detail::Cell* const* cells, unsigned last_shard)
      : cells_(cells), last_shard_(last_shard) {}
  detail::Cell* const* cells_ = nullptr;
  unsigned last_shard_ = 0;
};

class GaugeHandle {
 public:
  GaugeHandle() = default;
  void set(double value) const {
    if (value_ != nullptr) value_->store(value, std::memory_order_relaxed);
  }
  void add(double delta) const {
    if (value_ != nullptr) value_->fetch_add(delta, std::memory_order_relaxed);
  }
  void sub(double delta) const { add(-delta); }
  double value() const { return value_ == nullptr ? 0.0 : value_->load(std::memory_order_relaxed); }
  bool bound() const { return value_ != nullptr; }

 private:
  friend class GaugeFamily;
  explicit GaugeHandle(std::atomic<double>* value) : value_(value) {}
  std::atomic<double>* value_ = nullptr;
};

// A gauge moved by steps from the workers: a counter's cells, one per
// shard, holding two's-complement deltas, so that their unsigned sum wraps
// to the signed level even when one shard only ever raises it and another
// only lowers it.
class ShardedGaugeHandle {
 public:
  ShardedGaugeHandle() = default;
  void add(unsigned shard, std::int64_t delta = 1) const {
    steps_.add(shard, static_cast<std::uint64_t>(delta));
  }
  void sub(unsigned shard, std::int64_t delta = 1) const { add(shard, -delta); }
  // Sum over all shards, as a scrape would see it.
  std::int64_t value() const { return static_cast<std::int64_t>(steps_.value()); }
  bool bound() const { return steps_.bound(); }

 private:
  friend class Registry;
  explicit ShardedGaugeHandle(CounterHandle steps) : steps_(steps) {}
  CounterHandle steps_;
};

class HistogramHandle {
 public:
  HistogramHandle() = default;
  // Cells per shard: one per bound, one for +Inf, then the sum (as the bits
  // of a double). The count is the buckets' sum, computed when scraped.
  void observe(unsigned shard, double value) const {
    if (cells_ == nullptr || value != value) return;  // NaN would poison the sum
    detail::Cell* cells = cells_[detail::clamp_shard(shard, last_shard_)];
    std::size_t bucket = 0;
    while (bucket < bound_count_ && value > bounds_[bucket]) ++bucket;
    cells[bucket].fetch_add(1, std::memory_order_relaxed);
    detail::Cell& sum = cells[bound_count_ + 1];
    std::uint64_t seen = sum.load(std::memory_order_relaxed);
    while (!sum.compare_exchange_weak(
        seen, std::bit_cast<std::uint64_t>(std::bit_cast<double>(seen) + value),
        std::memory_order_relaxed)) {
    }
  }
  struct Snapshot {
    std::vector<std::uint64_t> buckets;  // per bucket (not cumulative), +Inf last
    std::uint64_t count = 0;
    double sum = 0;
  };
  Snapshot snapshot() const;
  bool bound() const { return cells_ != nullptr; }

 private:
  friend class HistogramFamily;
  HistogramHandle(detail::Cell* const* cells, unsigned last_shard, const double* bounds,
                  std::size_t bound_count)
      : cells_(cells), bounds_(bounds), bound_count_(bound_count), last_shard_(last_shard) {}
  detail::Cell* const* cells_ = nullptr;
  const double* bounds_ = nullptr;
  std::size_t bound_count_ = 0;
  unsigned last_shard_ = 0;
};

// with() finds or creates the series for one set of label values (one value
// per label name, in order) under the family's mutex: call it when a config
// is loaded or on first use and keep the handle, not per request.
class CounterFamily final : public detail::Family {
 public:
  CounterFamily(detail::CellArena& arena, std::string name, std::string help,
                std::vector<std::string> label_names);
  CounterHandle with(std::initializer_list<std::string_view> label_values);
  CounterHandle with(const LabelValues& label_values);
  std::string_view type() const override { return "counter"; }

 private:
  CounterHandle with_key(LabelValues key);
  void render_series(std::string& out) const override;
  detail::CellArena& arena_;
  std::map<LabelValues, std::unique_ptr<detail::Cell*[]>> series_;
};

class GaugeFamily final : public detail::Family {
 public:
  using detail::Family::Family;
  GaugeHandle with(std::initializer_list<std::string_view> label_values);
  GaugeHandle with(const LabelValues& label_values);
  std::string_view type() const override { return "gauge"; }

 private:
  GaugeHandle with_key(LabelValues key);
  void render_series(std::string& out) const override;
  std::map<LabelValues, std::unique_ptr<std::atomic<double>>> series_;
};

class HistogramFamily final : public detail::Family {
 public:
  static constexpr std::size_t kMaxBounds = 256;

  // `bounds`: strictly increasing and finite; +Inf is implied.
  HistogramFamily(detail::CellArena& arena, std::string name, std::string help,
                  std::vector<std::string> label_names, std::vector<double> bounds);
  HistogramHandle with(std::initializer_list<std::string_view> label_values);
  HistogramHandle with(const LabelValues& label_values);
  const std::vector<double>& bounds() const { return bounds_; }
  std::string_view type() const override { return "histogram"; }

 private:
  HistogramHandle with_key(LabelValues key);
  void render_series(std::string& out) const override;
  detail::CellArena& arena_;
  std::vector<double> bounds_;
  std::map<LabelValues, std::unique_ptr<detail::Cell*[]>> series_;
};

// One series of a gauge whose value is read at scrape time.
struct GaugeSample {
  LabelValues label_values;
  double value = 0;
};
// Fills `out` with the current series; runs on the scraping thread.
using GaugeCollector = std::function<void(std::vector<GaugeSample>& out)>;

class CallbackGaugeFamily final : public detail::Family {
 public:
  using detail::Family::Family;
  void add_series(LabelValues label_values, std::function<double()> read);
  void add_collector(GaugeCollector collect);
  std::string_view type() const override { return "gauge"; }

 private:
  void render_series(std::string& out) const override;
  std::vector<std::pair<LabelValues, std::function<double()>>> series_;
  std::vector<GaugeCollector> collectors_;
};

class Registry {
 public:
  // `shards`: how many threads update metrics (the worker count); at least 1.
  explicit Registry(unsigned shards);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  unsigned shards() const { return arena_.shards(); }

  // Registering a name again with the same kind and labels (and bounds)
  // returns the existing family; any other clash, or a name or label name
  // Prometheus does not allow, throws std::invalid_argument.
  CounterFamily& counter(std::string name, std::string help,
                         std::vector<std::string> label_names = {});
  GaugeFamily& gauge(std::string name, std::string help, std::vector<std::string> label_names = {});
  HistogramFamily& histogram(std::string name, std::string help,
                             std::vector<std::string> label_names = {},
                             std::vector<double> bounds = default_latency_buckets());

  // A gauge series read at scrape time; calls with the same name add series
  // to one family (their label names must match).
  void gauge_callback(std::string name, std::string help, Labels labels,
                      std::function<double()> read);
  // A gauge family whose whole set of series is produced at scrape time
  // (e.g. one per deployment of the current config).
  void gauge_collector(std::string name, std::string help, std::vector<std::string> label_names,
                       GaugeCollector collect);
  // A gauge series kept per shard (see ShardedGaugeHandle), rendered as a
  // callback gauge. The same name and labels again return the same series.
  ShardedGaugeHandle sharded_gauge(std::string name, std::string help, Labels labels = {});

  // Prometheus text format 0.0.4, families sorted by name. Callbacks run on
  // the calling thread and must not register metrics.
  std::string render() const;
  void render(std::string& out) const;

 private:
  template <class FamilyType, class... Args>
  FamilyType& find_or_add(const std::string& name, const std::vector<std::string>& label_names,
                          Args&&... args);

  detail::CellArena arena_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<detail::Family>, std::less<>> families_;
  // Cells of the sharded gauges by name and label values; guarded by mutex_.
  std::map<std::pair<std::string, LabelValues>, std::unique_ptr<detail::Cell*[]>> sharded_gauges_;
};

// Prometheus text helpers, exposed for the tests and for other exporters.
bool is_valid_metric_name(std::string_view name);
bool is_valid_label_name(std::string_view name);
// Appends `value` with \\, \" and \n escaped (label values).
void append_escaped_label_value(std::string& out, std::string_view value);
// Go-compatible float text: shortest round-trip form, +Inf, -Inf, NaN.
void append_prometheus_double(std::string& out, double value);

}  // namespace sluice::metrics
