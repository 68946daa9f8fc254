// One description of a struct's JSON fields, visited both ways: the writer walks it to build the
// object, the checked reader walks it to fill the struct. So a key is spelled once, beside the
// member it holds, and a new field is one entry in its struct's list.
//
//   template <> struct JsonFields<Point> {
//       static inline const auto list = std::tuple{json_field("x", &Point::x),
//                                                  json_field("y", &Point::y)};
//   };
//   json j = to_json_value(point);               // {"x": .., "y": ..} (keys sorted)
//   read_json_value(JsonNode(j, "file", ""), p);  // every key checked, errors name the path
//
// A member's JSON form follows from its C++ type: double (a number), int / long long (an
// integer), size_t / unsigned (a non-negative integer), bool, std::string, an enum with an
// EnumSpelling (its spelling), std::optional (null when absent), std::vector (an array),
// std::map<string, string> (an object of strings), or a struct with its own JsonFields (an
// object). The entries that are not "one key, one member":
//   json_field_as<C>(key, &S::m)   the member through codec C (FiniteOrNull: NaN/inf as null)
//   json_key_if_present(key, &S::m)  an optional member whose key is absent when unknown
//   json_added_optional(key, &S::m)  an optional member added within a schema version: written
//                                  as a value or null, read as absent from an older file
//   json_group<S>(key, entries...)  an object of more of S's own members (results.json's
//                                  `model` holds VariantResult::model_describe and ::n_params)
//   json_each_key<E>(&S::a)        an array indexed by enum E, one key per value (spelled as E),
//                                  written into the enclosing object (so a group may add keys)
//   json_each_present_key<E>(&S::a, "noun")  the same for std::optional elements: only those
//                                  present; reading refuses a key that is not an E
// Reading throws ReportError "<file>: <key path>: <what>", e.g.
//   "results.json: variants[2].stats.step_ms.median: expected a number, got "fast"".
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/enum_names.h"

namespace mt {

// Thrown for a results.json that cannot be used; the message names the file and the key.
struct ReportError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A value of the document being read, with its key path ("variants[2].stats") for errors.
class JsonNode {
  public:
    JsonNode(const nlohmann::json& value, const std::string& file, std::string path)
        : v_(value), file_(file), path_(std::move(path)) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw ReportError(file_ + ": " + (path_.empty() ? "(top level)" : path_) + ": " + what);
    }
    [[noreturn]] void expected(const std::string& what) const {
        std::string got = v_.dump();
        if (got.size() > 60) got = got.substr(0, 57) + "...";
        fail("expected " + what + ", got " + got);
    }

    bool has(const std::string& key) const { return v_.is_object() && v_.contains(key); }
    JsonNode operator[](const std::string& key) const {
        if (!v_.is_object()) expected("an object");
        if (!v_.contains(key)) fail("missing key '" + key + "'");
        return JsonNode(v_[key], file_, path_.empty() ? key : path_ + "." + key);
    }
    // The elements of an array, each with its index in the path.
    std::vector<JsonNode> elements() const {
        if (!v_.is_array()) expected("an array");
        std::vector<JsonNode> out;
        for (size_t i = 0; i < v_.size(); ++i)
            out.emplace_back(v_[i], file_, path_ + "[" + std::to_string(i) + "]");
        return out;
    }
    // The keys of an object, in order.
    std::vector<std::string> keys() const {
        if (!v_.is_object()) expected("an object");
        std::vector<std::string> out;
        for (auto it = v_.begin(); it != v_.end(); ++it) out.push_back(it.key());
        return out;
    }

    bool is_null() const { return v_.is_null(); }
    double number() const {
        if (!v_.is_number()) expected("a number");
        return v_.get<double>();
    }
    long long integer() const {
        if (!v_.is_number_integer()) expected("an integer");
        return v_.get<long long>();
    }
    size_t count() const {
        if (!v_.is_number_unsigned() && !(v_.is_number_integer() && v_.get<long long>() >= 0))
            expected("a non-negative integer");
        return v_.get<size_t>();
    }
    bool boolean() const {
        if (!v_.is_boolean()) expected("true or false");
        return v_.get<bool>();
    }
    std::string string() const {
        if (!v_.is_string()) expected("a string");
        return v_.get<std::string>();
    }
    // An enum spelled as in EnumSpelling<E>.
    template <class E>
    E enum_value() const {
        const auto e = parse_enum<E>(string());
        if (!e) expected("one of " + enum_choices<E>());
        return *e;
    }

