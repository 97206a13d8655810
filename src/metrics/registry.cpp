#include "sluice/metrics/registry.hpp"

#include <charconv>
#include <cmath>
#include <stdexcept>
#include <type_traits>

namespace sluice::metrics {

namespace detail {

CellArena::CellArena(unsigned shards) : shards_(std::max(shards, 1u)), chunks_(shards_) {}

CellArena::~CellArena() = default;

std::unique_ptr<Cell* []> CellArena::allocate(std::size_t count) {
  if (count == 0 || count > kChunkCells) {
    throw std::invalid_argument("metrics: a series needs 1 to 512 cells");
  }
  std::lock_guard lock(mutex_);
  if (used_in_last_chunk_ + count > kChunkCells) {
    for (auto& shard_chunks : chunks_) {
      auto chunk = std::make_unique<Chunk>();
      for (Cell& cell : chunk->cells) cell.store(0, std::memory_order_relaxed);
      shard_chunks.push_back(std::move(chunk));
    }
    used_in_last_chunk_ = 0;
  }
  auto first_cells = std::make_unique<Cell*[]>(shards_);
  for (unsigned shard = 0; shard < shards_; ++shard) {
    first_cells[shard] = chunks_[shard].back()->cells + used_in_last_chunk_;
  }
  used_in_last_chunk_ += count;
  return first_cells;
}

Family::Family(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

void Family::check_label_count(std::size_t count) const {
  if (count != label_names_.size()) {
    throw std::invalid_argument("metrics: " + name_ + " takes " +
                                std::to_string(label_names_.size()) + " label values, got " +
                                std::to_string(count));
  }
}

namespace {

void append_help_text(std::string& out, std::string_view text) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

}  // namespace

void Family::render(std::string& out) const {
  out += "# HELP ";
  out += name_;
  out += ' ';
  append_help_text(out, help_);
  out += "\n# TYPE ";
  out += name_;
  out += ' ';
  out += type();
  out += '\n';
  render_series(out);
}

}  // namespace detail

namespace {

using detail::Cell;

std::uint64_t sum_over_shards(Cell* const* cells, unsigned shards, std::size_t offset) {
  std::uint64_t total = 0;
  for (unsigned shard = 0; shard < shards; ++shard) {
    total += cells[shard][offset].load(std::memory_order_relaxed);
  }
  return total;
}

// `name{a="x",b="y"[,extra_name="extra_value"]} ` (no braces without labels).
void append_series_name(std::string& out, std::string_view name, std::string_view suffix,
                        const std::vector<std::string>& label_names, const LabelValues& values,
                        std::string_view extra_name = {}, std::string_view extra_value = {}) {
  out += name;
  out += suffix;
  const bool has_extra = !extra_name.empty();
  if (!label_names.empty() || has_extra) {
    out += '{';
    for (std::size_t i = 0; i < label_names.size(); ++i) {
      if (i > 0) out += ',';
      out += label_names[i];
      out += "=\"";
      append_escaped_label_value(out, values[i]);
      out += '"';
    }
    if (has_extra) {
      if (!label_names.empty()) out += ',';
      out += extra_name;
      out += "=\"";
      append_escaped_label_value(out, extra_value);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
}

void append_unsigned(std::string& out, std::uint64_t value) {
  char buffer[24];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

LabelValues to_key(std::initializer_list<std::string_view> values) {
  LabelValues key;
  key.reserve(values.size());
  for (std::string_view value : values) key.emplace_back(value);
  return key;
}

}  // namespace

std::vector<double> default_latency_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    20,   30,    60};
}

std::uint64_t CounterHandle::value() const {
  return cells_ == nullptr ? 0 : sum_over_shards(cells_, last_shard_ + 1, 0);
}

HistogramHandle::Snapshot HistogramHandle::snapshot() const {
  Snapshot snapshot;
  if (cells_ == nullptr) return snapshot;
  const unsigned shards = last_shard_ + 1;
  snapshot.buckets.resize(bound_count_ + 1);
  for (std::size_t bucket = 0; bucket <= bound_count_; ++bucket) {
    snapshot.buckets[bucket] = sum_over_shards(cells_, shards, bucket);
    snapshot.count += snapshot.buckets[bucket];
  }
  for (unsigned shard = 0; shard < shards; ++shard) {
    snapshot.sum +=
        std::bit_cast<double>(cells_[shard][bound_count_ + 1].load(std::memory_order_relaxed));
  }
  return snapshot;
}

// ---- counters

CounterFamily::CounterFamily(detail::CellArena& arena, std::string name, std::string help,
                             std::vector<std::string> label_names)
    : Family(std::move(name), std::move(help), std::move(label_names)), arena_(arena) {}

CounterHandle CounterFamily::with(std::initializer_list<std::string_view> label_values) {
  return with_key(to_key(label_values));
}

CounterHandle CounterFamily::with(const LabelValues& label_values) {
  return with_key(label_values);
}

CounterHandle CounterFamily::with_key(LabelValues key) {
  check_label_count(key.size());
  std::lock_guard lock(mutex_);
  auto it = series_.find(key);
  if (it == series_.end()) it = series_.emplace(std::move(key), arena_.allocate(1)).first;
  return CounterHandle(it->second.get(), arena_.shards() - 1);
}

void CounterFamily::render_series(std::string& out) const {
  std::lock_guard lock(mutex_);
  for (const auto& [values, cells] : series_) {
    append_series_name(out, name_, "", label_names_, values);
    append_unsigned(out, sum_over_shards(cells.get(), arena_.shards(), 0));
    out += '\n';
  }
}

// ---- gauges

GaugeHandle GaugeFamily::with(std::initializer_list<std::string_view> label_values) {
  return with_key(to_key(label_values));
}

GaugeHandle GaugeFamily::with(const LabelValues& label_values) { return with_key(label_values); }

GaugeHandle GaugeFamily::with_key(LabelValues key) {
  check_label_count(key.size());
  std::lock_guard lock(mutex_);
  auto it = series_.find(key);
  if (it == series_.end()) {
    it = series_.emplace(std::move(key), std::make_unique<std::atomic<double>>(0.0)).first;
  }
  return GaugeHandle(it->second.get());
}

void GaugeFamily::render_series(std::string& out) const {
  std::lock_guard lock(mutex_);
  for (const auto& [values, value] : series_) {
    append_series_name(out, name_, "", label_names_, values);
    append_prometheus_double(out, value->load(std::memory_order_relaxed));
    out += '\n';
  }
}

// ---- histograms

HistogramFamily::HistogramFamily(detail::CellArena& arena, std::string name, std::string help,
                                 std::vector<std::string> label_names, std::vector<double> bounds)
    : Family(std::move(name), std::move(help), std::move(label_names)),
      arena_(arena),
      bounds_(std::move(bounds)) {
  if (bounds_.empty() || bounds_.size() > kMaxBounds) {
    throw std::invalid_argument("metrics: " + name_ + " needs 1 to 256 bucket bounds");
  }
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i - 1] < bounds_[i]))) {
      throw std::invalid_argument("metrics: " + name_ +
                                  " bucket bounds must be finite and strictly increasing");
    }
  }
  for (const std::string& label : label_names_) {
    if (label == "le") throw std::invalid_argument("metrics: " + name_ + " may not use label le");
  }
}

