// Attribute spellings of the core enums: one table per enum, beside the enum,
// and one parser for all of them, so that the TF kernels and the Python core
// accept the same names and reject the rest with the same message. Host only.
#pragma once

#include <cstddef>
#include <string>

namespace ctr {

template <typename E>
struct EnumName {
  const char* name;
  E value;
};

// Sets *out from its spelling and returns "", or returns the message
// "<what> must be 'a', 'b' or 'c', got 'x'".
template <typename E, size_t N>
std::string ParseEnum(const char* what, const EnumName<E> (&names)[N], const std::string& s, E* out) {
  for (const EnumName<E>& n : names)
    if (s == n.name) {
      *out = n.value;
      return "";
    }
  std::string message = std::string(what) + " must be ";
  for (size_t i = 0; i < N; ++i)
    message += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + "'" + names[i].name + "'";
  return message + ", got '" + s + "'";
}

}  // namespace ctr
