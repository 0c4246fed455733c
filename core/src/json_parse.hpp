// Parsing JSON text through one path: nlohmann's SAX parser straight into a DOM.
// json::parse(text, callback, allow_exceptions) compiles two copies of the parser loop, one for
// a filter callback (which memfit never passes) and one without, and the callback copy cannot
// be dropped because the choice is made at run time. Going through json::sax_parse with the
// DOM builder json::parse uses itself keeps one copy (measured: 7.7 KB of the wasm module,
// 1.7 KB gzipped); the parse errors and their messages are the same.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace memfit::detail {

/// The JSON value of `text`. A syntax error throws nlohmann's parse_error (as json::parse) when
/// `allow_exceptions`, else gives a discarded value (as json::parse(text, nullptr, false)).
[[nodiscard]] inline nlohmann::json parse_json(std::string_view text, bool allow_exceptions = true) {
  nlohmann::json result;
  nlohmann::detail::json_sax_dom_parser<nlohmann::json> builder(result, allow_exceptions);
  if (!nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder)) result = nlohmann::json::value_t::discarded;
  return result;
}

}  // namespace memfit::detail