HistogramHandle HistogramFamily::with(std::initializer_list<std::string_view> label_values) {
  return with_key(to_key(label_values));
}

HistogramHandle HistogramFamily::with(const LabelValues& label_values) {
  return with_key(label_values);
}

HistogramHandle HistogramFamily::with_key(LabelValues key) {
  check_label_count(key.size());
  std::lock_guard lock(mutex_);
  auto it = series_.find(key);
  if (it == series_.end()) {
    // Buckets, +Inf, sum. The sum cell starts as 0 bits, which is +0.0.
    it = series_.emplace(std::move(key), arena_.allocate(bounds_.size() + 2)).first;
  }
  return HistogramHandle(it->second.get(), arena_.shards() - 1, bounds_.data(), bounds_.size());
}

void HistogramFamily::render_series(std::string& out) const {
  std::lock_guard lock(mutex_);
  std::string bound_text;
  for (const auto& [values, cells] : series_) {
    const HistogramHandle::Snapshot snapshot =
        HistogramHandle(cells.get(), arena_.shards() - 1, bounds_.data(), bounds_.size())
            .snapshot();
    std::uint64_t cumulative = 0;
    for (std::size_t bucket = 0; bucket <= bounds_.size(); ++bucket) {
      cumulative += snapshot.buckets[bucket];
      bound_text.clear();
      if (bucket < bounds_.size()) {
        append_prometheus_double(bound_text, bounds_[bucket]);
      } else {
        bound_text = "+Inf";
      }
      append_series_name(out, name_, "_bucket", label_names_, values, "le", bound_text);
      append_unsigned(out, cumulative);
      out += '\n';
    }
    append_series_name(out, name_, "_sum", label_names_, values);
    append_prometheus_double(out, snapshot.sum);
    out += '\n';
    append_series_name(out, name_, "_count", label_names_, values);
    append_unsigned(out, cumulative);
    out += '\n';
  }
}

