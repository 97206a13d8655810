#pragma once

#include <cassert>
#include <utility>
#include <variant>

namespace sluice {

// A value or an error, for the data path where failures are expected and
// exceptions are not used.
template <class T, class E>
class Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  Result(E error) : state_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() {
    assert(ok());
    return std::get<0>(state_);
  }
  const T& value() const {
    assert(ok());
    return std::get<0>(state_);
  }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }

  E& error() {
    assert(!ok());
    return std::get<1>(state_);
  }
  const E& error() const {
    assert(!ok());
    return std::get<1>(state_);
  }

 private:
  std::variant<T, E> state_;
};

}  // namespace sluice
