// Library text in tessera's words (docs/errors.md, "Messages"): what a
// library's exception says, without the library's own tags, for a message
// that names the file and the field itself.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace tessera {

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column
// 9: syntax error while parsing value - unexpected end of input; expected
// '[', '{', or a literal" becomes "at line 1, column 9: syntax error while
// parsing value - ..."; its type errors ("[json.exception.
// type_error.302] type must be number, but is string") become "must be
// number, but is string". Text without those tags is returned as it is.
std::string json_library_text(std::string_view what);
inline std::string json_library_text(const std::exception& e) { return json_library_text(std::string_view(e.what())); }

}  // namespace tessera