// ---- callback gauges

void CallbackGaugeFamily::add_series(LabelValues label_values, std::function<double()> read) {
  check_label_count(label_values.size());
  std::lock_guard lock(mutex_);
  series_.emplace_back(std::move(label_values), std::move(read));
}

void CallbackGaugeFamily::add_collector(GaugeCollector collect) {
  std::lock_guard lock(mutex_);
  collectors_.push_back(std::move(collect));
}

void CallbackGaugeFamily::render_series(std::string& out) const {
  std::vector<GaugeSample> samples;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [values, read] : series_) samples.push_back({values, read ? read() : 0.0});
    for (const GaugeCollector& collect : collectors_) {
      if (collect) collect(samples);
    }
  }
  // A collector that returns the wrong number of labels would make the
  // whole exposition unparsable; its series are left out instead.
  std::erase_if(samples, [&](const GaugeSample& sample) {
    return sample.label_values.size() != label_names_.size();
  });
  std::stable_sort(samples.begin(), samples.end(),
                   [](const auto& a, const auto& b) { return a.label_values < b.label_values; });
  for (const GaugeSample& sample : samples) {
    append_series_name(out, name_, "", label_names_, sample.label_values);
    append_prometheus_double(out, sample.value);
    out += '\n';
  }
}

// ---- registry

namespace {

void check_names(const std::string& name, const std::vector<std::string>& label_names) {
  if (!is_valid_metric_name(name)) {
    throw std::invalid_argument("metrics: invalid metric name '" + name + "'");
  }
  for (std::size_t i = 0; i < label_names.size(); ++i) {
    if (!is_valid_label_name(label_names[i])) {
      throw std::invalid_argument("metrics: " + name + ": invalid label name '" + label_names[i] +
                                  "'");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (label_names[i] == label_names[j]) {
        throw std::invalid_argument("metrics: " + name + ": duplicate label '" + label_names[i] +
                                    "'");
      }
    }
  }
}

}  // namespace

Registry::Registry(unsigned shards) : arena_(shards) {}

Registry::~Registry() = default;

template <class FamilyType, class... Args>
FamilyType& Registry::find_or_add(const std::string& name,
                                  const std::vector<std::string>& label_names, Args&&... args) {
  check_names(name, label_names);
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto family = std::make_unique<FamilyType>(std::forward<Args>(args)...);
    FamilyType& added = *family;
    families_.emplace(name, std::move(family));
    return added;
  }
  auto* existing = dynamic_cast<FamilyType*>(it->second.get());
  if (existing == nullptr || existing->label_names() != label_names) {
    throw std::invalid_argument("metrics: " + name +
                                " is already registered with another type or other labels");
  }
  return *existing;
}

