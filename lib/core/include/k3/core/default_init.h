// Buffers that a read is about to fill: a std::vector whose resize(n) / (n)
// constructor default-initialises its elements instead of value-initialising
// them, so for trivial types (float, int32_t, std::byte) nothing is written
// until the caller writes. Used where a whole buffer is filled right after it
// is sized (checkpoint loads: each byte written once, by the read, instead of a
// zero-fill that touches every fresh page before the read does; docs/checkpoints.md).
// Every other operation is std::vector's; explicit values (resize(n, v),
// assign, push_back) are still written.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace k3 {

template <typename T, typename A = std::allocator<T>>
class DefaultInitAllocator : public A {
  using Traits = std::allocator_traits<A>;

 public:
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U, typename Traits::template rebind_alloc<U>>;
  };

  using A::A;
  DefaultInitAllocator() = default;
  // The rebound copies an allocator-aware container may make.
  template <typename U, typename B>
  DefaultInitAllocator(const DefaultInitAllocator<U, B>& other) noexcept
      : A(static_cast<const B&>(other)) {}

  // Value-initialisation (no arguments) becomes default-initialisation.
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    Traits::construct(static_cast<A&>(*this), p, std::forward<Args>(args)...);
  }
};

// A vector whose resize(n) leaves new trivial elements uninitialised.
template <typename T>
using DefaultInitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace k3
