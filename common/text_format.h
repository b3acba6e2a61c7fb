// Text every output of ablate shares (`ablate expand`, `table`, `query`, `export`, the dashboard's
// CSV): numbers as papers print them, CSV fields, aligned columns. Pure functions; thread-safe.
#ifndef ABLATE_COMMON_TEXT_FORMAT_H_
#define ABLATE_COMMON_TEXT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ablate {

// Exact counts with thousands separators: "1,234,567", "-57,344"; SignedCount adds "+" above 0.
std::string FormatCount(int64_t n);
std::string SignedCount(int64_t n);
// Parameter counts as papers print them: "1.10M", "+16.4K" (with `sign`), "512".
std::string HumanCount(double count, bool sign = false);
// Three significant digits and an SI prefix, for FLOPs: "6.93G", "983K".
std::string Engineering(double v);

// One CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a quote, or a line
// break (\n or \r).
std::string CsvField(absl::string_view s);
// A CSV field of free text meant for people, who open such files in spreadsheets (a run's
// reason, a spike's signal, a note): CsvField, with a text that starts with =, +, -, @, a tab or
// a carriage return (what spreadsheets run as a formula) behind a leading apostrophe.
std::string CsvText(absl::string_view s);
// A markdown table cell or line of free text: no pipe or line break can end the cell; < and &
// as HTML entities and [ ] escaped, so that no text makes HTML, a link or an image.
std::string MarkdownText(absl::string_view s);
// A number as CSV carries it: exact (the shortest text that reads back the same), "" when it is
// not finite (no value).
std::string CsvNumber(double v);

// Columns separated by two spaces, each as wide as its widest cell counted in UTF-8 code points
// ("±", "—" are one); column i right-aligned when right[i]. The last column is not padded, so no
// line ends in spaces. With `rule`, a line of dashes under the header.
std::string AlignedTable(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right, bool rule);

}  // namespace ablate

#endif  // ABLATE_COMMON_TEXT_FORMAT_H_
