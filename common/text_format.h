// Text every output of ablate shares (`ablate expand`, `table`, `compare`, `query`, `export`,
// `report`, the dashboard's CSV, the memory plan's refusals): counts, FLOPs, bytes and times as
// papers print them, CSV fields, aligned columns. The one place for each of these: a library of
// its own (ablate_text_format) that config/ links too. Pure functions; thread-safe.
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
// FLOPs as papers write them: three significant digits in e-notation without "+" or leading
// zeros in the exponent ("3.40e8", "2.10e21"), whole below 1,000 ("999").
std::string FormatFlops(double flops);
// Bytes in decimal units: "1.23 TB", "80.0 GB", "35.8 MB", "10.0 kB", "512 B".
std::string FormatBytes(double bytes);
// Training time: "45 s" under two minutes, then "12.3 min", and "4.1 h" from an hour.
std::string FormatDuration(double seconds);
// Device time, to three significant digits: "2.38 device-hours" ("1,234 device-hours" from
// 1,000), "12.5 device-minutes" under an hour, "42 device-seconds" under a minute.
std::string FormatDeviceTime(double seconds);
// A mean with its standard deviation at `decimals` decimals: "2.062 ± 0.013"; the mean alone
// when std is not finite (one value), "—" when the mean is not (no value).
std::string MeanStdText(double mean, double std, int decimals);

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