  private:
    const nlohmann::json& v_;
    const std::string& file_;
    std::string path_;
};

// Specialised per struct: `static inline const auto list = std::tuple{entries...}`.
template <class S>
struct JsonFields;

template <class T>
nlohmann::json to_json_value(const T& x);
template <class T>
void read_json_value(const JsonNode& n, T& out);

namespace json_detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

// Every entry of S's list, in order.
template <class S, class F>
void for_each_field(F&& f) {
    std::apply([&](const auto&... entry) { (f(entry), ...); }, JsonFields<S>::list);
}
}  // namespace json_detail

// A member through its type's JSON form.
struct DefaultCodec {
    template <class T>
    static nlohmann::json write(const T& x) {
        return to_json_value(x);
    }
    template <class T>
    static void read(const JsonNode& n, T& out) {
        read_json_value(n, out);
    }
};

// A double that may be NaN or infinite (a non-finite loss): written as null (JSON has no NaN),
// read back from null as NaN.
struct FiniteOrNull {
    static nlohmann::json write(double x) {
        return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
    }
    static void read(const JsonNode& n, double& out) {
        out = n.is_null() ? std::numeric_limits<double>::quiet_NaN() : n.number();
    }
};

template <class S, class M, class Codec>
struct JsonField {
    const char* key;
    M S::*member;
    void write(nlohmann::json& obj, const S& s) const { obj[key] = Codec::write(s.*member); }
    void read(const JsonNode& obj, S& s) const { Codec::read(obj[key], s.*member); }
};

template <class S, class M>
constexpr JsonField<S, M, DefaultCodec> json_field(const char* key, M S::*member) {
    return {key, member};
}
template <class Codec, class S, class M>
constexpr JsonField<S, M, Codec> json_field_as(const char* key, M S::*member) {
    return {key, member};
}

// An optional member added within a schema version: written always (null when absent), read as
// absent when a file of that version written before it lacks the key.
template <class S, class T>
struct JsonAddedOptional {
    const char* key;
    std::optional<T> S::*member;
    void write(nlohmann::json& obj, const S& s) const { obj[key] = to_json_value(s.*member); }
    void read(const JsonNode& obj, S& s) const {
        if (obj.has(key))
            read_json_value(obj[key], s.*member);
        else
            (s.*member).reset();
    }
};
template <class S, class T>
constexpr JsonAddedOptional<S, T> json_added_optional(const char* key,
                                                      std::optional<T> S::*member) {
    return {key, member};
}

// A plain member added within a schema version: written always, left at its default when a file
// of that version written before it lacks the key.
template <class S, class M>
struct JsonAddedField {
    const char* key;
    M S::*member;
    void write(nlohmann::json& obj, const S& s) const { obj[key] = to_json_value(s.*member); }
    void read(const JsonNode& obj, S& s) const {
        if (obj.has(key)) read_json_value(obj[key], s.*member);
    }
};
template <class S, class M>
constexpr JsonAddedField<S, M> json_added_field(const char* key, M S::*member) {
    return {key, member};
}

template <class S, class T>
struct JsonKeyIfPresent {
    const char* key;
    std::optional<T> S::*member;
    void write(nlohmann::json& obj, const S& s) const {
        if (s.*member) obj[key] = to_json_value(*(s.*member));
    }
    void read(const JsonNode& obj, S& s) const {
        if (!obj.has(key)) return;
        T value{};
        read_json_value(obj[key], value);
        s.*member = std::move(value);
    }
};
template <class S, class T>
constexpr JsonKeyIfPresent<S, T> json_key_if_present(const char* key, std::optional<T> S::*member) {
    return {key, member};
}

template <class S, class... Entries>
struct JsonGroup {
    const char* key;
    std::tuple<Entries...> entries;
    void write(nlohmann::json& obj, const S& s) const {
        nlohmann::json sub = nlohmann::json::object();
        std::apply([&](const auto&... e) { (e.write(sub, s), ...); }, entries);
        obj[key] = std::move(sub);
    }
    void read(const JsonNode& obj, S& s) const {
        const JsonNode sub = obj[key];
        std::apply([&](const auto&... e) { (e.read(sub, s), ...); }, entries);
    }
};
// S is named explicitly (json_group<Struct>(...)): the entries' own S must match it.
template <class S, class... Entries>
constexpr JsonGroup<S, Entries...> json_group(const char* key, Entries... entries) {
    return {key, {entries...}};
}