CounterFamily& Registry::counter(std::string name, std::string help,
                                 std::vector<std::string> label_names) {
  return find_or_add<CounterFamily>(name, label_names, arena_, name, std::move(help), label_names);
}

GaugeFamily& Registry::gauge(std::string name, std::string help,
                             std::vector<std::string> label_names) {
  return find_or_add<GaugeFamily>(name, label_names, name, std::move(help), label_names);
}

HistogramFamily& Registry::histogram(std::string name, std::string help,
                                     std::vector<std::string> label_names,
                                     std::vector<double> bounds) {
  HistogramFamily& family = find_or_add<HistogramFamily>(name, label_names, arena_, name,
                                                         std::move(help), label_names, bounds);
  if (family.bounds() != bounds) {
    throw std::invalid_argument("metrics: " + name + " is already registered with other buckets");
  }
  return family;
}

void Registry::gauge_callback(std::string name, std::string help, Labels labels,
                              std::function<double()> read) {
  std::vector<std::string> label_names;
  LabelValues label_values;
  for (auto& [label, value] : labels) {
    label_names.push_back(std::move(label));
    label_values.push_back(std::move(value));
  }
  find_or_add<CallbackGaugeFamily>(name, label_names, name, std::move(help), label_names)
      .add_series(std::move(label_values), std::move(read));
}

ShardedGaugeHandle Registry::sharded_gauge(std::string name, std::string help, Labels labels) {
  LabelValues label_values;
  for (const auto& label : labels) label_values.push_back(label.second);
  ShardedGaugeHandle handle;
  {
    std::lock_guard lock(mutex_);
    auto [it, added] = sharded_gauges_.try_emplace({name, std::move(label_values)});
    if (added) it->second = arena_.allocate(1);
    handle = ShardedGaugeHandle(CounterHandle(it->second.get(), arena_.shards() - 1));
    if (!added) return handle;
  }
  // Outside the lock: registering the callback takes it again.
  gauge_callback(std::move(name), std::move(help), std::move(labels),
                 [handle] { return static_cast<double>(handle.value()); });
  return handle;
}

void Registry::gauge_collector(std::string name, std::string help,
                               std::vector<std::string> label_names, GaugeCollector collect) {
  find_or_add<CallbackGaugeFamily>(name, label_names, name, std::move(help), label_names)
      .add_collector(std::move(collect));
}

std::string Registry::render() const {
  std::string out;
  render(out);
  return out;
}

void Registry::render(std::string& out) const {
  // Families are never removed, so they can be rendered after the registry
  // lock is dropped; a slow callback then does not hold up registrations.
  std::vector<const detail::Family*> families;
  {
    std::lock_guard lock(mutex_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.push_back(family.get());
  }
  for (const detail::Family* family : families) family->render(out);
}

// ---- text helpers

bool is_valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

bool is_valid_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;  // "__" is reserved
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

void append_escaped_label_value(std::string& out, std::string_view value) {
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void append_prometheus_double(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else {
    // Go's FormatFloat(v, 'g', -1, 64), as Prometheus' own clients write
    // numbers: shortest digits, exponent form only below 1e-4 or from 1e6
    // on. It matters for le labels, which are compared as strings.
    char buffer[32];
    auto [end, error] =
        std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
    const char* exponent_mark = std::find(buffer, end, 'e');
    int exponent = 0;
    std::from_chars(exponent_mark + (exponent_mark[1] == '+' ? 2 : 1), end, exponent);
    if (exponent >= -4 && exponent < 6) {
      end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed).ptr;
    }
    out.append(buffer, end);
  }
}

}  // namespace sluice::metrics
