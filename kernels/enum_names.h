// One spelling per enum value, written once beside the enum, and used everywhere a value is
// printed (to_string, reports, results.json), parsed (the YAML spec, --set, CLI flags) or listed
// in an error message ("expected one of naive, flash, cudnn").
//
//   enum class Fruit { apple, pear };
//   template <> struct EnumSpelling<Fruit> {
//       static constexpr std::array<std::string_view, 2> names{"apple", "pear"};  // value order
//   };
//
// Values must be 0, 1, 2, ... in declaration order (the default for an enum class).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

template <class E>
struct EnumSpelling;  // specialised per enum: `static constexpr std::array<std::string_view, N>
                      // names`

// The spelling of `e` ("?" for a value outside the table).
template <class E>
constexpr std::string_view enum_name(E e) {
    const auto i = static_cast<std::size_t>(e);
    return i < EnumSpelling<E>::names.size() ? EnumSpelling<E>::names[i] : std::string_view("?");
}

// The value spelled `s`, or nullopt.
template <class E>
constexpr std::optional<E> parse_enum(std::string_view s) {
    for (std::size_t i = 0; i < EnumSpelling<E>::names.size(); ++i)
        if (EnumSpelling<E>::names[i] == s) return static_cast<E>(i);
    return std::nullopt;
}

// Every spelling, in value order.
template <class E>
std::vector<std::string> enum_names() {
    return {EnumSpelling<E>::names.begin(), EnumSpelling<E>::names.end()};
}

// "a, b, c": for "expected one of ..." messages.
template <class E>
std::string enum_choices(std::string_view separator = ", ") {
    std::string s;
    for (std::size_t i = 0; i < EnumSpelling<E>::names.size(); ++i) {
        if (i) s += separator;
        s += EnumSpelling<E>::names[i];
    }
    return s;
}

}  // namespace mt