template <class E, class S, class T, size_t N>
struct JsonEachKey {
    std::array<T, N> S::*member;
    void write(nlohmann::json& obj, const S& s) const {
        for (size_t i = 0; i < N; ++i)
            obj[std::string(enum_name(static_cast<E>(i)))] = to_json_value((s.*member)[i]);
    }
    void read(const JsonNode& obj, S& s) const {
        for (size_t i = 0; i < N; ++i)
            read_json_value(obj[std::string(enum_name(static_cast<E>(i)))], (s.*member)[i]);
    }
};
template <class E, class S, class T, size_t N>
constexpr JsonEachKey<E, S, T, N> json_each_key(std::array<T, N> S::*member) {
    return {member};
}

template <class E, class S, class T, size_t N>
struct JsonEachPresentKey {
    std::array<std::optional<T>, N> S::*member;
    const char* noun;  // what a key must be, for the error ("phase")
    void write(nlohmann::json& obj, const S& s) const {
        for (size_t i = 0; i < N; ++i)
            if ((s.*member)[i])
                obj[std::string(enum_name(static_cast<E>(i)))] = to_json_value(*(s.*member)[i]);
    }
    void read(const JsonNode& obj, S& s) const {
        for (const std::string& k : obj.keys()) {
            const auto e = parse_enum<E>(k);
            if (!e)
                obj[k].fail(std::string("not a ") + noun + " (expected one of " +
                            enum_choices<E>() + ")");
            T value{};
            read_json_value(obj[k], value);
            (s.*member)[static_cast<size_t>(*e)] = std::move(value);
        }
    }
};
template <class E, class S, class T, size_t N>
constexpr JsonEachPresentKey<E, S, T, N> json_each_present_key(
    std::array<std::optional<T>, N> S::*member, const char* noun) {
    return {member, noun};
}

template <class T>
nlohmann::json to_json_value(const T& x) {
    using namespace json_detail;
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int> ||
                  std::is_same_v<T, long long> || std::is_same_v<T, size_t> ||
                  std::is_same_v<T, unsigned> || std::is_same_v<T, bool> ||
                  std::is_same_v<T, std::string> ||
                  std::is_same_v<T, std::map<std::string, std::string>>) {
        return x;
    } else if constexpr (std::is_enum_v<T>) {
        return std::string(enum_name(x));
    } else if constexpr (is_optional<T>::value) {
        return x ? to_json_value(*x) : nlohmann::json(nullptr);
    } else if constexpr (is_vector<T>::value) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& e : x) a.push_back(to_json_value(e));
        return a;
    } else {
        nlohmann::json obj = nlohmann::json::object();
        for_each_field<T>([&](const auto& entry) { entry.write(obj, x); });
        return obj;
    }
}

template <class T>
void read_json_value(const JsonNode& n, T& out) {
    using namespace json_detail;
    if constexpr (std::is_same_v<T, double>) {
        out = n.number();
    } else if constexpr (std::is_same_v<T, int>) {
        out = static_cast<int>(n.integer());
    } else if constexpr (std::is_same_v<T, long long>) {
        out = n.integer();
    } else if constexpr (std::is_same_v<T, size_t>) {
        out = n.count();
    } else if constexpr (std::is_same_v<T, unsigned>) {
        out = static_cast<unsigned>(n.count());
    } else if constexpr (std::is_same_v<T, bool>) {
        out = n.boolean();
    } else if constexpr (std::is_same_v<T, std::string>) {
        out = n.string();
    } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
        out.clear();
        for (const std::string& k : n.keys()) out[k] = n[k].string();
    } else if constexpr (std::is_enum_v<T>) {
        out = n.enum_value<T>();
    } else if constexpr (is_optional<T>::value) {
        if (n.is_null()) {
            out.reset();
        } else {
            typename T::value_type value{};
            read_json_value(n, value);
            out = std::move(value);
        }
    } else if constexpr (is_vector<T>::value) {
        out.clear();
        for (const JsonNode& e : n.elements()) {
            typename T::value_type value{};
            read_json_value(e, value);
            out.push_back(std::move(value));
        }
    } else {
        for_each_field<T>([&](const auto& entry) { entry.read(n, out); });
    }
}

}  // namespace mt
