// Building a JSON object from its members in one loop: json_object({{"name", x}, {"bytes", n}}).
// The result is the same as nlohmann's `json{{"name", x}, {"bytes", n}}` (first member wins on
// a repeated key, as there), but that form builds a two-element array per member and checks at
// run time whether the whole list reads as an object, code the compiler repeats at every call
// site: in the WebAssembly module the result writers were a fifth of the code.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>

namespace memfit::detail {

/// One member: its key and its value (a nested braced list is still nlohmann's own deduction).
struct JsonMember {
  const char* key;
  mutable nlohmann::json value;  // moved into the object (a list's elements are const)
};

[[nodiscard]] inline nlohmann::json json_object(std::initializer_list<JsonMember> members) {
  nlohmann::json j = nlohmann::json::object();
  for (const JsonMember& m : members) j.emplace(m.key, std::move(m.value));
  return j;
}

}  // namespace memfit::detail
